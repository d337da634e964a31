"""Request bodies the compatible APIs read themselves: their clients send JSON or a form."""

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from python_multipart.multipart import parse_options_header
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser

from service.errors import ApiError

M = TypeVar("M", bound=BaseModel)


def openapi_body(
    model: type[BaseModel], kinds: tuple[str, ...] = ("application/json", "application/x-www-form-urlencoded")
) -> dict[str, Any]:
    """A route's `openapi_extra`: its body, read by `read_body` (or `parse_json`), typed as `model`."""
    schema = model.model_json_schema()
    content = {kind: {"schema": schema if kind == "application/json" else _no_null(schema)} for kind in kinds}
    return {"requestBody": {"required": True, "content": content}}


def _no_null(schema: Any) -> Any:
    """A schema for a form: a form field has no null (an optional one is left out), so `X | None` is X."""
    if isinstance(schema, list):
        return [_no_null(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_null(v) for k, v in schema.items()}
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [o for o in options if o != {"type": "null"}]
        out.pop("anyOf")
        out |= rest[0] if len(rest) == 1 else {"anyOf": rest}
        if out.get("default", ...) is None:
            out.pop("default")
    return out


def parse_json(model: type[M], raw: bytes) -> M:
    """A JSON body validated as `model` in one pass of pydantic's own parser (no dict in between); a
    422 in FastAPI's shape (each error's loc under "body") otherwise. What that parser refuses but
    Python's json reads (a lone surrogate escape) is read by the latter, so the text is named by the
    check that refuses it (model/errors.py) rather than called invalid JSON."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            raise _invalid(exc) from None
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise _invalid(exc) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)])


def json_response(out: BaseModel) -> Response:
    """A response model as JSON, serialised by pydantic in one pass: FastAPI does not validate again
    what a route returns as a Response."""
    return Response(out.__pydantic_serializer__.to_json(out), media_type="application/json")


async def read_body(request: Request, field: Callable[[str, list[str]], Any]) -> dict[str, Any]:
    """A JSON object as it is; a form as field(name, its values) per field (a field may repeat)."""
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError("invalid_json", "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError("invalid_request", "the JSON body must be an object")
        return body
    form = await form_of(request)
    return {key: field(key, [str(v) for v in form.getlist(key)]) for key in form}


async def form_of(request: Request) -> FormData:
    """The request's form (multipart or urlencoded); ApiError invalid_request for a field whose bytes are not UTF-8:
    the parsers would decode them as Latin-1 (multipart) or to U+FFFD (urlencoded), and a name stored so would not
    be what was sent."""
    content_type, _ = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data":
        form = await request.form()
        bad = [k for k, v in form.multi_items() if isinstance(v, str) and "\ufffd" in v]
    else:
        parser = _Utf8Parts(request.headers, request.stream())
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise ApiError("invalid_request", f"the multipart body does not parse: {exc.message}") from None
        request._form = form  # what Request.form() would have kept: it reads the stream only once
        bad = parser.not_utf8
    if bad:
        raise ApiError("invalid_request", f"{bad[0][:100]}: not UTF-8 text")
    return form


class _Utf8Parts(MultiPartParser):
    """Starlette's multipart parser, noting each field whose bytes are not the UTF-8 it was to decode."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.not_utf8: list[str] = []

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None and self._charset == "utf-8":
            try:
                bytes(part.data).decode("utf-8")
            except UnicodeDecodeError:
                self.not_utf8.append(part.field_name)
        super().on_part_end()


def multipart_body(
    required: list[str], properties: dict[str, Any], dependent: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """A route's `openapi_extra` for a multipart/form-data upload of these fields (a file among them); `dependent`:
    the fields another one needs beside it (JSON Schema's dependentRequired)."""
    schema = {"type": "object", "required": required, "additionalProperties": False, "properties": properties}
    if dependent:
        schema["dependentRequired"] = dependent
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}
