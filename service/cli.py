"""The `beamserve` command line."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from model.options import COMPUTE_TYPES

if TYPE_CHECKING:
    from model.translator import SourceError, Translator

SCORE_CHUNK = 256  # pairs `beamserve score` scores a call: its progress bar moves by these


def _decode_args(p: argparse.ArgumentParser) -> None:
    """The decoding options the CLI offers (model/options.py), then the device and thread flags."""
    from typing import get_type_hints

    from model.options import DecodeOptions, user_options

    hints = get_type_hints(DecodeOptions)
    for f in user_options("cli"):  # unset (None): the model's default (its generation_config.json), else ours
        flag = "--" + f.name.replace("_", "-")
        default = f"default: the model's, else {f.default}"
        if hints[f.name] is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=f"{f.metadata['help']} ({default})")
        else:
            p.add_argument(flag, type=hints[f.name], default=None, help=f"{f.metadata['help']} ({default})")
    _model_args(p)


def _model_args(p: argparse.ArgumentParser) -> None:
    """The languages, device, compute type and thread flags of a command that loads a model."""
    p.add_argument("--src-lang", default=None, help="a model with language tokens (NLLB: eng_Latn; M2M100: en)")
    p.add_argument("--tgt-lang", default=None, help="the target's, as --src-lang")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    p.add_argument(
        "--compute-type",
        default=None,
        choices=list(COMPUTE_TYPES),
        help="CTranslate2's names: int8 quantises the linear layers at load (CPU); default: float16 on cuda, "
        "float32 on cpu",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op CPU threads, per worker with --inter-threads (default: the CPUs, shared out)",
    )
    p.add_argument(
        "--inter-threads",
        type=int,
        default=1,
        help="CPU only: batches decoded in parallel, each by a worker process (CTranslate2's inter_threads)",
    )


def decode_options(args: argparse.Namespace, base=None):  # type: ignore[no-untyped-def]
    """The options given on the command line over `base` (a model's defaults; else beamserve's), checked."""
    from dataclasses import replace

    from model.options import DecodeOptions, user_options

    given = {f.name: value for f in user_options("cli") if (value := getattr(args, f.name)) is not None}
    opts = replace(base or DecodeOptions(), **given)
    opts.validate()
    return opts


def _line_problem(source: str, exc: SourceError) -> str:
    """ "stdin line 3: why" for a source text the model refused (translate() numbers texts from 0)."""
    return f"{source} line {(exc.index or 0) + 1}: {exc.reason}"


def _load(args: argparse.Namespace) -> Translator:
    from model import Translator

    return Translator.load(
        args.model,
        args.device,
        dtype=args.dtype,
        compute_type=args.compute_type,
        num_threads=args.threads,
        inter_threads=args.inter_threads,
    )


def cmd_translate(args: argparse.Namespace) -> int:
    from model import InputTooLongError, SourceError

    decode_options(args)  # checked before the model loads
    tr = _load(args)
    opts = decode_options(args, tr.defaults)
    if args.verbose:
        print(f"beamserve translate: {args.model} (digest {tr.digest[:12]}); its plan:", file=sys.stderr)
        print("\n".join(f"  {line}" for line in tr.plan.lines()), file=sys.stderr)
    # UTF-8 whatever the locale; bytes that are not UTF-8 come through as lone surrogates, which
    # translate() refuses (InvalidTextError) instead of a UnicodeDecodeError traceback here.
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
    lines = [line.rstrip("\n") for line in stdin]
    try:
        # translate() encodes every line before it decodes any, so a bad line stops it at once.
        with tqdm(total=len(lines), unit="sent", file=sys.stderr, disable=args.quiet) as bar:
            results = tr.translate(
                lines, opts, progress=bar.update, truncate=args.truncate, src_lang=args.src_lang, tgt_lang=args.tgt_lang
            )
    except SourceError as exc:
        hint = " (--truncate cuts such sources to fit)" if isinstance(exc, InputTooLongError) else ""
        print(f"beamserve translate: {_line_problem('stdin', exc)}{hint}", file=sys.stderr)
        return 2
    finally:
        tr.close()
    for r in results:
        print(r.hypotheses[0] if opts.num_hypotheses == 1 else " ||| ".join(r.hypotheses))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from model import SourceError
    from model.train.data import read_text
    from model.train.evaluate import evaluate

    decode_options(args)  # checked before the model loads
    tr = _load(args)
    opts = decode_options(args, tr.defaults)
    try:
        sources, references = read_text(Path(args.src)), read_text(Path(args.ref))
        ev, hyps = evaluate(tr, sources, references, opts, src_lang=args.src_lang, tgt_lang=args.tgt_lang)
    except SourceError as exc:
        print(f"beamserve evaluate: {_line_problem(args.src, exc)}", file=sys.stderr)
        return 2
    finally:
        tr.close()
    print(ev.report())
    if args.output:
        Path(args.output).write_text("\n".join(hyps) + "\n", encoding="utf-8")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    import json

    from model import SourceError
    from model.train.data import read_text

    sources, targets = read_text(Path(args.src)), read_text(Path(args.tgt))
    if len(sources) != len(targets):
        print(
            f"beamserve score: {len(sources)} lines in --src, {len(targets)} in --tgt: give one a line", file=sys.stderr
        )
        return 2
    tr = _load(args)
    out = []
    start = 0
    try:
        with tqdm(total=len(sources), unit="sent", file=sys.stderr, disable=args.quiet) as bar:
            for start in range(0, len(sources), SCORE_CHUNK):
                chunk = slice(start, start + SCORE_CHUNK)
                found = tr.score(sources[chunk], targets[chunk], src_lang=args.src_lang, tgt_lang=args.tgt_lang)
                out += found
                bar.update(len(found))
    except SourceError as exc:
        shifted = type(exc)(exc.reason, (exc.index or 0) + start)
        print(f"beamserve score: {_line_problem(f'{args.src} / {args.tgt}', shifted)}", file=sys.stderr)
        return 2
    finally:
        tr.close()
    for r in out:
        if args.json:
            fields = {"tokens": r.tokens, "log_probs": r.log_probs, "total": r.total, "normalized": r.normalized}
            print(json.dumps(fields, ensure_ascii=False))
        else:
            print(f"{r.normalized:.6f}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from model.train.train import TrainConfig, train

    cfg = TrainConfig(
        data_dir=Path(args.data),
        out_dir=Path(args.out),
        src_lang=args.src_lang,
        tgt_lang=args.tgt_lang,
        preset=args.preset,
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        dropout=args.dropout,
        max_epochs=args.max_epochs,
        max_steps=args.max_steps,
        max_minutes=args.max_minutes,
        patience=args.patience,
        average_last=args.average_last,
        train_limit=args.train_limit,
        seed=args.seed,
        device=args.device,
        save_dtype=args.save_dtype,
        extra=json.loads(args.model_config or "{}"),
    )
    print(f"final model: {train(cfg)}")
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    from model.io.checkpoint import export_hf
    from model.shipped import resolve_model_path

    export_hf(resolve_model_path(args.model), Path(args.out))
    print(f"wrote a Hugging Face MarianMT directory to {args.out}")
    return 0


def cmd_convert_marian(args: argparse.Namespace) -> int:
    from model.io.marian_release import convert

    convert(Path(args.release), Path(args.out))
    print(f"wrote a Hugging Face MarianMT directory to {args.out}; serve it, or quantize it, as any model directory")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from model.shipped import HUB_ID, hub_snapshot

    name = args.model + (f"@{args.revision}" if args.revision else "")
    if not HUB_ID.fullmatch(name):
        raise ValueError(f"{name!r} is not a Hugging Face id (organisation/model, or organisation/model@revision)")
    try:
        path = hub_snapshot(name, download=True)
    except Exception as exc:  # the hub's errors (not found, no access, no network): one line
        if isinstance(exc, (FileNotFoundError, ValueError)):
            raise
        why = " ".join(str(exc).split())[:300]
        raise ValueError(f"{name} could not be fetched: {type(exc).__name__}: {why}") from None
    print(f"{name} is in the Hugging Face cache: {path}; serve it with `beamserve serve --models {args.model}`")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from model import Translator
    from model.io import checkpoint
    from model.shipped import resolve_model_path

    source = resolve_model_path(args.model)
    tr = Translator.load(source, "cpu", compute_type="int8")
    out = Path(args.out)
    checkpoint.save_int8(tr.model, out, source)
    size = (out / "model.safetensors").stat().st_size / 2**20
    print(f"wrote an int8 model to {out} ({size:.1f} MiB of weights; it loads as compute_type int8 on CPU)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import time

    from service import runtime
    from service.settings import Settings

    overrides = {
        k: v
        for k, v in {
            "models": args.models,
            "host": args.host,
            "port": args.port,
            "metrics_host": args.metrics_host,
            "metrics_port": args.metrics_port,
            "num_cpus": args.num_cpus,
            "num_gpus": args.num_gpus,
        }.items()
        if v is not None
    }
    settings = Settings(**overrides)
    print(
        f"starting Ray ({settings.num_cpus or 'all'} CPUs) and the Serve app for "
        f"{[e.name for e in settings.entries()]} ...",
        file=sys.stderr,
        flush=True,
    )
    settings = runtime.start(settings, say=lambda line: print(line, file=sys.stderr, flush=True))
    metrics = f"http://{settings.metrics_host}:{settings.metrics_port}/metrics"
    print(
        f"beamserve listening on http://{settings.host}:{settings.port} (API docs at /docs); "
        f"Prometheus metrics on {metrics}; Ctrl-C stops it",
        flush=True,
    )
    # The handler only records the signal: one that took a lock (Event.set) could deadlock against the
    # interrupted wait holding it, as a second signal arriving within the first's handler does.
    signals: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: signals.append(signum))
    while not signals:
        time.sleep(0.2)
    # Drain: refuse new translations at once, let the accepted ones finish, then stop.

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    runtime.drain_and_stop(settings.drain_timeout_s, say=say)
    return 0


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """0 when the server of these settings (BEAMSERVE_PORT, BEAMSERVE_HOST) answers /healthz with 200,
    else 1 with the reason on stderr: the Docker image's HEALTHCHECK, on whatever port it serves."""
    import urllib.error
    import urllib.request

    from service.settings import Settings

    s = Settings()
    host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host  # a server on every interface: loopback
    url = f"http://{host}:{args.port or s.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:
            return 0 if r.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"beamserve healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


