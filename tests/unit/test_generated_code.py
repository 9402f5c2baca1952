"""The generated code in pilot/_gen is what tools/generate_protos.py makes from protos/ now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pilot._gen.istio.v1.auth import ca_pb2

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location(
        "generate_protos", ROOT / "tools/generate_protos.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    fresh = {p.relative_to(tmp_path): p.read_text() for p in _generator().generate(tmp_path)}  # type: ignore[attr-defined]
    committed_dir = ROOT / "pilot" / "_gen"
    committed = {
        p.relative_to(committed_dir): p.read_text()
        for p in committed_dir.rglob("*")
        if p.suffix in (".py", ".pyi")
    }
    assert fresh.keys() == committed.keys(), "run: python tools/generate_protos.py"
    stale = [str(name) for name, text in fresh.items() if committed[name] != text]
    assert not stale, f"stale generated code {stale}: run python tools/generate_protos.py"


def test_ca_api_keeps_istios_wire_names() -> None:
    service = ca_pb2.DESCRIPTOR.services_by_name["IstioCertificateService"]
    assert service.full_name == "istio.v1.auth.IstioCertificateService"
    method = service.methods_by_name["CreateCertificate"]
    assert method.input_type.full_name == "istio.v1.auth.IstioCertificateRequest"
    fields = {f.name: f.number for f in method.input_type.fields}
    assert fields == {"csr": 1, "validity_duration": 3, "metadata": 4}
    assert {f.name: f.number for f in method.output_type.fields} == {"cert_chain": 1}
