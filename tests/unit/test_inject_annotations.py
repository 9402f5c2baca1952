"""The annotations the template honours, honest beside hostile: every value that
reaches the init container's iptables arguments, the proxy's resources or its env is
checked, and a bad one is refused naming the annotation (allowed: false), never
passed on."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.support.inject_pods import app_pod

SETTINGS = InjectSettings()
TRAFFIC = "traffic.sidecar.istio.io/"


def _injected(annotations: dict[str, str]) -> dict[str, Any]:
    return inject(app_pod(annotations=annotations), SETTINGS, namespace="shop")


def _init_args(annotations: dict[str, str]) -> list[str]:
    return list(_injected(annotations)["spec"]["initContainers"][0]["args"])


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize(
    ("annotation", "value", "flag", "expected"),
    [
        ("includeInboundPorts", "8080, 9090", "-b", "8080,9090"),
        ("includeInboundPorts", "*", "-b", "*"),
        ("includeInboundPorts", "", "-b", ""),
        # Istio's order: Envoy's ports, the annotation's, the status port last.
        ("excludeInboundPorts", "9100", "-d", "15090,15021,9100,15020"),
        ("excludeInboundPorts", "9100, 9200", "-d", "15090,15021,9100,9200,15020"),
        # The status port named by the annotation is not named twice (as Istio).
        ("excludeInboundPorts", "15020,9100", "-d", "15090,15021,15020,9100"),
        ("excludeInboundPorts", "", "-d", "15090,15021,15020"),
        ("includeOutboundPorts", "443,8443", "-q", "443,8443"),
        ("excludeOutboundPorts", "5432", "-o", "5432"),
        ("includeOutboundIPRanges", "10.0.0.0/8,fd00::/8", "-i", "10.0.0.0/8,fd00::/8"),
        ("includeOutboundIPRanges", "10.1.2.3/16", "-i", "10.1.0.0/16"),
        ("includeOutboundIPRanges", "", "-i", ""),
        ("excludeOutboundIPRanges", "169.254.169.254/32", "-x", "169.254.169.254/32"),
    ],
)
def test_traffic_annotations_reach_istio_init_normalised(
    annotation: str, value: str, flag: str, expected: str
) -> None:
    assert _flag(_init_args({TRAFFIC + annotation: value}), flag) == expected


def test_outbound_port_flags_appear_only_when_asked() -> None:
    args = _init_args({})
    assert "-q" not in args
    assert "-o" not in args


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("includeInboundPorts", "80; rm -rf /"),
        ("includeInboundPorts", "0"),
        ("includeInboundPorts", "65536"),
        ("includeInboundPorts", "-1"),
        ("includeInboundPorts", "8080,*"),
        ("excludeInboundPorts", "*"),
        ("excludeInboundPorts", "15020\n-A INPUT -j ACCEPT"),
        ("includeOutboundPorts", "٨٠"),  # Arabic-Indic digits: int() reads them, iptables not
        ("excludeOutboundPorts", "1,,2"),
        ("excludeOutboundPorts", "8" * 10_000),
        ("includeOutboundIPRanges", "10.0.0.1"),
        ("includeOutboundIPRanges", "10.0.0.0/33"),
        ("includeOutboundIPRanges", "example.com/8"),
        ("excludeOutboundIPRanges", "*,10.0.0.0/8"),
        ("excludeOutboundIPRanges", "10.0.0.0/8 ! -d 1.2.3.4"),
    ],
)
def test_hostile_traffic_values_are_refused_naming_the_annotation(
    annotation: str, value: str
) -> None:
    with pytest.raises(InjectError, match=f"annotation {TRAFFIC}{annotation}: ") as refused:
        _injected({TRAFFIC + annotation: value})
    assert "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200


def test_resource_annotations_replace_the_default_with_what_is_asked() -> None:
    injected = _injected({"sidecar.istio.io/proxyCPU": "250m",
                          "sidecar.istio.io/proxyMemoryLimit": "1Gi"})  # fmt: skip
    for container in injected["spec"]["initContainers"][:2]:
        assert container["resources"] == {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}}


@pytest.mark.parametrize("value", ["1", "0.5", "100m", "128Mi", "2G", "1e3", ".5"])
def test_kubernetes_quantities_are_taken(value: str) -> None:
    proxy = _injected({"sidecar.istio.io/proxyMemory": value})["spec"]["initContainers"][1]
    assert proxy["resources"] == {"requests": {"memory": value}}


@pytest.mark.parametrize("value", ["", "-1", "lots", "1Gb", "1 Gi", "1Gi\n", "1" * 40, "NaN"])
def test_hostile_quantities_are_refused(value: str) -> None:
    with pytest.raises(InjectError, match=re.escape("annotation sidecar.istio.io/proxyCPULimit: ")):
        _injected({"sidecar.istio.io/proxyCPULimit": value})


def test_proxy_config_passes_through_to_the_env() -> None:
    config = "concurrency: 3\nproxyMetadata:\n  FOO: bar\n"
    proxy = _injected({"proxy.istio.io/config": config})["spec"]["initContainers"][1]
    env = {entry["name"]: entry.get("value") for entry in proxy["env"]}
    assert json.loads(env["PROXY_CONFIG"]) == {"concurrency": 3, "proxyMetadata": {"FOO": "bar"}}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("[1, 2]", "expected an object"),
        ("holdApplicationUntilProxyStarts: yes please", "must be true or false"),
        ("{", "not YAML or JSON"),
        ("a: &x [1]\nb: *x", "aliases"),
        ("bad key: 1", "not a ProxyConfig field"),
        ("when: 2024-01-01", "not a JSON value"),
        ("x: .nan", "not a JSON number"),
        ("x: " + "[" * 50 + "]" * 50, "nested over"),
        ("x: '" + "a" * 70_000 + "'", "over 65536 bytes"),
    ],
)
def test_hostile_proxy_config_is_refused(value: str, why: str) -> None:
    with pytest.raises(
        InjectError, match=re.escape("annotation proxy.istio.io/config: ")
    ) as refused:
        _injected({"proxy.istio.io/config": value})
    assert why in str(refused.value)


def test_a_billion_laughs_never_expands() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"{chr(98 + n)}: &{chr(98 + n)} [" + ", ".join([f"*{chr(97 + n)}"] * 9) + "]"
        for n in range(9)
    ]
    with pytest.raises(InjectError, match="aliases"):
        _injected({"proxy.istio.io/config": "\n".join(lines)})


@pytest.mark.parametrize(
    "annotation", ["sidecar.istio.io/rewriteAppHTTPProbers", "sidecar.istio.io/nativeSidecar"]
)
@pytest.mark.parametrize("value", ["yes", "", "true ", "1\n"])
def test_booleans_other_than_go_spellings_are_refused(annotation: str, value: str) -> None:
    with pytest.raises(InjectError, match=f"annotation {annotation}: .* is not a boolean"):
        _injected({annotation: value})


def test_annotations_the_template_does_not_honour_change_nothing() -> None:
    plain = _injected({})
    other = _injected({"sidecar.istio.io/componentLogLevel": "misc:error",
                       "sidecar.istio.io/statsInclusionPrefixes": "cluster.outbound",
                       "sidecar.istio.io/interceptionMode": "NONE"})  # fmt: skip
    assert other["spec"] == plain["spec"]
