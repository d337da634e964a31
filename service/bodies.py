"""Request bodies the compatible APIs read themselves: their clients send JSON or a form."""

from collections.abc import Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from service.errors import ApiError


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: its body, read by `read_body`, typed as `model` in JSON and form."""
    schema = model.model_json_schema()
    content = {kind: {"schema": schema} for kind in ("application/json", "application/x-www-form-urlencoded")}
    return {"requestBody": {"required": True, "content": content}}


async def read_body(request: Request, field: Callable[[str, list[str]], Any]) -> dict[str, Any]:
    """A JSON object as it is; a form as field(name, its values) per field (a field may repeat)."""
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "the JSON body must be an object")
        return body
    form = await request.form()
    return {key: field(key, [str(v) for v in form.getlist(key)]) for key in form}
