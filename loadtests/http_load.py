"""A lean HTTP/1.1 load generator for loopback benchmarks: keep-alive connections over asyncio streams.

It shares the machine's cores with the server it measures, so it does as little as possible per
request (a prebuilt request, the status line and Content-Length read, the body skipped): a fraction
of the CPU an httpx request costs. Only what a serving benchmark needs: closed loops over N
connections, the same held to a request rate, and a flood of N connections each sending one request
at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Answer:
    status: int  # 0: no HTTP answer (refused, reset or closed before the status line)
    latency_s: float
    body: bytes = b""  # kept for answers other than 200
    headers: dict[str, str] = field(default_factory=dict)  # kept for answers other than 200
    error: str = ""


def request_bytes(path: str, body: dict[str, object] | None, *, port: int) -> bytes:
    """One HTTP/1.1 request, built once and sent many times."""
    data = json.dumps(body).encode() if body is not None else b""
    method = "POST" if body is not None else "GET"
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_answer(reader: asyncio.StreamReader, keep: bool) -> tuple[int, bool, bytes, dict[str, str]]:
    """(status, whether the server closes the connection, body if keep, headers if keep)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    closes = headers.get("connection", "").lower() == "close"
    length = headers.get("content-length")
    if length is not None:
        body = await reader.readexactly(int(length))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:  # no length: the body runs to the end of the connection
        body, closes = await reader.read(), True
    return status, closes, (body if keep else b""), (headers if keep else {})


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def closed_loop(
    port: int, requests: list[bytes], *, total: int, concurrency: int, timeout_s: float = 60.0
) -> tuple[list[Answer], float]:
    """`total` requests over `concurrency` keep-alive connections, each sending its next request when
    the last is answered (requests cycled); returns the answers and the wall seconds taken."""
    answers: list[Answer] = []
    counter = iter(range(total))

    async def worker() -> None:
        reader = writer = None
        for i in counter:
            start = time.perf_counter()
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert reader is not None
                writer.write(requests[i % len(requests)])
                status, closes, body, headers = await asyncio.wait_for(read_answer(reader, False), timeout_s)
                answers.append(Answer(status, time.perf_counter() - start, body, headers))
                if closes:
                    writer.close()
                    reader = writer = None
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                answers.append(Answer(0, time.perf_counter() - start, error=type(exc).__name__))
                if writer is not None:
                    writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers, time.perf_counter() - start


async def paced_loop(
    port: int, requests: list[bytes], *, total: int, concurrency: int, rate: float, timeout_s: float = 60.0
) -> tuple[list[Answer], float]:
    """closed_loop held to `rate` requests a second: connection k sends its j-th request at
    (j * concurrency + k) / rate seconds from the start, or when its last is answered if that is later."""
    answers: list[Answer] = []
    start = time.perf_counter()

    async def worker(k: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(k, total, concurrency):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                sent = time.perf_counter()
                writer.write(requests[i % len(requests)])
                status, _, body, headers = await asyncio.wait_for(read_answer(reader, False), timeout_s)
                answers.append(Answer(status, time.perf_counter() - sent, body, headers))
        finally:
            writer.close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return answers, time.perf_counter() - start


async def request(port: int, wire: bytes, *, timeout_s: float = 60.0) -> Answer:
    """One request on a connection of its own, as an independent client sends it; its latency runs
    from the moment the connection was asked for."""
    start = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
        writer.write(wire)
        status, _, body, headers = await asyncio.wait_for(read_answer(reader, True), timeout_s)
        return Answer(status, time.perf_counter() - start, body if status != 200 else b"", headers)
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
        return Answer(0, time.perf_counter() - start, error=type(exc).__name__)
    finally:
        if writer is not None:
            writer.close()


async def flood(port: int, requests: list[bytes], *, connections: int, timeout_s: float = 60.0) -> list[Answer]:
    """`connections` connections opened together, each sending one request (requests cycled) as soon as
    it is open."""
    wires = [requests[i % len(requests)] for i in range(connections)]
    return list(await asyncio.gather(*(request(port, w, timeout_s=timeout_s) for w in wires)))


def counts(answers: list[Answer]) -> dict[str, int]:
    return dict(Counter(str(a.status) if a.status else f"no answer ({a.error})" for a in answers))
