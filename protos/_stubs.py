"""Generate the Python stubs for our Talos proto subset into protos/gen.

Stubs are build output, not source: they are generated on first import of the
`protos` package (and whenever a .proto, this module or the generator versions
change), so a fresh clone needs only the venv. `python -m protos.build` runs
the same check from the command line.

protoc emits absolute imports named after the proto packages (`import
common.common_pb2`); they are rewritten to live under `protos.gen` so that
generic top-level names like `common` never land on sys.path. The descriptor
file names stay Talos's (`common/common.proto`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

import google.protobuf
import grpclib

ROOT = Path(__file__).resolve().parent
GEN = ROOT / "gen"
STAMP = GEN / ".stamp"
PACKAGES = ("common", "machine", "cluster", "v1alpha1", "definitions")
_PKG = "|".join(PACKAGES)
_FROM_RE = re.compile(rf"^from ({_PKG})([. ])", re.MULTILINE)
_IMPORT_RE = re.compile(rf"^import ({_PKG})\.(\w+)$", re.MULTILINE)


def proto_files() -> list[str]:
    """Proto paths relative to protos/, the include root protoc sees."""
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("*/*.proto"))


def fingerprint() -> str:
    """Everything the output depends on: sources, this script, generator versions."""
    h = hashlib.sha256()
    for rel in proto_files():
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    h.update(Path(__file__).read_bytes())
    # grpc_tools' version file, read rather than imported: importing loads protoc.
    tools = Path(find_spec("grpc_tools").submodule_search_locations[0]) / "grpc_version.py"
    h.update(tools.read_bytes())
    h.update(f"grpclib={grpclib.__version__} protobuf={google.protobuf.__version__}".encode())
    return h.hexdigest()


def is_fresh(expected: str | None = None) -> bool:
    try:
        return STAMP.read_text() == (expected or fingerprint())
    except FileNotFoundError:
        return False


def _rewrite_imports(text: str) -> str:
    text = _FROM_RE.sub(r"from protos.gen.\1\2", text)
    return _IMPORT_RE.sub(r"import protos.gen.\1.\2\nfrom protos.gen import \1", text)


def _generate(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    plugin = out / "protoc-gen-grpclib_python"
    plugin.write_text(f"#!{sys.executable}\nfrom grpclib.plugin.main import main\nmain()\n")
    plugin.chmod(0o755)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
        f"--plugin=protoc-gen-grpclib_python={plugin}",
        f"--python_out={out}",
        f"--grpclib_python_out={out}",
        *proto_files(),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {ROOT}/*/*.proto; its messages are above")
    plugin.unlink()
    for package in PACKAGES:
        (out / package / "__init__.py").touch()
        for module in (out / package).glob("*.py"):
            module.write_text(_rewrite_imports(module.read_text()))


def ensure() -> None:
    """Regenerate the stubs if they are missing or stale; safe across processes."""
    expected = fingerprint()
    if is_fresh(expected):
        return
    GEN.mkdir(exist_ok=True)
    with open(GEN / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fresh(expected):
            return
        with tempfile.TemporaryDirectory(dir=GEN, prefix=".build-") as tmp:
            _generate(Path(tmp))
            for package in PACKAGES:
                shutil.rmtree(GEN / package, ignore_errors=True)
                os.rename(Path(tmp) / package, GEN / package)
        (GEN / "__init__.py").write_text('"""Generated Talos API stubs; see protos/_stubs.py."""\n')
        STAMP.write_text(expected)
