"""Training: label-smoothed cross-entropy, Adam with warm-up then inverse-sqrt decay, token batches,
early stopping on validation loss, averaging of the last checkpoints; resumable and seeded."""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from model.io import checkpoint
from model.io.tokenizer import Tokenizer, train_joint_spm
from model.nn.config import ModelConfig, preset
from model.nn.transformer import Seq2Seq
from model.train.data import collate, iterate, read_text, split_path, token_batches


@dataclass
class TrainConfig:
    data_dir: Path
    out_dir: Path
    src_lang: str = "en"
    tgt_lang: str = "de"
    preset: str = "small"  # model size, see model.nn.config.preset
    vocab_size: int = 8000  # joint SentencePiece pieces + <pad>
    max_tokens: int = 4096  # padded tokens per batch (the larger side)
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    warmup_steps: int = 1000
    label_smoothing: float = 0.1
    dropout: float = 0.3
    max_epochs: int = 40
    max_steps: int | None = None  # stop early (smoke runs)
    max_minutes: float | None = None  # stop after the epoch that passes this much training time
    patience: int = 5  # epochs without a better validation loss before stopping
    average_last: int = 5  # checkpoints averaged into the final model
    max_length: int = 128  # training pairs longer than this (tokens) are dropped
    train_limit: int | None = None  # use only the first N training pairs
    seed: int = 1
    device: str | None = None
    save_dtype: str = "float16"  # dtype of the final weights
    save_every: int = 200  # steps between mid-epoch resume points
    extra: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides


def lr_at(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to peak, then decay with the inverse square root of the step (the paper's shape)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


Pairs = list[tuple[list[int], list[int]]]


def prepare_data(cfg: TrainConfig) -> tuple[Tokenizer, Pairs, Pairs]:
    """Train (or reuse) the joint SentencePiece model and encode train/val pairs."""
    tok_dir = cfg.out_dir / "tokenizer"
    src_train = read_text(split_path(cfg.data_dir, "train", cfg.src_lang))[: cfg.train_limit]
    tgt_train = read_text(split_path(cfg.data_dir, "train", cfg.tgt_lang))[: cfg.train_limit]
    if not (tok_dir / "vocab.json").exists():
        model_file, vocab = train_joint_spm(src_train + tgt_train, tok_dir / "joint", cfg.vocab_size)
        for name in ("source.spm", "target.spm"):
            shutil.copyfile(model_file, tok_dir / name)
        (tok_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tok = Tokenizer.load(tok_dir)

    def encode(src: list[str], tgt: list[str]) -> Pairs:
        pairs = [(tok.encode(s), tok.encode_target(t)) for s, t in zip(src, tgt, strict=True)]
        return [p for p in pairs if len(p[0]) <= cfg.max_length and len(p[1]) <= cfg.max_length]

    src_val = read_text(split_path(cfg.data_dir, "val", cfg.src_lang))
    tgt_val = read_text(split_path(cfg.data_dir, "val", cfg.tgt_lang))
    return tok, encode(src_train, tgt_train), encode(src_val, tgt_val)


def loss_fn(model: Seq2Seq, batch: tuple[torch.Tensor, ...], smoothing: float) -> tuple[torch.Tensor, int]:
    src, mask, tgt_in, labels = batch
    logits = model(src, mask, tgt_in)  # (B, T, V)
    loss = F.cross_entropy(
        logits.float().view(-1, logits.shape[-1]),
        labels.view(-1),
        ignore_index=model.cfg.pad_token_id,
        label_smoothing=smoothing,
        reduction="sum",
    )
    tokens = int((labels != model.cfg.pad_token_id).sum())
    return loss, tokens


@torch.no_grad()
def validate(model: Seq2Seq, pairs: Pairs, cfg: TrainConfig, device: torch.device) -> float:
    """Per-token validation cross-entropy (no smoothing)."""
    model.eval()
    total, tokens = 0.0, 0
    for idx in token_batches(pairs, cfg.max_tokens, seed=0, shuffle=False):
        batch = collate([pairs[i] for i in idx], model.cfg.pad_token_id, model.cfg.decoder_start_token_id, device)
        with _autocast(device):
            loss, n = loss_fn(model, batch, 0.0)
        total, tokens = total + float(loss), tokens + n
    model.train()
    return total / max(tokens, 1)


def _autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _model_config(cfg: TrainConfig, tok: Any) -> ModelConfig:
    """The preset's model over the tokenizer's vocabulary, with the run's dropout and extra settings."""
    overrides = {"dropout": cfg.dropout, **cfg.extra}
    return ModelConfig.from_dict(
        {
            **preset(cfg.preset, len(tok)).to_dict(),
            **overrides,
            "unk_token_id": tok.unk_id,
            "pad_token_id": tok.pad_id,
            "decoder_start_token_id": tok.pad_id,
        }
    )


def _resumed(last: Path, model: Seq2Seq, opt: torch.optim.Optimizer, device: torch.device) -> dict[str, Any]:
    """The run's progress: from `last` (the model, the optimizer and the random state restored) where it exists."""
    state: dict[str, Any] = {
        "epoch": 0, "batch": 0, "step": 0, "best_val": float("inf"), "bad_epochs": 0, "history": [], "seconds": 0.0,
    }  # fmt: skip
    if last.exists():
        saved = torch.load(last, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
        torch.set_rng_state(saved["rng"])
        print(f"resumed from {last}: epoch {state['epoch']}, step {state['step']}", flush=True)
    return state


def _step(
    model: Seq2Seq, opt: torch.optim.Optimizer, batch: Any, cfg: TrainConfig, step: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """One optimiser step on `batch` at the warm-up schedule's rate: its summed loss and token count."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg.lr, cfg.warmup_steps)
    with _autocast(device):
        loss, n = loss_fn(model, batch, cfg.label_smoothing)
    opt.zero_grad(set_to_none=True)
    (loss / n).backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, n


def train(cfg: TrainConfig) -> Path:
    """Train, resuming from out_dir/last.pt when it exists; returns the final model directory."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tok, train_pairs, val_pairs = prepare_data(cfg)
    mcfg = _model_config(cfg, tok)
    model = Seq2Seq(mcfg).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
    last = cfg.out_dir / "last.pt"
    state = _resumed(last, model, opt, device)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model {cfg.preset}: {params / 1e6:.1f}M parameters, vocab {len(tok)}, {len(train_pairs)} training pairs, "
        f"device {device}",
        flush=True,
    )
    (cfg.out_dir / "train_config.json").write_text(json.dumps(asdict(cfg), default=str, indent=2))

    while state["epoch"] < cfg.max_epochs and not _stopped(state, cfg):
        epoch = state["epoch"]
        batches = token_batches(train_pairs, cfg.max_tokens, seed=cfg.seed * 1000 + epoch)
        bar = tqdm(
            total=len(batches),
            initial=state["batch"],
            desc=f"epoch {epoch + 1}",
            unit="batch",
            dynamic_ncols=True,
            mininterval=2.0,
        )
        started, tokens_seen = time.perf_counter(), 0
        for i, idx in iterate(batches, state["batch"]):
            batch = collate([train_pairs[j] for j in idx], mcfg.pad_token_id, mcfg.decoder_start_token_id, device)
            state["step"] += 1
            loss, n = _step(model, opt, batch, cfg, state["step"], device)
            tokens_seen += n
            state["batch"] = i + 1
            bar.update(1)
            bar.set_postfix(
                loss=f"{loss.item() / n:.3f}",
                tok_s=f"{tokens_seen / (time.perf_counter() - started):.0f}",
                lr=f"{opt.param_groups[0]['lr']:.2e}",
                refresh=False,
            )
            if state["step"] % cfg.save_every == 0:  # mid-epoch resume point
                _save_last(last, model, opt, {**state, "seconds": state["seconds"] + time.perf_counter() - started})
            if cfg.max_steps is not None and state["step"] >= cfg.max_steps:
                break
        bar.close()
        state["seconds"] += time.perf_counter() - started
        val = validate(model, val_pairs, cfg, device)
        state["history"].append(
            {"epoch": epoch + 1, "step": state["step"], "val_loss": val, "seconds": round(state["seconds"], 1)}
        )
        improved = val < state["best_val"]
        state["best_val"], state["bad_epochs"] = (val, 0) if improved else (state["best_val"], state["bad_epochs"] + 1)
        print(
            f"epoch {epoch + 1}: val loss {val:.4f}{' (best)' if improved else ''}, step {state['step']}, "
            f"{state['seconds']:.0f}s",
            flush=True,
        )
        torch.save(model.state_dict(), cfg.out_dir / f"epoch{epoch + 1:03d}.pt")
        _prune(cfg.out_dir, keep=cfg.average_last)
        state["epoch"], state["batch"] = epoch + 1, 0
        _save_last(last, model, opt, state)
        if cfg.max_steps is not None and state["step"] >= cfg.max_steps:
            break
    return finalize(cfg, mcfg, tok)


def _save_last(path: Path, model: Seq2Seq, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "state": state, "rng": torch.get_rng_state()}, tmp
    )
    tmp.replace(path)  # atomic: a kill mid-write never leaves a broken resume point


def _stopped(state: dict[str, Any], cfg: TrainConfig) -> bool:
    out_of_time = cfg.max_minutes is not None and state["seconds"] >= cfg.max_minutes * 60
    return bool(state["bad_epochs"] >= cfg.patience or out_of_time)


def _prune(out: Path, keep: int) -> None:
    for old in sorted(out.glob("epoch*.pt"))[:-keep]:
        old.unlink()


def finalize(cfg: TrainConfig, mcfg: ModelConfig, tok: Tokenizer) -> Path:
    """Average the last checkpoints and write the final model in beamserve's format."""
    paths = sorted(cfg.out_dir.glob("epoch*.pt"))[-cfg.average_last :]
    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    averaged = {k: sum(s[k].float() for s in states) / len(states) for k in states[0]}
    model = Seq2Seq(mcfg)
    model.load_state_dict(averaged)
    final = cfg.out_dir / "final"
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.save_dtype]
    checkpoint.save(model, final, cfg.out_dir / "tokenizer", dtype=dtype)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.stem for p in paths)}) -> {final}", flush=True)
    return final
