"""Hostile localityLbSettings in the registry file of a real `pilot discovery`.

One file holds an honest DestinationRule (`distribute` 80/20) for `good` and, each for
a service of its own, rules whose localityLbSetting is hostile: weights summing to 99,
a `to` of 100,000 localities, a `*` in the middle, a locality with a newline, one with
a NUL, a 64 KiB locality, and `failoverPriority`. Each hostile rule is one warning line
naming it (no raw newline or NUL reaches the log, no 64 KiB line), the refusals are
counted (`pilot_config_rejected_total`), /ready answers, and the honest rule applies:
a sidecar gets `good`'s weights. Then the honest rule's version with weights summing
to 101 is refused too and its last good weights keep serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.xds import types
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, service, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

TIMEOUT = 30.0
GOOD = "outbound|80||good.default.svc.cluster.local"
ZONES = {"10.50.0.1": "zone-a", "10.50.0.2": "zone-b"}


def _distribute(to: Any, source: Any = "*") -> dict[str, Any]:
    return {"loadBalancer": {"localityLbSetting": {"distribute": [{"from": source, "to": to}]}}}


HOSTILE: dict[str, dict[str, Any]] = {
    "sum99": _distribute({"Kubernetes/zone-a": 80, "Kubernetes/zone-b": 19}),
    "wide": _distribute({f"r{i}": 1 for i in range(100_000)}),
    "middle": _distribute({"Kubernetes/*/zone-a": 100}),
    "newline": _distribute({"Kubernetes/zone-a": 100}, "Kubernetes\nFORGED warning"),
    "nul": _distribute({"Kubernetes/zone\x00a": 100}),
    "long": _distribute({"Kubernetes/" + "z" * 65_536: 100}),
    "priority": {
        "outlierDetection": {"consecutive5xxErrors": 1},
        "loadBalancer": {"localityLbSetting": {"failoverPriority": ["topology.istio.io/network"]}},
    },
}


def _rule(name: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"host": name, "trafficPolicy": policy},
    }


def _mesh(good_weights: dict[str, int]) -> list[dict[str, Any]]:
    endpoints = [Ep(ip, zone=zone) for ip, zone in ZONES.items()]
    objects: list[dict[str, Any]] = []
    for name in ("good", *HOSTILE):
        objects += [service(name), endpoint_slice(name, endpoints, name=f"{name}-1")]
    good = {f"Kubernetes/{zone}": weight for zone, weight in good_weights.items()}
    return [
        *objects,
        _rule("good", _distribute(good)),
        *(_rule(name, policy) for name, policy in HOSTILE.items()),
    ]


async def _weights(stream: DeltaStream) -> dict[str, int]:
    response = await stream.next_response(TIMEOUT)
    await stream.ack(response)
    assignment: endpoint_pb2.ClusterLoadAssignment = delta_resources(response)[GOOD].message
    return {g.locality.zone: g.load_balancing_weight.value for g in assignment.endpoints}


async def _rejected(pilot: PilotProcess) -> float:
    _, metrics = await pilot.get("/metrics")
    for line in str(metrics).splitlines():
        if line.startswith('pilot_config_rejected_total{kind="DestinationRule"}'):
            return float(line.rpartition(" ")[2])
    return 0.0


async def test_hostile_locality_settings_are_refused_one_line_each(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, _mesh({"zone-a": 80, "zone-b": 20}))
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    try:
        warned = await pilot.wait_logged(
            lambda e: "DestinationRule default/priority" in e["msg"], "the refusals", within=TIMEOUT
        )
        lines = pilot.logged(lambda e: "DestinationRule default/" in e["msg"])
        refused = {name for name in HOSTILE if any(f"default/{name}:" in e["msg"] for e in lines)}
        assert refused == set(HOSTILE), [pilot.shown(e) for e in lines]
        assert len(lines) == len(HOSTILE), "one line each"
        assert all("\n" not in e["msg"] and "\x00" not in e["msg"] for e in lines)
        assert all(int(e["size"]) < 1000 for e in lines), "no 64 KiB line"
        assert not pilot.logged(lambda e: e["msg"].startswith("FORGED"))
        assert "failoverPriority is not supported" in warned[0]["msg"]
        assert await _rejected(pilot) == len(HOSTILE)
        assert (await pilot.get("/ready"))[0] == 200

        async with XdsClient(pilot.target(tls=False)) as client:
            located = node("sidecar~10.50.1.1~c.default~default.svc.cluster.local")
            located.locality.region, located.locality.zone = "Kubernetes", "zone-a"
            stream = client.delta_ads(located)
            await stream.subscribe(types.ENDPOINT, [GOOD])
            assert await _weights(stream) == {"zone-a": 80, "zone-b": 20}

            # Each version of the file counts its refusals: the hostile ones again, and good.
            write_mesh(config, _mesh({"zone-a": 80, "zone-b": 21}))
            await wait_until(
                lambda: _rejected(pilot), TIMEOUT, "good's refusal",
                until=lambda n: n == 2 * len(HOSTILE) + 1,
            )  # fmt: skip
            write_mesh(config, _mesh({"zone-a": 70, "zone-b": 30}))
            assert await _weights(stream) == {"zone-a": 70, "zone-b": 30}, "the next good one"
    finally:
        await pilot.stop()
