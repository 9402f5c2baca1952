"""Compile protos/ into pilot/_gen with grpcio-tools (run after editing a .proto).

    python tools/generate_protos.py [OUTPUT_DIR]

Generated modules import each other by proto package (`istio.v1.auth`); they are
rewritten to import from `pilot._gen` so that they live inside the package.
tests/unit/test_generated_code.py fails when the committed output is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
DEFAULT_OUTPUT = ROOT / "pilot" / "_gen"
_IMPORT = re.compile(r"^from (istio\.[\w.]+) import", re.MULTILINE)


def generate(output: Path) -> list[Path]:
    """Generate every .proto under protos/ into `output`; returns the files written."""
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    output.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={output}",
        f"--pyi_out={output}",
        f"--grpc_python_out={output}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = sorted(p for p in output.rglob("*.py*") if p.suffix in (".py", ".pyi"))
    for path in written:
        text = _IMPORT.sub(r"from pilot._gen.\1 import", path.read_text())
        path.write_text(text)
    for directory in _package_dirs(output, written):
        init = directory / "__init__.py"
        if not init.exists():
            init.write_text("")
            written.append(init)
    return sorted(written)


def _package_dirs(output: Path, files: list[Path]) -> set[Path]:
    """Every directory from `output` down to each generated file (all need __init__.py)."""
    found = {output}
    for path in files:
        for parent in path.parents:
            if parent == output or output not in parent.parents:
                break
            found.add(parent)
    return found


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    for path in generate(target):
        print(path)
