"""The codebase's own rules, read from its source: model/ never imports the service or Ray, and no
module imports another module's private name (a private helper is one module's business)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from module import name` and ("module", "") of every `import module`."""
    out: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names]
    return out


def test_model_never_imports_the_service_or_ray() -> None:
    bad = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in modules("model")
        for module, _ in imports(path)
        if module.split(".")[0] in ("service", "ray")
    ]
    assert not bad


def test_no_module_imports_another_modules_private_name() -> None:
    bad = [
        f"{path.relative_to(ROOT)}: {module}.{name}"
        for package in ("model", "service")
        for path in modules(package)
        for module, name in imports(path)
        if name.startswith("_") and not name.startswith("__") and module.split(".")[0] in ("model", "service")
    ]
    assert not bad
