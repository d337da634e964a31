"""Decoding benchmark: beamserve vs Hugging Face `generate` vs CTranslate2 (float32, int8) on the same weights.

    python loadtests/bench_decode.py --out runs/bench/decode.md                 # CPU, both models
    python loadtests/bench_decode.py --device cuda --systems beamserve,hf        # GPU

Models (--models): `base`, a random model of OPUS-MT-base size (d512, 6+6 layers, 8 heads, ffn 2048,
58,101 ids); `nllb-600m`, a random model of NLLB-200-distilled-600M's shapes (M2M100: d1024, 12+12
pre-norm layers, 16 heads, ffn 4096, relu, 256,206 ids: its output projection, log-softmax and
candidate ranking run over a vocabulary 4.4x base's), built as a Hugging Face directory with a
tokenizer of NLLB's numbering; and `en-de`, the shipped Multi30k model. Random weights rarely emit
</s>, so on the random models every system decodes exactly --steps tokens (min = max length); `en-de`
decodes naturally. Sources are
test_2016_flickr sentences sorted by length, identical for every system; each cell is the best of
--repeats timed passes after one warm-up batch, the systems taking turns within each pass. Each
system runs in its own worker process (see `SystemWorker`), all started before the first pass.

Systems (--systems): beamserve; beamserve-es and beamserve-int8-es (early_stopping=True, CTranslate2's
stopping rule);
beamserve-bf16 (dtype bfloat16); beamserve-int8 and beamserve-int8_bfloat16 (compute_type: int8 GEMMs
with per-row scales, float32 or bfloat16 elsewhere); beamserve-pytorch and beamserve-int8-pytorch
(float32 and int8 in PyTorch's ops only, without the C kernels of model/kernels/native.py); beamserve-segments and
beamserve-int8-segments (a step's layers as C calls cut at the feed-forward activations, not the one-call step of
model/nn/c_step.py); beamserve-stepwise and beamserve-int8-stepwise (each beam search step one call and its beam
step and reorder calls of their own, not a run of steps in one call, transformer.c_beam_steps); beamserve-slots
(the static decode state, model/decode/slot_decoder.py: B slots of K beams refilled as sentences finish; CUDA
graphs on a GPU); beamserve-slots-compiled (the same, its step through torch.compile's inductor before the
graphs, compiled in the warm-up pass); beamserve-slots-triton (the same with the Triton step kernels of
model/kernels/triton_step.py: the plan's step_kernels "triton"); hf; ct2-float32; ct2-int8; ct2-float16 (GPU).

A suffix -interN (beamserve-inter2, ct2-float32-inter2) decodes N batches in parallel, each worker with
--threads / N intra-op threads: CTranslate2's inter_threads, and beamserve's (`Translator.load(...,
inter_threads=N)`, worker processes, model/workers.py). Their CPU time is in those processes, so they
need --clock wall.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reports import emit  # noqa: E402

from model import DecodeOptions, Translator  # noqa: E402
from model.decode.slot_decoder import PoolShape, SlotDecoder, decode_all  # noqa: E402
from model.io import checkpoint  # noqa: E402
from model.kernels import execution, native  # noqa: E402
from model.nn.config import preset  # noqa: E402
from model.nn.transformer import Seq2Seq  # noqa: E402

DATA = Path(os.environ.get("BEAMSERVE_DATA", REPO.parent / "shared" / "data" / "multi30k"))


@dataclass
class Cell:
    sentences: int
    tokens: int
    seconds: float

    @property
    def sent_s(self) -> float:
        return self.sentences / self.seconds

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def make_base_model(work: Path) -> Path:
    """A random OPUS-MT-base-sized model using the shipped tokenizer, its vocabulary padded to 58,101 ids."""
    out = work / "base"
    shipped = REPO / "model" / "pretrained" / "en-de"
    vocab = json.loads((shipped / "vocab.json").read_text(encoding="utf-8"))
    del vocab["<pad>"]
    size = 58101
    vocab.update({f"<extra_{i}>": i for i in range(len(vocab), size - 1)})
    vocab["<pad>"] = size - 1
    torch.manual_seed(0)
    model = Seq2Seq(preset("base", size))
    checkpoint.save(model, out, None)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(shipped / name, out / name)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return out


NLLB_600M = dict(
    d_model=1024,
    encoder_layers=12,
    decoder_layers=12,
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    encoder_ffn_dim=4096,
    decoder_ffn_dim=4096,
    vocab_size=256206,
    max_position_embeddings=1024,
)
RANDOM_MODELS = ("base", "nllb-600m")


def make_nllb_model(work: Path) -> Path:
    """A random model of NLLB-200-distilled-600M's shapes as a Hugging Face M2M100 directory: a BPE
    SentencePiece model trained on the English and German training text (8,000 pieces), NLLB's numbering
    (pieces up to id 256,000, filled with unused ones, then the 202 language tokens and <mask>), and
    seeded weights."""
    import transformers
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as LANGS

    from model.io.fairseq_vocab import train_spm

    out = work / "nllb-600m"
    out.mkdir(parents=True)
    texts = []
    for name in ("train.en.gz", "train.de.gz"):
        with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
            texts += [line.strip() for line in f][:30000]
    train_spm(texts, out, 8000)
    transformers.NllbTokenizer.from_pretrained(str(out), additional_special_tokens=LANGS).save_pretrained(str(out))
    tokenizer = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    last_piece = 256000
    vocab.update({f"<unused_{i}>": i for i in range(max(vocab.values()) + 1, last_piece + 1)})
    ids = {code: last_piece + 1 + i for i, code in enumerate(LANGS)} | {"<mask>": last_piece + 1 + len(LANGS)}
    for token in tokenizer["added_tokens"]:
        token["id"] = ids.get(token["content"], token["id"])
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)  # tokenizer.json's ids hold
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    shape = transformers.M2M100Config(
        **NLLB_600M, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.0
    )
    torch.manual_seed(0)
    transformers.M2M100ForConditionalGeneration(shape).save_pretrained(str(out))
    return out


def split_inter(system: str) -> tuple[str, int]:
    """ "ct2-float32-inter2" -> ("ct2-float32", 2); no suffix -> (system, 1)."""
    base, _, n = system.rpartition("-inter")
    return (base, int(n)) if base and n.isdigit() else (system, 1)


def prepare(name: str, work: Path, systems: list[str]) -> tuple[Path, Path, dict[str, Path | str]]:
    """The model's own, Hugging Face and CTranslate2 directories; a CTranslate2 conversion that fails
    (no wheel for this platform) gives its reason instead of a path."""
    if name == "nllb-600m":  # a Hugging Face directory, which beamserve reads as it is
        own = hf = make_nllb_model(work)
    else:
        own = make_base_model(work) if name == "base" else REPO / "model" / "pretrained" / name
        hf = work / f"{name}-hf"
        checkpoint.export_hf(own, hf)
    ct2: dict[str, Path | str] = {}
    for quant in ("float32", "int8", "float16"):
        if f"ct2-{quant}" in {split_inter(s)[0] for s in systems}:
            try:
                import ctranslate2.converters

                ct2[quant] = work / f"{name}-ct2-{quant}"
                ctranslate2.converters.TransformersConverter(str(hf)).convert(str(ct2[quant]), quantization=quant)
            except Exception as e:  # the report says why the system is missing
                ct2[quant] = f"{type(e).__name__}: {e}"
    return own, hf, ct2


def cell_options(K: int, steps: int | None, **more: Any) -> DecodeOptions:
    """beamserve's options for a cell: beam K, no length ratio, and on a random model exactly `steps` tokens a
    sentence (`more`: other options)."""
    return DecodeOptions(
        beam_size=K,
        max_length_ratio=None,
        max_decoding_length=steps or 256,
        min_decoding_length=(steps - 1) if steps else 0,
        **more,
    )


def run_beamserve(
    tr: Translator, srcs: list[list[int]], B: int, K: int, steps: int | None, early_stopping: bool = False
) -> int:
    opts = cell_options(K, steps, max_batch_size=B, early_stopping=early_stopping)
    return sum(len(h[0].tokens) + 1 for h in tr.translate_ids(srcs, opts))


def run_slots(
    tr: Translator,
    decoders: dict[tuple[int, int], SlotDecoder],
    srcs: list[list[int]],
    B: int,
    K: int,
    steps: int | None,
    compiled: bool = False,
) -> int:
    opts = cell_options(K, steps)
    if (B, K) not in decoders:
        shape = PoolShape(slots=B, beams=K, target_len=steps or 256, source_len=tr.max_source_tokens, ngram_max=0)
        graphs = tr.device.type == "cuda"
        decoders[B, K] = SlotDecoder(
            tr.model, shape, device=tr.device, graphs=graphs, compiled=compiled, kernels=tr.step_kernels
        )
        decoders[B, K].prepare()  # every bucket compiled and captured before any pass is timed
    hyps = decode_all(decoders[B, K], srcs, [opts] * len(srcs))
    return sum(len(h[0].tokens) + 1 for h in hyps)


def run_hf(model, pad: int, srcs: list[list[int]], B: int, K: int, steps: int | None, device: str) -> int:  # type: ignore[no-untyped-def]
    tokens = 0
    for i in range(0, len(srcs), B):
        chunk = srcs[i : i + B]
        S = max(map(len, chunk))
        ids = torch.tensor([s + [pad] * (S - len(s)) for s in chunk], device=device)
        kw = dict(max_new_tokens=steps, min_new_tokens=steps - 1) if steps else dict(max_new_tokens=256)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=ids != pad, num_beams=K, do_sample=False, **kw)
        tokens += int((out[:, 1:] != pad).sum())
    return tokens


def run_ct2(tr, srcs: list[list[str]], B: int, K: int, steps: int | None) -> int:  # type: ignore[no-untyped-def]
    kw = dict(max_decoding_length=steps - 1, min_decoding_length=steps - 1) if steps else {}
    results = tr.translate_batch(srcs, beam_size=K, max_batch_size=B, **kw)
    return sum(len(r.hypotheses[0]) + 1 for r in results)


def timed_round_robin(workers: dict[str, SystemWorker], n: int, B: int, K: int, repeats: int) -> dict[str, Cell]:
    """Best of `repeats` passes per system, the systems taking turns within each pass, so a slow
    spell of this shared machine hits them all rather than one."""
    for worker in workers.values():
        worker.run(B, B, K)  # warm-up
    best: dict[str, Cell] = {}
    for r in range(repeats):
        for name, worker in workers.items():
            time.sleep(0.2)  # the previous system's OpenMP threads spin a moment before they sleep
            cell = worker.run(n, B, K)
            if name not in best or cell.seconds < best[name].seconds:
                best[name] = cell
            print(f"  pass {r + 1}/{repeats} {name}: {cell.sent_s:.1f} sent/s", file=sys.stderr, flush=True)
    return best


class SystemWorker:
    """One system in its own process, timing passes on request.

    Separate processes because libraries sharing one process slow each other down: torch and
    CTranslate2 each bring an OpenMP runtime, and after one CTranslate2 call torch's parallel regions
    get slower (on this 2-core machine a 256 x 256 `sum` went from 9 to 81 us, and a beamserve batch
    from 1.27 to 1.81 s, measured with both loaded in one process).
    """

    def __init__(self, system: str, spec: dict[str, object]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # Not a daemon: -interN systems start worker processes of their own. It exits when the pipe closes.
        self.process = ctx.Process(target=_serve_system, args=(child, system, spec))
        self.process.start()
        child.close()

    def ready(self) -> Exception | None:
        """Blocks until the system is built: None, or why it could not be."""
        try:
            reply = self.conn.recv()
        except EOFError:  # it died building (a crash in a native library)
            self.process.join(timeout=30)
            return RuntimeError(f"the worker exited with code {self.process.exitcode}")
        return reply if isinstance(reply, Exception) else None

    def run(self, n: int, B: int, K: int) -> Cell:
        self.conn.send((n, B, K))
        reply = self.conn.recv()
        if isinstance(reply, Exception):
            raise reply
        tokens, seconds = reply
        return Cell(n, tokens, seconds)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # it may have exited already
            self.conn.send(None)
        self.process.join(timeout=30)


def _serve_system(conn: Connection, system: str, spec: dict[str, object]) -> None:
    """Worker process: build `system`'s runner once, then time (n, B, K) passes until told to stop."""
    args = argparse.Namespace(**spec["args"])  # type: ignore[arg-type]
    torch.set_num_threads(args.threads)
    try:
        run = _runner(system, spec, args)
    except Exception as e:  # reported to the parent, which leaves the system out and says why
        conn.send(_sendable(e))
        return
    conn.send(None)  # ready
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    while (job := _receive(conn)) is not None:
        n, B, K = job
        try:
            start = clock()
            tokens = run(n, B, K)
            conn.send((tokens, clock() - start))
        except Exception as e:
            conn.send(_sendable(e))


