"""The codebase's own rules, read from its source: model/ and service/ as floors that import only
downwards with no import cycle, model/ never importing the service or Ray, no module importing another
module's private name (a private helper is one module's business), every declared
runtime dependency is used, every benchmark report names the commit it measured, and the GPU stage
imports nothing the GPU machines lack."""

from __future__ import annotations

import ast
import re
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


# The floors of model/ and service/, lowest first. A unit (a package, or a module at a package's top) imports
# modules of its own unit and of units on lower floors, never of its own floor's other units or above.
FLOORS: list[set[str]] = [
    {"model.errors", "model.options", "model.shipped"},
    {"model.kernels"},
    {"model.nn"},
    {"model.decode", "model.io"},
    {"model.workers", "model.plan", "model.forced"},
    {"model.translator"},
    {"model", "model.train"},
    {
        "service",
        "service.error_codes",
        "service.request_log",
        "service.metrics",
        "service.local_ray",
        "service.batching",
    },
    {"service.errors", "service.schemas"},
    {"service.text"},
    {"service.registry"},
    {"service.settings"},
    {"service.tracing"},
    {"service.engine", "service.store"},
    {"service.routing"},
    {"service.api"},
    {"service.app", "service.metrics_relay"},
    {"service.runtime"},
    {"service.cli"},
]


def module_graph() -> dict[str, set[str]]:
    """Each module of model/ and service/ -> the modules of model/ and service/ it imports anywhere in its
    file: at its top, in a function, under TYPE_CHECKING (each is a dependency the design must allow)."""
    names = {}
    for path in modules("model") + modules("service"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found = set()
        for module, imported in imports(path):
            for candidate in (f"{module}.{imported}", module):  # `from package import module`, or a name's module
                if candidate in names:
                    found.add(candidate)
                    break
        graph[name] = found - {name}
    return graph


def unit(module: str) -> str:
    """The floor unit of a module: its subpackage (model.nn, service.api), or itself at a package's top."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_imports_point_only_down_the_floors() -> None:
    floor = {u: i for i, units in enumerate(FLOORS) for u in units}
    graph = module_graph()
    assert {unit(m) for m in graph} == set(floor), "every unit on one floor"
    bad = [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if unit(a) != unit(b) and floor[unit(b)] >= floor[unit(a)]
    ]
    assert not bad


def test_no_import_cycle_between_modules() -> None:
    graph = module_graph()
    cycles = []
    for start in graph:  # a module that reaches itself
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m == start:
                cycles.append(start)
                break
            if m not in seen:
                seen.add(m)
                todo += graph[m]
    assert not cycles


def classes(package: str) -> dict[str, tuple[str, int, list[str]]]:
    """Each class of a package by name: where it is, its lines, and the names of its bases."""
    found: dict[str, tuple[str, int, list[str]]] = {}
    for path in modules(package):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                bases = [
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute))
                ]
                found[node.name] = (str(path.relative_to(ROOT)), node.end_lineno - node.lineno + 1, bases)
    return found


def with_bases(name: str, known: dict[str, tuple[str, int, list[str]]]) -> int:
    """A class's lines with those of its bases that the package defines (a class in effect is all of them)."""
    _, lines, bases = known[name]
    return lines + sum(with_bases(b, known) for b in bases if b in known and b != name)


def test_no_class_in_model_is_over_250_lines_counting_its_bases() -> None:
    """A class past a screenful or four holds several concerns; split it (Seq2Seq's C step, the translator's
    forced targets, the in-flight batch's row moves) rather than let it grow, and not by inheritance."""
    known = classes("model")
    long = [f"{known[n][0]}: {n} ({with_bases(n, known)} lines)" for n in known if with_bases(n, known) > 250]
    assert not long


def test_no_class_in_the_service_is_over_250_lines() -> None:
    """The service's classes by their own lines (the router's pieces, the ingress's route families)."""
    known = classes("service")
    long = [f"{path}: {name} ({lines} lines)" for name, (path, lines, _) in known.items() if lines > 250]
    assert not long


def test_no_function_in_model_or_the_service_is_over_80_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for package in ("model", "service")
        for path in modules(package)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long


# What a benchmark compares against and says to install itself (bench_splitter.py: pip install pysbd sentencex).
BENCHMARK_EXTRAS = {"pysbd", "sentencex"}


def test_every_import_of_a_benchmark_names_a_module_that_exists() -> None:
    """A benchmark is run by hand, not by the tests: one that imports a script since removed would fail
    only when someone needs it."""
    import importlib.util
    import sys

    sys.path.insert(0, str(ROOT / "loadtests"))
    try:
        missing = [
            f"{path.relative_to(ROOT)}: {module}"
            for path in modules("loadtests")
            for module, _ in imports(path)
            if module.split(".")[0] not in BENCHMARK_EXTRAS and importlib.util.find_spec(module.split(".")[0]) is None
        ]
    finally:
        sys.path.remove(str(ROOT / "loadtests"))
    assert not missing


def test_model_never_imports_the_service_or_ray() -> None:
    bad = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in modules("model")
        for module, _ in imports(path)
        if module.split(".")[0] in ("service", "ray")
    ]
    assert not bad


