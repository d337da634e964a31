"""The chaos run's verdict (loadtests/chaos.py) on answers made up for it: which lost connections are the
head's (its front dies with it) and how long a fault's disruption lasts when it runs past the next fault."""

from __future__ import annotations

from loadtests import chaos


def verdict_of(answers: list[chaos.Answer], faults: list[chaos.Fault], seconds: float = 60.0) -> list[str]:
    run = chaos.Run(answers=answers, faults=faults)
    failures: list[str] = []
    chaos.verdict(run, seconds, failures)
    return failures


def texts(start: float, end: float, status: int = 200, error: str = "") -> list[chaos.Answer]:
    """A text request every half second from `start` to `end`, each answered half a second later."""
    out, t = [], start
    while t < end:
        out.append(chaos.Answer("v1", t, status, "", error, ended=t + 0.5))
        t += 0.5
    return out


def unanswered(failures: list[str]) -> list[str]:
    return [f for f in failures if f.startswith("no connection unanswered")]


def test_a_connection_the_head_held_when_it_died_is_the_head_s_and_one_dropped_elsewhere_is_not() -> None:
    head = chaos.Fault("head-restart", 30.0, took=8.0)
    # Sent 20 s before the head's kill, waiting for a replica, closed when the head's processes died.
    held = chaos.Answer("v1", 10.0, 0, error="RemoteProtocolError", ended=30.2)
    assert not unanswered(verdict_of([*texts(0, 60), held], [head]))
    # The same drop with the head up all along is a connection the front lost.
    dropped = chaos.Answer("v1", 10.0, 0, error="RemoteProtocolError", ended=12.0)
    assert unanswered(verdict_of([*texts(0, 60), dropped], [head]))


def test_a_disruption_that_runs_past_the_next_fault_counts_to_its_end() -> None:
    """Failures from 10 s to 45 s after faults at 10 s and 20 s: the first fault's recovery is 35 s (over
    RECOVERY_S), not the 10 s up to the second fault."""
    faults = [chaos.Fault("gateway-kill", 10.0), chaos.Fault("model-kill", 20.0)]
    answers = [*texts(0, 10), *texts(10, 45, 503), *texts(45, 60)]
    failures = verdict_of(answers, faults)
    assert any(f.startswith("every recovery under") and "gateway-kill 34.5 s" in f for f in failures), failures
    # Failures that stop within RECOVERY_S pass.
    answers = [*texts(0, 10), *texts(10, 25, 503), *texts(25, 60)]
    assert not [f for f in verdict_of(answers, faults) if f.startswith("every recovery under")]