def cmd_keys(args: argparse.Namespace) -> int:
    """The API keys a server with api_keys_store reads (service/store/api_keys.py), in its records store."""
    import asyncio

    from service.settings import Settings
    from service.store import api_keys
    from service.store.records import open_records, storage_of

    s = Settings()
    records = open_records(args.store or storage_of(s.records_storage, s.limits_storage))
    limits = {n: value for n in api_keys.LIMITS if (value := getattr(args, n, None)) is not None}
    try:
        if args.action == "list":
            for k in asyncio.run(api_keys.listed(records)):
                given = ", ".join(f"{n} {getattr(k, n)}" for n in api_keys.LIMITS if getattr(k, n)) or "the defaults"
                print(f"{k.name}\t{k.digest[:16]}\t{given}")
            return 0
        if not args.name:
            raise ValueError(f"keys {args.action} needs the key's name")
        if args.action == "add":
            print(asyncio.run(api_keys.add(records, args.name, limits)))  # shown once: the store keeps its digest
        elif args.action == "rotate":
            print(asyncio.run(api_keys.rotate(records, args.name)))
        else:
            asyncio.run(api_keys.revoke(records, args.name))
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return 0


def cmd_tm(args: argparse.Namespace) -> int:
    """Translation memories in the server's records store (service/store/memories.py), as the key that owns them
    reaches them through /v1/memories."""
    import asyncio
    from pathlib import Path

    from service.api.keys import ANONYMOUS, client_id
    from service.errors import ApiError
    from service.settings import Settings
    from service.store.memories import Memories
    from service.store.records import open_records, storage_of
    from service.text import tmx

    s = Settings()
    memories = Memories(open_records(args.store or storage_of(s.records_storage, s.limits_storage)))
    owner = client_id(args.key) if args.key else ANONYMOUS.id
    try:
        if args.action == "list":
            for m in asyncio.run(memories.listing(owner)):
                print(f"{m['memory_id']}\t{m['name']}\t{m['source']}-{m['target']}\t{m['units']} units")
        elif args.action == "import":
            if not (args.file and args.name and args.source and args.target):
                raise ValueError("tm import needs the TMX file, --name, --source and --target")
            source, target = args.source.lower(), args.target.lower()
            units = tmx.read(Path(args.file).read_bytes(), source, target)
            made = asyncio.run(memories.create(owner, args.name, source, target, units))
            print(f"{made.memory_id}\t{len(made.units)} units")
        else:
            if not args.file:
                raise ValueError("tm export needs the memory's id")
            found = asyncio.run(memories.get(args.file, owner))
            sys.stdout.buffer.write(tmx.write(found.units, found.source, found.target))
    except ApiError as exc:
        raise ValueError(exc.detail) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="beamserve", description="Machine-translation server and tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the HTTP translation service (local Ray + Serve)")
    p.add_argument("--models", help="comma-separated model names or directories (default: en-de,en-fr)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000)")
    p.add_argument("--metrics-host", help="Prometheus metrics address (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default 8080)")
    p.add_argument("--num-cpus", type=int, help="CPUs given to Ray (default: all usable)")
    p.add_argument("--num-gpus", type=int, help="GPUs given to Ray (default: the host's)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("healthcheck", help="exit 0 when the configured server answers /healthz (Docker's HEALTHCHECK)")
    p.add_argument("--port", type=int, help="HTTP port (default: BEAMSERVE_PORT, else 8000)")
    p.add_argument("--timeout", type=float, default=4.0, help="seconds to wait for the answer")
    p.set_defaults(func=cmd_healthcheck)

    p = sub.add_parser("translate", help="translate stdin (one sentence a line) to stdout")
    p.add_argument("--model", required=True, help="model directory or shipped name (en-de, en-fr)")
    p.add_argument("--truncate", action="store_true", help="cut over-long sources instead of failing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--verbose", action="store_true", help="say the model and its execution plan: device, compute type, kernels"
    )
    _decode_args(p)
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("evaluate", help="sacreBLEU and chrF of a model on a test set")
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--output", help="also write the translations here")
    _decode_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("score", help="each line of --tgt scored as a translation of the line of --src (log-probs)")
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True, help="source sentences, one a line")
    p.add_argument("--tgt", required=True, help="their translations, one a line")
    p.add_argument("--json", action="store_true", help="a JSON object a line: tokens, log_probs, total, normalized")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _model_args(p)
    p.set_defaults(func=cmd_score)

    _model_commands(sub)
    return parser


def _model_commands(sub: Any) -> None:
    """The commands that make, convert and fetch models: train, export-hf and the rest."""
    p = sub.add_parser("train", help="train a model on a parallel corpus (resumable)")
    p.add_argument("--data", required=True, help="directory with {train,val}.{lang}[.gz]")
    p.add_argument("--out", required=True, help="run directory (checkpoints, tokenizer, final/)")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--preset", default="small", choices=["tiny", "small", "base"])
    p.add_argument("--model-config", help="JSON overrides of ModelConfig fields")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--max-epochs", type=int, default=40)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--max-minutes", type=float, default=None, help="training time budget")
    p.add_argument("--patience", type=int, default=5)
    p.add_argument("--average-last", type=int, default=5)
    p.add_argument("--train-limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default=None)
    p.add_argument("--save-dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("export-hf", help="write a model as a Hugging Face MarianMT directory")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_export_hf)

    p = sub.add_parser(
        "convert-marian",
        help="convert a Marian release (OPUS-MT or Tatoeba zip, unpacked: decoder.yml, *.npz, *.vocab.yml, "
        "source.spm, target.spm) to a Hugging Face MarianMT directory",
    )
    p.add_argument("--release", required=True, help="the unpacked release directory")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_convert_marian)

    p = sub.add_parser(
        "download",
        help="fetch a model from the Hugging Face hub into its cache (HF_HOME), for --models, --model and the "
        "registry to name by its id",
    )
    p.add_argument("model", help="the hub id, e.g. Helsinki-NLP/opus-mt-en-de")
    p.add_argument("--revision", help="a branch, tag or commit (default: main); pinned as ID@REVISION")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser(
        "keys",
        help="add, list, revoke or rotate the API keys a server with BEAMSERVE_API_KEYS_STORE reads from its records",
    )
    p.add_argument("action", choices=["add", "list", "revoke", "rotate"])
    p.add_argument("name", nargs="?", help="the key's name (add, revoke, rotate); add and rotate print the new key")
    p.add_argument("--store", help="the records store (default: the server's, BEAMSERVE_RECORDS_STORAGE and the rest)")
    # api_keys.LIMITS, not imported here: that would load the records store for every command.
    for limit in ("requests_per_minute", "characters_per_day", "characters_per_month"):
        p.add_argument("--" + limit.replace("_", "-"), type=int, help=f"add: the key's {limit.replace('_', ' ')}")
    p.set_defaults(func=cmd_keys)

    p = sub.add_parser(
        "tm", help="import a TMX file as a translation memory, export one as TMX, or list them, in the records store"
    )
    p.add_argument("action", choices=["import", "export", "list"])
    p.add_argument("file", nargs="?", help="import: the TMX file; export: the memory's id (the file is stdout)")
    p.add_argument("--name", help="import: the memory's name")
    p.add_argument("--source", help="import: the source language (a unit's tuv matched on its primary subtag)")
    p.add_argument("--target", help="import: the target language")
    p.add_argument("--key", help="the API key that owns the memories (default: the server's without keys)")
    p.add_argument("--store", help="the records store (default: the server's, BEAMSERVE_RECORDS_STORAGE and the rest)")
    p.set_defaults(func=cmd_tm)

    p = sub.add_parser(
        "quantize", help="write a model with int8 weights, which a replica loads without quantising (compute type int8)"
    )
    p.add_argument("--model", required=True, help="model directory or shipped name (en-de, en-fr)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_quantize)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (FileNotFoundError, ValueError) as exc:  # a wrong path, model, option or input: no traceback
        print(f"beamserve {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