# What answers "which kernel runs": the library's capability predicates, oneDNN's presence, and the modules that
# choose a GEMM by shape, type and CPU. model/nn and model/decode compute with the plan they are handed
# (model/kernels/execution.py) and the structs model/kernels/c_linears.py makes, and never ask these.
KERNEL_QUESTIONS = {
    "native": {
        "built", "available", "multiplies_int8", "runs_on", "quantizes", "scales_back", "vnni", "vnni_isa", "amx",
        "f32", "layer_norms_exactly", "silu_exactly", "in_use", "turn_off",
    },
    "onednn": {"LINEAR"},
}  # fmt: skip
CHOOSING = {"model.kernels.int8_choice", "model.kernels.f32_gemm", "model.kernels.compute_type", "model.kernels.cpus"}


def kernel_questions(path: Path) -> list[str]:
    """Where a module asks which kernel runs: a predicate of KERNEL_QUESTIONS read off its module, imported by
    name, or a CHOOSING module imported."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in KERNEL_QUESTIONS.get(node.value.id, ()):
                found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                short = node.module.removeprefix("model.kernels.")
                if node.module in CHOOSING or whole in CHOOSING or alias.name in KERNEL_QUESTIONS.get(short, ()):
                    found.append(f"import {whole} (line {node.lineno})")
    return sorted(found, key=lambda f: (int(f.rsplit(" ", 1)[1].rstrip(")")), f))


def test_model_nn_and_decode_never_ask_which_kernel_runs() -> None:
    bad = [
        f"{path.relative_to(ROOT)}: {question}"
        for package in ("model/nn", "model/decode")
        for path in modules(package)
        for question in kernel_questions(path)
    ]
    assert not bad


def test_the_kernel_question_finder_finds_each_form_of_the_question(tmp_path: Path) -> None:
    asking = tmp_path / "asking.py"
    asking.write_text(
        "from model.kernels import native, f32_gemm\nfrom model.kernels.native import silu_exactly\n"
        "from model.kernels.int8_choice import kernel_at\nif native.runs_on(x) and onednn.LINEAR:\n    pass\n"
    )
    assert kernel_questions(asking) == [
        "import model.kernels.f32_gemm (line 1)",
        "import model.kernels.native.silu_exactly (line 2)",
        "import model.kernels.int8_choice.kernel_at (line 3)",
        "native.runs_on (line 4)",
        "onednn.LINEAR (line 4)",
    ]


def test_no_module_imports_another_modules_private_name() -> None:
    bad = [
        f"{path.relative_to(ROOT)}: {module}.{name}"
        for package in ("model", "service")
        for path in modules(package)
        for module, name in imports(path)
        if name.startswith("_") and not name.startswith("__") and module.split(".")[0] in ("model", "service")
    ]
    assert not bad


def test_the_design_map_names_every_module_once_and_nothing_else() -> None:
    """docs/design.md's Layout lists each module of model/ and service/ once, under its package, by its path
    inside it (nn/config.py), and names no module that is not there."""
    import re

    text = (ROOT / "docs" / "design.md").read_text()
    block = text[text.index("## Layout") :]
    block = block[: block.index("```", block.index("```") + 3)]
    service_at = block.index("\nservice/")
    for package, section in (("model", block[:service_at]), ("service", block[service_at:])):
        named = re.findall(r"(?<![\w/])((?:[a-z_]+/)?[a-z_0-9]+\.py)\b", section)
        files = sorted(
            str(p.relative_to(ROOT / package)) for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"
        )
        assert sorted(set(named)) == files, package
        assert len(named) == len(set(named)), (
            f"{package}: named twice: {sorted(n for n in named if named.count(n) > 1)}"
        )


def test_every_path_the_docs_name_exists() -> None:
    """A file or folder of the repository named in README.md or docs/ is there."""
    import re

    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(
            r"(?<![\w./-])((?:model|service|deploy|loadtests|tests|docs)/[\w./-]*[\w/])", doc.read_text()
        ):
            path = m.group(1).rstrip("/")
            if "*" not in path and not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing


# Runtime dependencies the code uses without importing them, and how.
USED_UNIMPORTED = {
    "numpy": "torch's Tensor.numpy() (the model digest, model/translator.py)",
    "python-multipart": "FastAPI's form and file parsing (LibreTranslate's form-encoded routes)",
    "fastapi-offline": "Swagger UI's files for /docs, read as package data (service/api/api_docs.py)",
}


def distributions(module: str, by_module: dict[str, list[str]]) -> list[str]:
    """The distributions a dotted module comes from: its top-level package's, or, where several share it
    (a namespace package: opentelemetry), the one whose files hold the module."""
    import importlib.metadata

    top = module.split(".")[0]
    found = by_module.get(top, [top])
    if len(found) == 1:
        return found
    path = module.replace(".", "/")
    return [
        name
        for name in found
        if any(str(f).startswith((f"{path}/", f"{path}.py")) for f in importlib.metadata.files(name) or [])
    ] or found


def test_the_declared_runtime_dependencies_are_the_ones_used() -> None:
    """pyproject.toml's dependencies and `serve` extra: each imported by model/ or service/ (or listed in
    USED_UNIMPORTED with the way it is used), and every package they import declared."""
    import importlib.metadata
    import sys
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["serve"]
    declared = [Requirement(spec).name.lower() for spec in specs]
    imported = {m for p in ("model", "service") for path in modules(p) for m, _ in imports(path)}
    third_party = {m for m in imported if m.split(".")[0] not in {*sys.stdlib_module_names, "model", "service"}}
    by_module = importlib.metadata.packages_distributions()
    used = {dist.lower() for module in third_party for dist in distributions(module, by_module)}
    unused = [d for d in declared if d not in used and d not in USED_UNIMPORTED]
    assert not unused, f"declared, never used: {unused}"
    undeclared = used - set(declared) - set(WITH_TORCH_CUDA)
    assert not undeclared, f"imported, not declared: {sorted(undeclared)}"
    assert not set(USED_UNIMPORTED) - set(declared)


# Imported by model/ only on a GPU, where torch's CUDA build installs it (the dev extra has it for the tests).
WITH_TORCH_CUDA = {"triton": "model/kernels/triton_step.py, the GPU step's kernels"}


# What the lent GPU machines' image lacks that the service uses; the GPU stage's parts run without them.
GPU_IMAGE_LACKS = ("ray", "opentelemetry", "fastapi", "starlette", "uvicorn", "ctranslate2")
GPU_STAGE_SCRIPTS = ("bench_decode.py", "bench_batching.py", "profile_decode.py", "replica_memory.py")


def test_the_gpu_stage_imports_nothing_the_gpu_image_lacks() -> None:
    """loadtests/gpu_run.sh runs on a machine with torch and no Ray, OpenTelemetry or FastAPI: its scripts
    and the CUDA tests must import without them (the engine, not Serve), or the stage's one call of the GPU
    machine is spent on an ImportError."""
    import subprocess
    import sys

    block = f"""
