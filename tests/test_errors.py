"""One mapping from typed errors to HTTP answers; the errors survive the trip from a replica (pickling)."""

from __future__ import annotations

import pickle

import pytest

from model.errors import InputTooLongError, InvalidTextError
from service.errors import ApiError, api_error
from service.scheduler import DeadlineExceededError, QueueFullError, RequestTooLargeError


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
    assert answer.headers == {"Retry-After": "5"}


def test_an_api_error_passes_through_and_an_unknown_error_is_not_mapped() -> None:
    err = ApiError(400, "unsupported_pair", "no model")
    assert api_error(pickle.loads(pickle.dumps(err))).body() == {"error": "unsupported_pair", "detail": "no model"}
    assert api_error(RuntimeError("bug")) is None
