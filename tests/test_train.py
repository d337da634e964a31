"""Training smoke tests: the loss falls, checkpoints are written, load, and training resumes."""

import json
from pathlib import Path

import pytest
import torch

from model import Translator
from model.train.train import TrainConfig, lr_at, train

from .conftest import DATA

pytestmark = pytest.mark.slow  # starts Ray, a server, worker processes or training


def test_learning_rate_warms_up_then_decays_with_inverse_sqrt() -> None:
    assert lr_at(50, 1e-3, 100) == pytest.approx(5e-4)
    assert lr_at(100, 1e-3, 100) == pytest.approx(1e-3)
    assert lr_at(400, 1e-3, 100) == pytest.approx(5e-4)


def test_tiny_training_lowers_validation_loss_and_writes_a_loadable_model(tiny_run: Path) -> None:
    history = torch.load(tiny_run / "last.pt", weights_only=False)["state"]["history"]
    losses = [h["val_loss"] for h in history]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.5
    tr = Translator.load(tiny_run / "final", "cpu")
    assert tr.translate(["A man is walking."])[0].hypotheses[0]
    assert json.loads((tiny_run / "train_config.json").read_text())["seed"] == 7


def test_training_resumes_from_its_last_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = dict(
        data_dir=DATA,
        out_dir=tmp_path,
        preset="tiny",
        vocab_size=300,
        train_limit=500,
        max_tokens=1024,
        warmup_steps=10,
        average_last=2,
        save_dtype="float32",
        device="cpu",
    )
    train(TrainConfig(max_epochs=1, **cfg))  # type: ignore[arg-type]
    first = torch.load(tmp_path / "last.pt", weights_only=False)["state"]
    train(TrainConfig(max_epochs=2, **cfg))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"resumed from {tmp_path / 'last.pt'}: epoch 1, step {first['step']}" in out
    second = torch.load(tmp_path / "last.pt", weights_only=False)["state"]
    assert second["epoch"] == 2 and second["step"] == 2 * first["step"]
    assert sorted(p.name for p in tmp_path.glob("epoch*.pt")) == ["epoch001.pt", "epoch002.pt"]