import runpy, sys
class Lacks:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {GPU_IMAGE_LACKS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Lacks())
sys.path[:0] = [".", "loadtests"]  # as gpu_run.sh's PYTHONPATH and `python loadtests/x.py` have them
"""
    scripts = "".join(
        f"""
sys.argv = ["{name}", "--help"]
try:
    runpy.run_path("loadtests/{name}", run_name="__main__")
except SystemExit as e:
    assert e.code == 0, "{name}"
"""
        for name in GPU_STAGE_SCRIPTS
    )
    collect = """
import pytest
cuda = ["tests/test_cuda.py", "tests/test_slots.py", "tests/test_engine.py", "tests/test_triton.py"]
cuda.append("tests/test_step_budget.py")
sys.exit(pytest.main(["-q", "--co", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "cuda or triton", *cuda]))
"""
    for code in (block + scripts, block + collect):
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


# GPU runs whose reports name no commit: running them again needs a GPU (make gpu-wheels, loadtests/gpu_run.sh).
UNSTAMPED_GPU_REPORTS = {"batching_gpu.md", "batching_gpu_cpu_sizes.md"}


def test_every_report_names_the_commit_it_measured() -> None:
    """A figure in the docs comes from a report that says which code it measured: a commit, never
    'uncommitted changes'."""
    reports = {r.name: r.read_text() for r in sorted((ROOT / "loadtests" / "results").glob("*.md"))}
    dirty = [name for name, text in reports.items() if "uncommitted changes" in text]
    unnamed = [
        name
        for name, text in reports.items()
        if name not in UNSTAMPED_GPU_REPORTS and not re.search(r"\b[Cc]ommit:? [0-9a-f]{7}", text)
    ]
    assert not dirty, f"reports of uncommitted code: {dirty}"
    assert not unnamed, f"reports that name no commit: {unnamed}"


def test_the_loadtests_readme_names_every_script_and_every_report() -> None:
    """loadtests/README.md's tables say what each script asks and where its reports are: every script and
    helper in one row, and every report in results/ under a script (by name or by a `name*.md` pattern)."""
    readme = (ROOT / "loadtests" / "README.md").read_text()
    named = set(re.findall(r"`([\w*]+\.(?:py|sh|md))`", readme))
    scripts = {p.name for p in (ROOT / "loadtests").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts - named == set(), f"scripts loadtests/README.md does not name: {sorted(scripts - named)}"
    assert {n for n in named if n.endswith((".py", ".sh"))} - scripts == set(), "README names scripts that are gone"
    patterns = [re.compile(re.escape(n).replace(r"\*", ".*") + "$") for n in named if n.endswith(".md")]
    reports = [r.name for r in (ROOT / "loadtests" / "results").glob("*.md")]
    unlisted = [r for r in reports if not any(p.match(r) for p in patterns)]
    assert not unlisted, f"reports under no script in loadtests/README.md: {unlisted}"


def test_make_serve_installs_what_serving_needs_and_no_test_or_benchmark_tool() -> None:
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serving = {Requirement(s).name.lower() for s in project["dependencies"] + project["optional-dependencies"]["serve"]}
    tools = {"pytest", "transformers", "ctranslate2", "locust", "selenium", "schemathesis", "matplotlib", "py-spy"}
    assert not serving & tools, serving & tools
    makefile = (ROOT / "Makefile").read_text()
    assert "\nserve: $(VENV)/.serving\n" in makefile
    recipe = makefile.split("\n$(VENV)/.serving:", 1)[1].split("\n\n", 1)[0]
    assert "$(call install_extra,serve)" in recipe
