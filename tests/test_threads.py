"""The model runs in one OpenMP thread team per process: loading starts none, the engine's thread the only one.

With two teams (two threads that ran parallel torch ops) libgomp counts more threads than CPUs and
stops spin-waiting between parallel regions; on 2 cores a request through the engine then took 2.2x
as long (loadtests/bench_threads.py). A team's workers are native threads, so each test counts the
threads of a fresh process that Python did not start.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # starts worker processes of their own

PRELUDE = """
import asyncio, os, sys, threading
sys.path.insert(0, {repo!r})
import torch
from model import DecodeOptions, Translator
def native():
    py = {{t.native_id for t in threading.enumerate()}}
    return sum(int(t) not in py for t in os.listdir("/proc/self/task"))
"""


def run(body: str) -> list[int]:
    """Native thread counts the script prints, one per line."""
    script = PRELUDE.format(repo=str(REPO)) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=300)
    return [int(line) for line in out.stdout.split()]


def test_loading_a_model_starts_no_thread_team() -> None:
    before, after, decoding = run("""
        print(native())
        tr = Translator.load("en-de", "cpu", num_threads=2)
        print(native())
        tr.translate(["A man is riding a bike."], beam_size=4)  # the first parallel region starts the team
        print(native())
    """)
    assert after == before
    assert decoding > after  # the count does see a team's workers


def test_serving_through_the_engine_uses_one_team_like_decoding_on_one_thread() -> None:
    direct = run("""
        tr = Translator.load("en-de", "cpu", num_threads=2)
        tr.translate(["A man is riding a bike."], beam_size=4)
        print(native())
    """)
    served = run("""
        from service.engine.engine import Engine, warm_up
        from service.batching import BatchingConfig
        tr = Translator.load("en-de", "cpu", num_threads=2)
        engine = Engine(tr, BatchingConfig(), max_length=64)
        warm_up(engine, [tr.encode("A man is riding a bike.")])
        asyncio.run(engine.translate([tr.encode("Two dogs play.")], DecodeOptions(beam_size=4), 60.0))
        print(native())  # before close(): the engine thread's team ends with the thread
        engine.close()
    """)
    assert served == direct
