"""Pin pilot's dependencies: what the image and CI install, exactly.

    python tools/lock_requirements.py

Resolves pyproject.toml afresh in a new virtual environment, as pip would for a
user, and writes what it installed (`pip freeze`) under requirements/:
- build.txt: the build backend (`[build-system] requires`), so that building
  pilot's own wheel in the image downloads nothing;
- runtime.txt: pilot's dependencies, the image's dependency layer;
- test.txt: those plus the `test` extra, resolved under the runtime pins so that
  the files never disagree; `.ci/run` installs the test extra constrained by it.
Run it after changing a dependency in pyproject.toml, and commit the three files.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "requirements"
_NAME = re.compile(r"[A-Za-z0-9._-]+")  # a requirement's project name
HEADER = (
    "# Pinned by `python tools/lock_requirements.py` from pyproject.toml ({what}); do not edit.\n"
)


def _pip(python: Path, *args: str) -> str:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return result.stdout


def _frozen(python: Path) -> str:
    """What the environment holds, pilot itself left out (it is installed from source)."""
    lines = _pip(python, "freeze", "--all", "--exclude", "pilot").splitlines()
    kept = [line for line in lines if not line.startswith(("pip==", "setuptools==", "wheel=="))]
    return "".join(f"{line}\n" for line in sorted(kept, key=str.lower))


def _build_requires() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(project["build-system"]["requires"])


def _pinned(python: Path, names: list[str]) -> str:
    """`name==version` of each requirement as installed."""
    wanted = {_NAME.match(name)[0].lower() for name in names}  # type: ignore[index]
    lines = _pip(python, "freeze", "--all").splitlines()
    return "".join(f"{line}\n" for line in lines if line.split("==")[0].lower() in wanted)


def lock(output: Path = OUTPUT) -> tuple[Path, ...]:
    """Resolve and write the three files; returns their paths."""
    output.mkdir(parents=True, exist_ok=True)
    build, runtime, test = (output / f"{n}.txt" for n in ("build", "runtime", "test"))
    with tempfile.TemporaryDirectory() as scratch:
        environment = Path(scratch) / "venv"
        venv.create(environment, with_pip=True)
        python = environment / "bin" / "python"
        requires = _build_requires()
        _pip(python, "install", "--quiet", "--upgrade", *requires)
        build.write_text(HEADER.format(what="build-system") + _pinned(python, requires))
        _pip(python, "install", "--quiet", ".")
        runtime.write_text(HEADER.format(what="dependencies") + _frozen(python))
        _pip(python, "install", "--quiet", "--constraint", str(runtime), ".[test]")
        test.write_text(HEADER.format(what="dependencies and the test extra") + _frozen(python))
    return build, runtime, test


def main() -> int:
    for path in lock():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
