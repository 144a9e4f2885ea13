"""Imports point down (DESIGN §3), read from the source: the core library `kontinuum/` imports
no Pulumi, no component and no provider (so `python -m kontinuum` and the core's tests run
without an engine), and no package has an import circle. Every import counts, wherever it is
written: inside a function or under TYPE_CHECKING a circle is still a circle."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kontinuum", "kontinuum_components", "providers", "lab", "bench")
NOT_IN_CORE = ("pulumi", "pulumi_kubernetes", "kontinuum_components", "providers")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of a module, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from pkg import mod` imports pkg.mod; `from mod import name` imports mod
            found += [(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, node.lineno) for a in node.names]
    return found


def _ours(module: str) -> str | None:
    """The module of ours an import resolves to (`a.b.C` → `a.b`), None for third-party ones."""
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


def test_the_core_library_imports_no_pulumi_components_or_providers():
    wrong = [f"{path.relative_to(ROOT)}:{line}: imports {imported}"
             for name, path in MODULES.items() if name.split(".")[0] == "kontinuum"
             for imported, line in _imports(name, path) if imported.split(".")[0] in NOT_IN_CORE]
    assert not wrong, "kontinuum/ is the core library (DESIGN §3):\n" + "\n".join(wrong)


def test_no_package_has_an_import_circle():
    graph = {name: {m for imported, _ in _imports(name, path) if (m := _ours(imported)) and m != name}
             for name, path in MODULES.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import circle: {' -> '.join(reversed(e.args[1]))}; put what they share in a module "
                             "below them, or hand the dependency in") from None


def test_the_program_loads_no_cluster_client():
    """Every `pulumi up` and preview starts the program, and the program only registers resources:
    the Kubernetes client and the Talos gRPC client (0.5 CPU-s a start together) load in the
    dynamic-provider host, where a create or update calls them."""
    code = ("import sys;"
            "import kontinuum_components.zone, kontinuum.stackconfig.validation, providers.region_guard;"
            "print(' '.join(x for x in ('kubernetes', 'kontinuum.talos.client') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the program's modules load {out.stdout.strip()}: import it where it is called"
