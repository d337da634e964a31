"""Where models are found: a directory, or the name of a model shipped under model/pretrained/.

Torch-free, so that a process which only names models (`beamserve serve`'s driver, the settings'
registry) resolves them without importing torch.
"""

from __future__ import annotations

from pathlib import Path

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
OWN_CONFIG = "beamserve.json"  # the config file of beamserve's own checkpoint format (model/io/checkpoint.py)


def is_own_checkpoint(path: Path) -> bool:
    return (path / OWN_CONFIG).is_file()


def resolve_model_path(path: str | Path) -> Path:
    """A directory, or the name of a shipped model under model/pretrained/."""
    candidate = Path(path)
    if candidate.is_dir():
        return candidate
    shipped = PRETRAINED_DIR / str(path)
    if shipped.is_dir():
        return shipped
    raise FileNotFoundError(f"no model directory {path!r}; shipped models: {shipped_models() or 'none'}")


def shipped_models() -> list[str]:
    if not PRETRAINED_DIR.is_dir():
        return []
    return sorted(p.name for p in PRETRAINED_DIR.iterdir() if is_own_checkpoint(p))