def _sendable(e: Exception) -> Exception:
    """e as the parent can receive it: its type and message in a RuntimeError where e does not pickle
    (inductor's errors hold modules)."""
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {str(e)[-2000:]}")


def _receive(conn: Connection) -> tuple[int, int, int] | None:
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except EOFError:  # the parent is gone
        return None


def _runner(system: str, spec: dict[str, object], args: argparse.Namespace) -> Callable[[int, int, int], int]:
    """(n sentences, batch B, beam K) -> tokens generated, for one system."""
    own, hf_dir = Path(str(spec["own"])), Path(str(spec["hf"]))
    steps = spec["steps"]
    assert steps is None or isinstance(steps, int)
    dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    system, inter = split_inter(system)
    threads = max(1, args.threads // inter)
    # Every worker loads a Translator (for the tokenizer), so the hf worker gets the same allocator set-up.
    tr = Translator.load(own, args.device, dtype=dtype, num_threads=args.threads)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][: args.sentences]
    lang = "eng_Latn" if tr.languages else None  # a model with language tokens: its source's first
    encoded = sorted((tr.encode(t, lang=lang) for t in texts), key=len)
    if system == "beamserve" and inter > 1:
        pool = Translator.load(own, args.device, dtype=dtype, num_threads=threads, inter_threads=inter)
        return lambda n, B, K: run_beamserve(pool, encoded[:n], B, K, steps)
    if system == "beamserve":
        return lambda n, B, K: run_beamserve(tr, encoded[:n], B, K, steps)
    if system == "beamserve-pytorch":  # PyTorch's ops only: decode-step attention without the C kernel
        native.turn_off()  # the GEMMs' C kernels too
        tr.model.use_plan(execution.probe().with_(device=str(tr.device), compute_type=tr.compute_type))
        return lambda n, B, K: run_beamserve(tr, encoded[:n], B, K, steps)
    if system == "beamserve-segments":  # the step cut at each activation (the plan's one_call off)
        tr.model.use_plan(tr.plan.with_(one_call=False))
        return lambda n, B, K: run_beamserve(tr, encoded[:n], B, K, steps)
    if system == "beamserve-stepwise":  # a beam search's every step a call of its own
        tr.model.use_plan(tr.plan.with_(steps_in_c=False))
        return lambda n, B, K: run_beamserve(tr, encoded[:n], B, K, steps)
    if system == "beamserve-es":  # CTranslate2's stopping rule: a sentence ends with beam_size finished hypotheses
        return lambda n, B, K: run_beamserve(tr, encoded[:n], B, K, steps, early_stopping=True)
    if system in ("beamserve-slots", "beamserve-slots-compiled", "beamserve-slots-triton"):
        decoders: dict[tuple[int, int], SlotDecoder] = {}  # one pool per (B, K), its graphs kept across passes
        compiled = system.endswith("-compiled")
        if system.endswith("-triton"):
            tr.model.use_plan(tr.plan.with_(step_kernels="triton"))
        return lambda n, B, K: run_slots(tr, decoders, encoded[:n], B, K, steps, compiled)
    int8_systems = ("beamserve-int8", "beamserve-int8_bfloat16", "beamserve-int8-pytorch", "beamserve-int8-es")
    if system in (*int8_systems, "beamserve-int8-segments", "beamserve-int8-stepwise"):
        # PyTorch's ops only: no C row kernels, no C attention (model/kernels/native.py)
        if system.endswith("-pytorch"):
            native.turn_off()  # before the load: its plan is PyTorch's operators
        early = system.endswith("-es")  # CTranslate2's stopping rule, as beamserve-es
        tr8 = Translator.load(own, args.device, compute_type=system.split("-")[1], num_threads=args.threads)
        tr8.model.use_plan(
            tr8.plan.with_(one_call=not system.endswith("-segments"), steps_in_c=not system.endswith("-stepwise"))
        )
        return lambda n, B, K: run_beamserve(tr8, encoded[:n], B, K, steps, early_stopping=early)
    if system == "beamserve-bf16":  # the same weights in bfloat16 (fast on CPUs with AVX512-BF16 or AMX)
        tr16 = Translator.load(own, args.device, dtype="bfloat16", num_threads=args.threads)
        return lambda n, B, K: run_beamserve(tr16, encoded[:n], B, K, steps)
    if system == "hf":
        import transformers

        transformers.logging.set_verbosity_error()  # not a warning per generate() call about max_length
        auto = transformers.AutoModelForSeq2SeqLM
        hf = auto.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).to(args.device).eval()
        pad = tr.model.cfg.pad_token_id
        return lambda n, B, K: run_hf(hf, pad, encoded[:n], B, K, steps, args.device)
    if system.startswith("ct2-"):
        import ctranslate2

        pieces = [[tr.tokenizer.pieces[i] for i in s] for s in encoded]
        path = Path(str(spec["ct2"]))
        ct = ctranslate2.Translator(str(path), device=args.device, intra_threads=threads, inter_threads=inter)
        return lambda n, B, K: run_ct2(ct, pieces[:n], B, K, steps)
    raise ValueError(f"unknown system {system!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="base,en-de")
    p.add_argument("--systems", default="beamserve,hf,ct2-float32,ct2-int8")
    p.add_argument("--batch-sizes", default="1,16,64")
    p.add_argument("--beams", default="1,4")
    p.add_argument("--steps", type=int, default=32, help="fixed decoding steps for the random model")
    p.add_argument("--sentences", type=int, default=128, help="sentences per cell (batch 1 uses a quarter)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the worker's CPU time instead of elapsed time; with --threads 1 it does not count "
        "time a noisy neighbour takes the core (more threads add their spin-waiting to it)",
    )
    p.add_argument("--dtype", default=None, help="beamserve/HF dtype on cuda (default float16)")
    p.add_argument("--out", type=Path, help="write the markdown report here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    systems = args.systems.split(",")
    if args.clock == "cpu" and any(split_inter(s)[1] > 1 for s in systems):
        p.error("-interN systems decode in worker processes whose CPU time --clock cpu cannot see; use --clock wall")
    lines = [
        "# Decoding benchmark\n",  # the command, commit and CPU: the provenance line (reports.emit)
        f"Device: {args.device} ({torch.get_num_threads()} threads){_gpu_name(args.device)}; torch "
        f"{torch.__version__}" + ("; each worker's CPU time, not elapsed time" if args.clock == "cpu" else "") + ".\n",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            own, hf_dir, ct2_dirs = prepare(name, Path(tmp), systems)
            lines.append(_bench_model(name, own, hf_dir, ct2_dirs, systems, args))
    emit("\n".join(lines), args.out)


def _gpu_name(device: str) -> str:
    return f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""


def _bench_model(
    name: str, own: Path, hf_dir: Path, ct2_dirs: dict[str, Path | str], systems: list[str], args: argparse.Namespace
) -> str:
    steps = args.steps if name in RANDOM_MODELS else None
    workers: dict[str, SystemWorker] = {}
    missing: dict[str, str] = {}  # system -> why it did not run
    try:
        for system in systems:
            quant = split_inter(system)[0].removeprefix("ct2-")
            where = ct2_dirs.get(quant, "")
            if system.startswith("ct2-") and not isinstance(where, Path):
                missing[system] = str(where)
                continue
            spec = {"own": str(own), "hf": str(hf_dir), "ct2": str(where), "steps": steps, "args": vars(args)}
            worker = SystemWorker(system, spec)
            # Built is not enough: a library may load and fail on its first batch (CUDA libraries it lacks).
            if (error := worker.ready() or _smoke(worker)) is not None:
                missing[system] = f"{type(error).__name__}: {error}"
                worker.close()
                continue
            workers[system] = worker
        for system, why in missing.items():
            print(f"{name} {system}: not run: {why}", file=sys.stderr, flush=True)
        gone = "".join(f"\n\nNot run: {system}: {why.splitlines()[0][:300]}" for system, why in missing.items())
        return _bench_rows(name, workers, steps, args) + gone
    finally:
        for worker in workers.values():
            worker.close()


def _smoke(worker: SystemWorker) -> Exception | None:
    try:
        worker.run(2, 2, 1)
    except Exception as exc:  # the system's own failure, reported as not run
        return exc
    return None


def _bench_rows(name: str, workers: dict[str, SystemWorker], steps: int | None, args: argparse.Namespace) -> str:
    head = f"\n## {name}" + (
        f" (random weights, {steps} decoding steps per sentence)" if steps else " (shipped weights, natural lengths)"
    )
    pairs = [("beamserve", "hf"), ("beamserve", "ct2-float32"), ("beamserve", "ct2-int8")]
    pairs += [("beamserve", "beamserve-pytorch"), ("beamserve-int8", "beamserve-int8-pytorch")]
    pairs += [("beamserve", "beamserve-segments"), ("beamserve-int8", "beamserve-int8-segments")]
    pairs += [("beamserve", "beamserve-stepwise"), ("beamserve-int8", "beamserve-int8-stepwise")]
    pairs += [("beamserve-int8", "beamserve"), ("beamserve-int8", "ct2-int8"), ("beamserve-int8-es", "ct2-int8")]
    if "beamserve-slots" in workers:
        pairs += [("beamserve-slots", "beamserve"), ("beamserve-slots", "hf")]
    if "beamserve-slots-triton" in workers:
        pairs += [("beamserve-slots-triton", "beamserve-slots"), ("beamserve-slots-triton", "hf")]
    if "beamserve-slots-compiled" in workers:
        pairs += [("beamserve-slots-compiled", "beamserve-slots"), ("beamserve-slots-compiled", "hf")]
    if "beamserve-es" in workers:
        pairs.append(("beamserve-es", "ct2-float32"))
    for system in workers:
        base, inter = split_inter(system)
        if base == "beamserve" and inter > 1:
            pairs += [(system, "beamserve"), (system, "hf"), (system, f"ct2-float32-inter{inter}")]
    pairs = [(a, b) for a, b in pairs if a in workers and b in workers]
    rows = [
        "| "
        + " | ".join(["search", "batch", *(f"{s} sent/s (tok/s)" for s in workers), *(f"{a} / {b}" for a, b in pairs)])
        + " |",
        "|" + "---|" * (len(workers) + 2 + len(pairs)),
    ]
    for K in map(int, args.beams.split(",")):
        for B in map(int, args.batch_sizes.split(",")):
            n = max(B, args.sentences // 4) if B == 1 else args.sentences
            cells = timed_round_robin(workers, n, B, K, args.repeats)
            for sys_name, cell in cells.items():
                print(
                    f"{name} K={K} B={B} {sys_name}: {cell.sent_s:.1f} sent/s {cell.tok_s:.0f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
            ratios = [
                f"{cells[a].sent_s / cells[b].sent_s:.2f}x" if a in cells and b in cells else "-" for a, b in pairs
            ]
            search = "greedy" if K == 1 else f"beam {K}"
            speeds = [f"{c.sent_s:.1f} ({c.tok_s:.0f})" for c in cells.values()]
            rows.append("| " + " | ".join([search, str(B), *speeds, *ratios]) + " |")
    note = ""
    if "beamserve-es" in workers:
        note = (
            "\n\nbeamserve-es: `early_stopping=True` (Hugging Face's name), a sentence stops once it has "
            "beam_size finished hypotheses. That is CTranslate2's rule whenever length_penalty != 0 "
            "(its default is 1); beamserve and hf run Hugging Face's default (`early_stopping=False`: go on "
            "while a running beam could still beat a finished one), which decodes more steps."
        )
    return head + "\n\n" + "\n".join(rows) + note


if __name__ == "__main__":
    main()
