"""The gateway's cached refusal level (service/routing/admission.py)."""

from __future__ import annotations

import time

import pytest

from service.errors import ApiError
from service.routing import admission
from service.routing.admission import PairAdmission


def refuse_with(a: PairAdmission, work: int) -> None:
    with pytest.raises(ApiError), a.holding(work):
        raise ApiError("overloaded", "queue full")


def test_work_is_counted_while_the_call_runs_and_released_after() -> None:
    a = PairAdmission("en-de")
    with a.holding(8):
        assert a.in_flight == 8
        with a.holding(4):
            assert a.in_flight == 12
    assert a.in_flight == 0


def test_a_refusal_from_the_pair_refuses_at_its_level_until_the_level_is_left() -> None:
    a = PairAdmission("en-de")
    with a.holding(100):
        refuse_with(a, 4)  # the pair said no to 4 more on top of 100
        assert a.full_at == 104
        with pytest.raises(ApiError) as refused:
            a.check(4)  # the same again: refused here, without asking the pair
        assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
        assert a.refused_here == 1
        a.check(3)  # a smaller request may still fit: the pair decides
    # The 100 were answered: below the level, requests go on to the pair again.
    a.check(4)
    with a.holding(60):
        a.check(43)
        with pytest.raises(ApiError):
            a.check(44)


def test_other_errors_leave_no_level() -> None:
    a = PairAdmission("en-de")
    with a.holding(10), pytest.raises(ApiError), a.holding(2):
        raise ApiError("timeout", "too slow")
    assert a.full_at is None


def test_a_level_is_forgotten_after_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "HOLD_S", 0.05)
    a = PairAdmission("en-de")
    with a.holding(50):
        refuse_with(a, 1)
        with pytest.raises(ApiError):
            a.check(1)
        time.sleep(0.06)
        a.check(1000)  # the pair may have gained replicas: ask it again
        assert a.full_at is None
