"""Where models are found: a directory, or the name of a model shipped under model/pretrained/.

Torch-free, so that a process which only names models (`beamserve serve`'s driver, the settings'
registry) resolves them without importing torch.
"""

from __future__ import annotations

import re
from pathlib import Path

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
OWN_CONFIG = "beamserve.json"  # the config file of beamserve's own checkpoint format (model/io/checkpoint.py)


def is_own_checkpoint(path: Path) -> bool:
    return (path / OWN_CONFIG).is_file()


# A Hugging Face hub id, "org/name", with a revision after "@" where one is pinned ("org/name@v1.0", a commit).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
IGNORED_FILES = ["*.h5", "*.msgpack", "*.onnx", "*.ot", "tf_model*", "flax_model*", "rust_model*", "*.ckpt.index"]


def resolve_model_path(path: str | Path) -> Path:
    """A directory, the name of a shipped model under model/pretrained/, or a Hugging Face hub id in the
    Hugging Face cache (HF_HOME, HF_HUB_CACHE; `beamserve download ID` puts it there)."""
    candidate = Path(path)
    if candidate.is_dir():
        return candidate
    shipped = PRETRAINED_DIR / str(path)
    if shipped.is_dir():
        return shipped
    if HUB_ID.fullmatch(str(path)):
        return hub_snapshot(str(path))
    raise FileNotFoundError(f"no model directory {path!r}; shipped models: {shipped_models() or 'none'}")


def hub_snapshot(name: str, *, download: bool = False) -> Path:
    """The cached snapshot of hub id `name` ("org/model" or "org/model@revision"), fetched first with
    `download` (huggingface_hub's own download: its cache layout, HF_ENDPOINT, HF_TOKEN, progress bars);
    FileNotFoundError where it is not cached and not fetched."""
    repo_id, _, revision = name.partition("@")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - a dependency of beamserve; a broken install says so
        raise FileNotFoundError(f"no model directory {name!r}, and huggingface_hub is not installed") from None
    try:
        found = snapshot_download(
            repo_id, revision=revision or None, local_files_only=not download, ignore_patterns=IGNORED_FILES
        )
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"no model directory {name!r}, and {name} is not in the Hugging Face cache ({HF_HUB_CACHE}): "
            f"`beamserve download {name}` fetches it"
        ) from None
    return Path(found)


def hub_revision(directory: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot directory (.../models--org--name/snapshots/<commit>)."""
    if directory.parent.name == "snapshots" and directory.parent.parent.name.startswith("models--"):
        return directory.name
    return None


def shipped_models() -> list[str]:
    if not PRETRAINED_DIR.is_dir():
        return []
    return sorted(p.name for p in PRETRAINED_DIR.iterdir() if is_own_checkpoint(p))
