"""One mapping from typed errors to HTTP answers, one status for each error code (listed in the docs);
the errors survive the trip from a replica (pickling)."""

from __future__ import annotations

import pickle

import pytest

from model.errors import InputTooLongError, InvalidTextError
from service.engine.scheduler import DeadlineExceededError, QueueFullError, RequestTooLargeError
from service.errors import ApiError, api_error


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (InputTooLongError("source has 600 tokens", 2), 422, "input_too_long"),
        (InvalidTextError("lone surrogate"), 422, "invalid_text"),
        (RequestTooLargeError("request has 900 sentences"), 422, "too_many_texts"),
        (QueueFullError(512, 512, 2.4), 503, "overloaded"),
        (DeadlineExceededError("deadline passed"), 504, "timeout"),
    ],
)
def test_typed_errors_map_to_their_status_after_a_pickle_round_trip(
    exc: Exception,
    status: int,
    code: str,
) -> None:
    answer = api_error(pickle.loads(pickle.dumps(exc)))
    assert answer is not None and (answer.status, answer.code) == (status, code)
    assert answer.detail == str(exc)


def test_overload_says_when_to_retry_and_a_source_error_keeps_its_index() -> None:
    answer = api_error(pickle.loads(pickle.dumps(QueueFullError(600, 512, 2.4))))
    assert answer is not None and answer.headers == {"Retry-After": "3"}
    assert str(pickle.loads(pickle.dumps(InputTooLongError("too long", 3)))) == "texts[3]: too long"


def test_a_dead_replica_is_a_503_that_says_when_to_retry() -> None:
    from ray.exceptions import ActorDiedError

    answer = api_error(ActorDiedError())
    assert answer is not None and (answer.status, answer.code) == (503, "replica_unavailable")
    assert answer.headers == {"Retry-After": "2"}  # error_codes.RETRY_AFTER_S, as HAProxy and the proxy say it


def test_an_api_error_passes_through_and_an_unknown_error_is_not_mapped() -> None:
    err = ApiError("unsupported_pair", "no model")
    assert api_error(pickle.loads(pickle.dumps(err))).body() == {"error": "unsupported_pair", "detail": "no model"}
    assert api_error(RuntimeError("bug")) is None


def test_a_typed_error_of_a_lower_floor_names_its_code_and_the_edge_answers_it() -> None:
    from service.errors import CodedError
    from service.store.records import StoreUnavailableError
    from service.text.html_text import HtmlLimitError

    full = api_error(pickle.loads(pickle.dumps(QueueFullError(9, 8, retry_after_s=3.2))))  # as from a replica
    assert full is not None and (full.status, full.code, full.headers) == (503, "overloaded", {"Retry-After": "4"})
    store = api_error(StoreUnavailableError("down"))
    assert store is not None and (store.status, store.headers) == (503, {"Retry-After": "5"})
    html = api_error(HtmlLimitError("too deep"))
    assert html is not None and (html.status, html.code, html.detail) == (422, "html_too_complex", "too deep")
    with pytest.raises(TypeError, match="not an error code"):

        class MisnamedError(CodedError):
            code = "no_such_code"


def codes_in_the_service() -> set[str]:
    """Every error code the service's source answers with: the first string of each call that makes an
    error, the "error" of each error body, and the values of the code tables."""
    import ast

    from .test_codebase import modules

    makers = {"ApiError", "_error_body", "_refused", "_http_error", "_http_return", "_reject"}
    found: set[str] = set()
    for path in modules("service"):
        if path.name == "error_codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if name in makers and strings:
                    found.add(strings[0])
            elif isinstance(node, ast.ClassDef):  # a CodedError's `code = "..."`
                for stmt in node.body:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
                    if [getattr(t, "id", "") for t in targets] == ["code"] and isinstance(stmt.value, ast.Constant):
                        found.add(stmt.value.value)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "error" and isinstance(v, ast.Constant):
                        found.add(v.value)
    return found


def test_every_error_code_has_one_status_and_the_docs_list_them_all() -> None:
    from service.api.http import HTTP_CODES
    from service.error_codes import CODES
    from service.errors import types

    from .test_codebase import ROOT

    used = codes_in_the_service() | set(types().values()) | set(HTTP_CODES.values())
    assert used <= set(CODES), f"answered, not in service/error_codes.py: {sorted(used - set(CODES))}"
    assert set(CODES) <= used, f"listed, never answered: {sorted(set(CODES) - used)}"
    assert all(CODES[code][0] == status for status, code in HTTP_CODES.items())
    docs = (ROOT / "docs" / "operations.md").read_text()
    from service.api.error_table import described

    rows = [f"| `{code}` | {status} | {meaning} |" for code, (status, meaning) in described().items()]
    assert "\n".join(rows) in docs


def test_a_code_says_one_retry_after_from_the_gateway_and_from_haproxy() -> None:
    from ray.exceptions import ActorDiedError

    from service.api import front
    from service.error_codes import RETRY_AFTER_S
    from service.settings import Settings

    answer = api_error(ActorDiedError())
    assert answer is not None and answer.headers == {"Retry-After": str(RETRY_AFTER_S["replica_unavailable"])}
    config = front._defaults(front.limits_of(Settings())) + front._no_route()
    said = {}
    for line in config.splitlines():
        codes = [code for code in RETRY_AFTER_S if ':\\"' + code + '\\"' in line]  # the body's error code
        if codes and "retry-after" in line:
            said.setdefault(codes[0], set()).add(int(line.split("retry-after ")[1].split()[0]))
    assert said == {code: {RETRY_AFTER_S[code]} for code in ("replica_unavailable", "starting", "timeout")}
