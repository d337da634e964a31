"""LibreTranslate's POST /translate: its request body (JSON or form; q a string or a list;
alternatives; format text or html) read into beamserve's request, and its response shape."""

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from service.errors import ApiError
from service.html_text import HtmlDocument, parse_documents
from service.schemas import TranslateRequest


@dataclass
class LibreCall:
    request: TranslateRequest  # one text per plain text, or per run of prose of the HTML documents
    docs: list[HtmlDocument] | None  # format "html": the parsed documents
    single: bool  # q was a string (the answer is one too)
    alternatives: int  # extra translations asked for per text


async def read_body(request: Request) -> dict[str, Any]:
    """The body as a dict, from JSON or a form (q given several times is a list)."""
    kind = request.headers.get("content-type", "")
    if kind.startswith("application/json"):
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "the JSON body must be an object")
        return body
    form = await request.form()
    data: dict[str, Any] = {}
    for key in form:
        values = form.getlist(key)
        data[key] = values if key == "q" and len(values) > 1 else values[0]
    return data


def _alternatives(value: object) -> int:
    """LibreTranslate's `alternatives`: an integer, in JSON or a form's string."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ApiError(400, "invalid_request", "alternatives must be an integer")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ApiError(400, "invalid_request", "alternatives must be a finite integer")
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, "invalid_request", "alternatives must be an integer") from None


async def parse(body: dict[str, Any], max_beam_size: int) -> LibreCall:
    """The request beamserve runs for a LibreTranslate body; ApiError 400 for what LibreTranslate refuses.
    HTML is parsed off the event loop (service/html_text.py bounds its size)."""
    q = body.get("q")
    texts = [q] if isinstance(q, str) else q
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "invalid_request", "q must be a non-empty string or list of strings")
    if body.get("source") == "auto":
        raise ApiError(400, "invalid_request", "language detection is not supported: pass source explicitly")
    if body.get("format", "text") not in ("text", "html"):
        raise ApiError(400, "invalid_request", "format must be 'text' or 'html'")
    alternatives = _alternatives(body.get("alternatives", 0) or 0)
    # HTML: runs of prose are translated, inline markup carried over by alignment (service/html_text.py).
    docs = await asyncio.to_thread(parse_documents, texts) if body.get("format") == "html" else None
    segments = [node for doc in docs for node in doc.texts] if docs is not None else texts
    if not 0 <= alternatives < max_beam_size:
        raise ApiError(400, "invalid_request", f"alternatives must be between 0 and {max_beam_size - 1}")
    try:
        req = TranslateRequest.model_validate(
            {
                # A document of markup alone still goes through the checks (with one empty text).
                "texts": segments or [""],
                "source": str(body.get("source", "")),
                "target": str(body.get("target", "")),
                "beam_size": max(4, alternatives + 1),
                "num_hypotheses": alternatives + 1,
            }
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ApiError(400, "invalid_request", problems) from None
    return LibreCall(req, docs, isinstance(q, str), alternatives)


ROUTES = frozenset({"/translate"})  # where errors are answered in LibreTranslate's shape


def error(path: str, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An error as answered on `path`: as it is, except on LibreTranslate's route, as its clients read
    it: {"error": message} (Mastodon and the web client show that string), and 429 for overload,
    which they take as "slow down"."""
    if path not in ROUTES:
        return status, body
    detail = body.get("detail", body.get("error", ""))
    if not isinstance(detail, str):  # validation errors: a list of {loc, msg}
        detail = "; ".join(f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg', '')}" for e in detail)
    out = {"error": detail, "code": body.get("error", "")}
    return (429 if body.get("error") == "overloaded" else status), out


def response(call: LibreCall, nbest: list[list[str]]) -> dict[str, Any]:
    """{"translatedText", "alternatives"} from each text's n-best translations, best first."""
    best = [n[0] for n in nbest]
    result: dict[str, Any] = {"translatedText": best[0] if call.single else best}
    if call.alternatives:
        alts = [n[1:] for n in nbest]
        result["alternatives"] = alts[0] if call.single else alts
    return result
