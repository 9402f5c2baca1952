"""The shape of `pilot/`: no import cycles, a thin gRPC shell, no needless Kubernetes client.

Imports are read from the source (every `import` and `from ... import`,
including those under TYPE_CHECKING and inside functions): a cycle through a
type-only import is still two modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pilot.security.certs import cert_pem, self_signed_root

PACKAGE = Path(__file__).resolve().parents[2] / "pilot"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for path in PACKAGE.rglob("*.py")
        if "_gen" not in path.relative_to(PACKAGE).parts
    }


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The pilot modules `name` imports (a `from a import b` of a submodule counts as a.b)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imported(name, path, known) for name, path in modules.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_import_walk_sees_real_imports() -> None:
    graph = _graph()
    assert "pilot.push.pipeline" in graph["pilot.server.pushing"]
    assert "pilot.xds.cache" in graph["pilot.push.pipeline"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_pilot() -> None:
    cycle = _find_cycle(_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle or ())}"


def _imports_from(layer: str, forbidden: str) -> list[str]:
    """Every `module -> imported` where a module of `layer` imports one of `forbidden`."""
    return sorted(
        f"{module} -> {imported}"
        for module, imports in _graph().items()
        if module == layer or module.startswith(f"{layer}.")
        for imported in imports
        if imported.startswith(forbidden)
    )


@pytest.mark.parametrize("forbidden", ["pilot.debug", "pilot.sources", "pilot.security"])
def test_the_grpc_shell_imports_none_of_what_uses_it(forbidden: str) -> None:
    assert not (offenders := _imports_from("pilot.server", forbidden)), offenders


@pytest.mark.parametrize("forbidden", ["pilot.generators", "pilot.push", "pilot.server"])
def test_the_builders_are_pure_and_know_no_generator(forbidden: str) -> None:
    """builders/ turns registry values into Envoy resources; it keeps and pushes nothing."""
    assert not (offenders := _imports_from("pilot.builders", forbidden)), offenders


def test_the_grpc_shell_reaches_the_pipeline_through_its_protocol_only() -> None:
    """server/ names `Pushing` (server/pushing.py), never the Pipeline class itself."""
    offenders = sorted(
        module
        for module, path in _modules().items()
        if module.startswith("pilot.server")
        and "pilot.push.pipeline.Pipeline"
        in _imported(module, path, {"pilot.push.pipeline.Pipeline"})
    )
    assert not offenders, offenders


@pytest.mark.parametrize("forbidden", ["pilot.debug", "pilot.server"])
def test_the_pipeline_imports_none_of_what_reads_it(forbidden: str) -> None:
    """The push history is recorded below and read above: push/ never reaches up for it."""
    assert not (offenders := _imports_from("pilot.push", forbidden)), offenders


def test_the_sources_import_nothing_from_security() -> None:
    assert not (offenders := _imports_from("pilot.sources", "pilot.security")), offenders


@pytest.mark.parametrize("forbidden", ["pilot.sources", "pilot.security", "pilot.registry"])
def test_the_kubernetes_client_kit_imports_none_of_its_users(forbidden: str) -> None:
    """pilot/kube is below both sources/ and security/: it knows neither, nor the registry."""
    assert not (offenders := _imports_from("pilot.kube", forbidden)), offenders


def test_importing_the_server_and_the_agent_loads_no_kubernetes_client() -> None:
    check = (
        "import pilot.server.grpc_server, pilot.agent.sds_agent, pilot.cli, sys; "
        "assert not any(m.startswith('kubernetes_asyncio') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)


def _kubernetes_imports(command: list[str], env: dict[str, str], serving: str) -> list[str]:
    """Run `command` until it logs `serving`, then SIGTERM: the kubernetes_asyncio imports
    it made meanwhile (PYTHONVERBOSE writes every import to stderr)."""
    env = env | {"PYTHONVERBOSE": "1"}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if serving in line:
                break
        else:
            pytest.fail(f"{command[3]} ended without serving:\n" + "".join(lines[-20:]))
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)  # drained: a full pipe would hold its exit back
    return [line for line in lines if line.startswith("import 'kubernetes_asyncio")]


def test_a_running_pilot_agent_loads_no_kubernetes_client(tmp_path: Path) -> None:
    root = tmp_path / "root-cert.pem"
    root.write_text(cert_pem(self_signed_root("cluster.local")[1]))
    env = os.environ | {
        "POD_NAMESPACE": "shop",
        "SERVICE_ACCOUNT": "cart",
        "CA_ROOT_CERT": str(root),
    }
    command = [sys.executable, "-m", "pilot", "agent", "--sds-socket", str(tmp_path / "sds.sock")]
    loaded = _kubernetes_imports(command, env, "serving SDS")
    assert not loaded, loaded[:3]


def test_pilot_serving_a_file_loads_no_kubernetes_client(tmp_path: Path) -> None:
    """The Kubernetes client is behind one door (pilot.kubernetes_mode): a file never opens it."""
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text((PACKAGE.parent / "examples" / "mesh.yaml").read_text())
    env = os.environ | {"XDG_STATE_HOME": str(tmp_path / "state")}
    command = [sys.executable, "-m", "pilot", "discovery", "--config", str(mesh)]
    command += ["--grpc-addr", "127.0.0.1:0", "--grpc-tls-addr", "127.0.0.1:0"]
    command += ["--webhook-addr", "127.0.0.1:0"]
    command += ["--http-addr", "127.0.0.1:0"]
    loaded = _kubernetes_imports(command, env, "pilot discovery serving xDS")
    assert not loaded, loaded[:3]
