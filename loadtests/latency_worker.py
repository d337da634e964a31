"""The in-process side of loadtests/bench_latency.py: the model, and the server's engine without the server, in one
process as a replica holds them, timed when bench_latency asks, so that its one-at-a-time passes alternate with
the server's on the same machine state.

    python loadtests/latency_worker.py COMPUTE_TYPE THREADS

stdin, a JSON line each: first [alone, batched] (the sentences), then commands, each answered by a JSON line:
    "alone"                            each of `alone` through Translator.translate by itself: wall seconds, in order
    "engine"                           the same through Engine.translate (service/engine/engine.py)
    "offline"                          the offline rate over `batched` at batch 64 (sentences/s)
    ["saturated", concurrency, work_s] the engine's rate with `concurrency` sentences in flight, without and with
                                       work_s of Python on its event loop after each answer (as a gateway's loop
                                       parses, tokenizes and answers a request)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model import DecodeOptions, Translator
from service.batching import BatchingConfig
from service.engine.engine import Engine

OPTS = DecodeOptions(beam_size=4)


class Worker:
    def __init__(self, compute_type: str, threads: int, alone: list[str], batched: list[str]) -> None:
        self.tr = Translator.load("en-de", "cpu", compute_type=compute_type, num_threads=threads)
        self.alone, self.batched = alone, batched
        self.engine = Engine(self.tr, BatchingConfig(max_queue_wait_s=3600))
        self.alone_ids = [self.tr.encode(t) for t in alone]
        self.batched_ids = [self.tr.encode(t) for t in batched]
        for text in alone[:8]:  # first calls build what they cache
            self.tr.translate([text], beam_size=4)
        asyncio.run(self._engine_each(self.alone_ids[:8]))

    def translate_each(self) -> list[float]:
        walls = []
        for text in self.alone:
            start = time.perf_counter()
            self.tr.translate([text], beam_size=4)
            walls.append(time.perf_counter() - start)
        return walls

    async def _engine_each(self, sources: list[list[int]]) -> list[float]:
        walls = []
        for ids in sources:
            start = time.perf_counter()
            await self.engine.translate([ids], OPTS, 60)
            walls.append(time.perf_counter() - start)
        return walls

    def engine_each(self) -> list[float]:
        return asyncio.run(self._engine_each(self.alone_ids))

    def offline(self) -> float:
        batched = self.batched
        self.tr.translate(batched[:64], beam_size=4, max_batch_size=64)
        start = time.perf_counter()
        for i in range(0, len(batched), 64):
            self.tr.translate(batched[i : i + 64], beam_size=4, max_batch_size=64)
        return len(batched) / (time.perf_counter() - start)

    def saturated(self, concurrency: int, work_s: float) -> dict[str, float]:
        return {
            "engine_rate": asyncio.run(self._saturated(concurrency, 0.0)),
            "engine_loaded": asyncio.run(self._saturated(concurrency, work_s)),
        }

    async def _saturated(self, concurrency: int, work_s: float) -> float:
        left = iter(self.batched_ids)

        async def client() -> None:
            for ids in left:
                await self.engine.translate([ids], OPTS, 600)
                until = time.thread_time() + work_s  # Python holding the GIL, as a gateway's does
                while time.thread_time() < until:
                    pass

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return len(self.batched_ids) / (time.perf_counter() - start)


def main() -> None:
    compute_type, threads = sys.argv[1], int(sys.argv[2])
    alone, batched = json.loads(sys.stdin.readline())
    worker = Worker(compute_type, threads, alone, batched)
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command == "alone":
            answer: object = worker.translate_each()
        elif command == "engine":
            answer = worker.engine_each()
        elif command == "offline":
            answer = worker.offline()
        elif isinstance(command, list) and command[0] == "saturated":
            answer = worker.saturated(int(command[1]), float(command[2]))
        else:
            raise SystemExit(f"unknown command {command!r}")
        print(json.dumps(answer), flush=True)
    worker.engine.close()


if __name__ == "__main__":
    main()
