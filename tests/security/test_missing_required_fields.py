"""Objects without a field Kubernetes requires, given to a real `pilot discovery`.

- Registry file (`--config`): a Service without `spec.ports` is one ERROR line naming
  the file, the item, `Service namespace/name` and the field; the version is refused
  as any bad object's is (counted in `pilot_registry_file_rejected_total{reason=
  "invalid"}`), and the last good registry keeps serving. (It loaded as a service
  with no port, without a word.)
- Test API server (tests/kubeapi, standing in for any cluster, a remote one too):
  Services without `spec` or `spec.ports` are each counted in
  `pilot_k8s_rejected_total{reason="missing_field"}` and skipped; the line naming
  the first is one printable line even when the name carries a newline and ANSI
  escapes; the other Services still load; two thousand such Services leave the log
  bounded (a line per informer per 10 s, with a count), the counter exact, and
  `/ready` 200.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from tests.support.ca import write_plugged_in
from tests.support.envoy_process import wait_until
from tests.support.kube_helpers import apply_mesh, kube_api, ready
from tests.support.mesh import cluster_name, service, simple_mesh, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca, start_pilot
from tests.support.xds_client import XdsClient, sotw_names

WAIT = 20.0
LOCAL = "Kubernetes"  # pilot's default --cluster-id
MANY = 2000
WHY = "(a Service needs ports unless clusterIP is None or type is ExternalName)"


async def _metric(pilot: PilotProcess, sample: str) -> float | None:
    _status, body = await pilot.get("/metrics")
    for line in str(body).splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return None


async def _clusters(pilot: PilotProcess) -> list[str]:
    async with XdsClient(pilot.target(tls=False)) as client:
        return sorted(sotw_names(await client.fetch_clusters()))


def _portless(name: str, *, spec: bool) -> dict[str, Any]:
    obj = service(name)
    if spec:
        del obj["spec"]["ports"]
    else:
        del obj["spec"]
    return obj


async def test_a_service_without_ports_in_the_file_is_one_line_and_keeps_the_last_state(
    tmp_path: Path,
) -> None:
    config = tmp_path / "mesh.yaml"
    mesh = simple_mesh({"web": ["10.1.0.1"]})
    write_mesh(config, mesh)
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    try:
        assert await _clusters(pilot) == [cluster_name("web")]
        mark = pilot.mark()
        write_mesh(config, [*mesh, _portless("cart", spec=True)])
        words = f"{config}: document 1 item 2: Service default/cart: spec.ports is missing {WHY}"
        (line,) = await pilot.wait_logged(lambda e: words in e["msg"], words, mark, WAIT)
        assert line["level"].upper() == "ERROR" and line["msg"].endswith(
            "; keeping the last good registry"
        ), line
        assert await _metric(pilot, 'pilot_registry_file_rejected_total{reason="invalid"}') == 1
        assert await _clusters(pilot) == [cluster_name("web")]
        assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
    finally:
        await pilot.stop()


def _rejected_lines(pilot: PilotProcess, since: int = 0) -> list[str]:
    return [
        e["msg"] for e in pilot.logged(lambda e: "Service: the API server sent" in e["msg"], since)
    ]


async def test_services_without_ports_or_spec_from_the_api_server(tmp_path: Path) -> None:
    async with kube_api(tmp_path / "api") as (srv, kubeconfig):
        apply_mesh(srv, {"alpha": ready("127.0.1.1")})
        hostile = "evil\nERROR forged line \x1b[31mred\x1b[0m"
        srv.create(_portless(hostile, spec=False))
        srv.create(_portless("noports", spec=True))
        ca = write_plugged_in(tmp_path / "plugged-in-ca")
        pilot = await start_pilot(tmp_path, kubeconfig, ca.directory, ca.root.cert_pem.encode())
        try:
            sample = (
                f'pilot_k8s_rejected_total{{cluster_id="{LOCAL}",kind="Service",'
                'reason="missing_field"}'
            )
            assert await _metric(pilot, sample) == 2
            assert await _clusters(pilot) == [cluster_name("alpha")]
            [first] = _rejected_lines(pilot)
            assert first.isprintable(), repr(first)
            # (The test API server, as kube-apiserver, writes an empty spec: `spec.ports`.)
            label = "Service default/evil?ERROR forged line ?[31mred?[0m: "
            assert re.search(re.escape(label) + r"spec(\.ports)? is missing", first), first

            srv.apply(service("beta"))
            started = time.monotonic()
            for i in range(MANY):
                srv.create(_portless(f"broken-{i}", spec=i % 2 == 0))

            async def counted() -> float | None:
                return await _metric(pilot, sample)

            await wait_until(counted, WAIT, f"{MANY + 2} counted", until=lambda n: n == MANY + 2)
            beta = cluster_name("beta")
            await wait_until(lambda: _clusters(pilot), WAIT, "beta", until=lambda c: beta in c)
            assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
            lines = _rejected_lines(pilot)
            # At most a line per informer per 10 s (LOG_EVERY), however many objects.
            assert len(lines) <= 2 + (time.monotonic() - started) // 10, lines
            assert all(re.search(r"is missing", line) for line in lines), lines
        finally:
            await pilot.stop()
