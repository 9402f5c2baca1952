"""`pilot kube-inject` against Istio's own `istioctl kube-inject`, on the same Deployments.

istioctl is built from the istio.io/istio module tools/istiod/go.mod pins
(tools/istioctl/build, cached per machine; `.ci/run` builds it). It runs offline: its
`--injectConfigFile`, `--valuesFile` and `--meshConfigFile` are made here from that
snapshot's own chart (manifests/charts/istio-control/istio-discovery) as its
`istio-sidecar-injector` ConfigMap renders them for revision `default`; nothing fetched
is committed. Both tools inject the same Deployments (plain; with HTTP, TCP and gRPC
probes; with the traffic and resource annotations; in classic mode; with
holdApplicationUntilProxyStarts, classic and native; inject=false; hostNetwork) and the
results are compared field by field: container names and order, securityContexts,
volumes (names and sources) and mounts (names and paths), istio-init's capture
arguments, istio-proxy's env names and the values both mean alike, ports, probes and the
rewritten app probes, resources, lifecycle hooks, labels and annotations. What may
differ is ALLOWED below, each with its reason (the same list is in docs/sidecar.md,
"Compared with istioctl kube-inject"); anything else fails with the field's path.
Hostile annotation values (a CIDR or port list carrying an iptables rule or a newline, a
port out of range, a quantity that is none) are refused by both.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.inject_pods import probed_pod, workload

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tools" / "istioctl" / "build"
PILOT = Path(sys.executable).parent / "pilot"
GO_INSTALLED = "/usr/local/go/bin"  # where Go's own archive installs (.ci/run adds it too)
CHART = Path("manifests/charts/istio-control/istio-discovery")
Json = dict[str, Any]

# Differences the comparison allows, each with why. Keys name what the test skips or
# normalises; docs/sidecar.md lists the same.
ALLOWED = {
    "image": "the proxy image: pilot-proxy:VERSION against Istio's proxyv2",
    "command/args shape": "`pilot agent [flags] proxy sidecar`, `pilot agent iptables` and"
    " `pilot agent wait` against `pilot-agent proxy sidecar`, `pilot-agent istio-iptables`"
    " and `pilot-agent wait`: flags differ (istio-init's capture flags are compared)",
    "Go-only env": "GOMAXPROCS, GOMEMLIMIT: Go runtime knobs of pilot-agent",
    "PILOT_CERT_PROVIDER": "pilot's agent has one certificate provider, the CA at CA_ADDR",
    "CA_TOKEN_FILE, CA_ROOT_CERT": "pilot writes the token and root paths pilot-agent"
    " has built in (the same paths)",
    "CA_ADDR value": "pilot's Service (pilot.pilot-system.svc:15012) against istiod's",
    "prometheus.io/port": "15090 (Envoy's own endpoint) against 15020 (pilot-agent merges"
    " the app's metrics there; pilot's agent does not)",
    "istio-ca-crl": "Istio's optional ConfigMap of revoked certificates; pilot has no CRL",
    "preStop drain": "pilot-agent's `request POST drain` lifecycle hook; pilot's agent"
    " drains on SIGTERM",
    "fsGroup": "pilot sets the pod's fsGroup 1337 when unset, so uid 1337 reads the token",
    "log level args": "--proxyLogLevel/--log_output_level are pilot-agent's flags",
    "classic order": "in classic mode istio-proxy is the first of `containers` (the"
    " injected-pod contract: it starts before the app); Istio's template puts it last"
    " unless holdApplicationUntilProxyStarts",
}
GO_ONLY_ENV = {"GOMAXPROCS", "GOMEMLIMIT", "PILOT_CERT_PROVIDER"}
PILOT_ONLY_ENV = {"CA_TOKEN_FILE", "CA_ROOT_CERT"}
DIFFERENT_VALUE_ENV = {"CA_ADDR"}
JSON_ENV = {"PROXY_CONFIG", "ISTIO_META_POD_PORTS", "ISTIO_KUBE_APP_PROBERS"}
ISTIO_ONLY_VOLUMES = {"istio-ca-crl"}
DIFFERENT_VALUE_ANNOTATIONS = {"prometheus.io/port"}
TRAFFIC = {
    "traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8,192.168.0.0/16",
    "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.1/32",
    "traffic.sidecar.istio.io/includeInboundPorts": "8080,9090",
    "traffic.sidecar.istio.io/excludeInboundPorts": "9091",
    "traffic.sidecar.istio.io/excludeOutboundPorts": "5432,6379",
    "traffic.sidecar.istio.io/includeOutboundPorts": "443",
    "sidecar.istio.io/proxyCPU": "250m",
    "sidecar.istio.io/proxyMemory": "256Mi",
    "sidecar.istio.io/proxyCPULimit": "1",
    "sidecar.istio.io/proxyMemoryLimit": "512Mi",
}


@dataclass(frozen=True)
class Istioctl:
    binary: Path
    source: Path  # the istio.io/istio module's source


@pytest.fixture(scope="module")
def istioctl() -> Istioctl:
    """tools/istioctl/build's binary (built once per machine: minutes the first time)."""
    go = shutil.which("go") or shutil.which("go", path=GO_INSTALLED)
    if go is None:
        # The suite needs Go (the Kubernetes binaries too): a missing one fails, never skips.
        pytest.fail("no `go` on PATH to build istioctl from the istio.io/istio module")
    env = os.environ | {"PATH": f"{os.environ.get('PATH', '')}:{Path(go).parent}"}
    built = subprocess.run(
        [str(BUILD)], capture_output=True, text=True, timeout=3600, check=False, env=env
    )
    assert built.returncode == 0, built.stderr[-4000:]
    folder = Path(built.stdout.strip().splitlines()[-1])
    return Istioctl(folder / "istioctl", folder / "istio-src")


@pytest.fixture(scope="module")
def offline(istioctl: Istioctl, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """istioctl's offline flags, their files rendered from the snapshot's chart as its
    ConfigMap `istio-sidecar-injector` (revision default) would hold them."""
    chart = istioctl.source / CHART
    folder = tmp_path_factory.mktemp("istioctl")
    defaults = yaml.safe_load((chart / "values.yaml").read_text())["_internal_defaults_do_not_set"]
    # As templates/istiod-injector-configmap.yaml's `values`: the fields the template reads.
    values = {key: defaults[key] for key in ("global", "sidecarInjectorWebhook", "revision")}
    values["pilot"] = {key: defaults.get(key) for key in ("cni", "env")}
    gateways = defaults["gateways"]
    values["gateways"] = {key: gateways.get(key) for key in ("securityContext", "seccompProfile")}
    # ... and its `config`: the sidecar template, the chart's file as it is.
    config = {
        "defaultTemplates": ["sidecar"],
        "policy": defaults["global"]["proxy"]["autoInject"],
        "alwaysInjectSelector": [],
        "neverInjectSelector": [],
        "injectedAnnotations": {},
        "template": "{{ Template_Version_And_Istio_Version_Mismatched_Check_Installation }}",
        "templates": {"sidecar": (chart / "files" / "injection-template.yaml").read_text()},
    }
    mesh = {
        "trustDomain": "cluster.local",
        "rootNamespace": "istio-system",
        "defaultConfig": {"discoveryAddress": "istiod.istio-system.svc:15012"},
    }
    files = {"values.json": json.dumps(values), "inject.yaml": yaml.safe_dump(config),
             "mesh.yaml": yaml.safe_dump(mesh)}  # fmt: skip
    for name, text in files.items():
        (folder / name).write_text(text)
    return [
        # A revision given: without one istioctl waits for a cluster to name the default.
        "--revision", "default",
        "--injectConfigFile", str(folder / "inject.yaml"),
        "--valuesFile", str(folder / "values.json"),
        "--meshConfigFile", str(folder / "mesh.yaml"),
    ]  # fmt: skip


def _run(argv: list[str], source: Path, env: dict[str, str] | None = None) -> Json:
    result = subprocess.run(
        [*argv, "-f", str(source)], capture_output=True, text=True, timeout=120, check=False,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, f"{argv[0]}: {result.stderr}"
    [document] = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert isinstance(document, dict)
    return document


def inject_both(
    istioctl: Istioctl, offline: list[str], deployment: Json, folder: Path, native: bool = True
) -> tuple[Json, Json]:
    """(pilot's, istioctl's) injected Deployment; native sidecars or classic in both."""
    source = folder / f"{deployment['metadata']['name']}.yaml"
    source.write_text(yaml.safe_dump(deployment))
    mode = "--native-sidecars" if native else "--no-native-sidecars"
    ours = _run([str(PILOT), "kube-inject", mode], source)
    # Offline, istioctl uses native sidecars only when told (it asks no node's version).
    env = os.environ | {"ENABLE_NATIVE_SIDECARS": "true" if native else "false"}
    theirs = _run([str(istioctl.binary), "kube-inject", *offline], source, env)
    return ours, theirs


# -- the comparison ---------------------------------------------------------------------


class Differences(list[str]):
    def check(self, where: str, ours: object, theirs: object) -> None:
        if ours != theirs:
            self.append(f"{where}: pilot {ours!r} / istioctl {theirs!r}")


def _template(deployment: Json) -> Json:
    template: Json = deployment["spec"]["template"]
    return template


def _containers(template: Json, field: str) -> list[Json]:
    found: list[Json] = template["spec"].get(field) or []
    return found


def _named(template: Json, name: str) -> Json | None:
    every = [*_containers(template, "initContainers"), *_containers(template, "containers")]
    return next((c for c in every if c["name"] == name), None)


def _volume_source(volume: Json) -> Json:
    """A volume's source; none is an emptyDir (as the API server defaults it)."""
    source = {k: v for k, v in volume.items() if k != "name"}
    return source or {"emptyDir": {}}


def _value_from(entry: Json) -> object:
    """An env entry's value or source; a resourceFieldRef divisor 0 or 1 both mean the
    default (the API server's)."""
    if "valueFrom" not in entry:
        value = str(entry.get("value", ""))
        return json.loads(value) if entry["name"] in JSON_ENV and value.strip() else value
    source = copy.deepcopy(entry["valueFrom"])
    field = source.get("resourceFieldRef")
    if field is not None and str(field.get("divisor", "1")) in ("0", "1"):
        field.pop("divisor", None)
    return source


def _env(container: Json) -> dict[str, object]:
    return {e["name"]: _value_from(e) for e in container.get("env") or []}


def _probe(probe: Json | None) -> Json | None:
    """A probe without the fields equal to Kubernetes' defaults (the API server's)."""
    if probe is None:
        return None
    kept = {k: v for k, v in probe.items() if not (k == "initialDelaySeconds" and v == 0)}
    if "httpGet" in kept and kept["httpGet"].get("scheme", "HTTP") == "HTTP":
        kept["httpGet"] = {k: v for k, v in kept["httpGet"].items() if k != "scheme"}
    return kept


def _capture_flags(init: Json) -> list[str]:
    """istio-init's istio-iptables flags, whichever program takes them."""
    argv = [*init.get("command", []), *init.get("args", [])]
    for lead in (["pilot", "agent", "iptables"], ["istio-iptables"]):
        if argv[: len(lead)] == lead:
            argv = argv[len(lead) :]
    return [a for a in argv if not a.startswith("--log_output_level")]


def compare_containers(ours: Json, theirs: Json, found: Differences) -> None:
    for field in ("initContainers", "containers"):
        names = [c["name"] for c in _containers(ours, field)]
        istio_names = [c["name"] for c in _containers(theirs, field)]
        moved = [*names[1:], "istio-proxy"]
        if names[:1] == ["istio-proxy"] and moved == istio_names:  # ALLOWED: classic order
            names = moved
        found.check(f"{field} names", names, istio_names)
    for name in ("istio-init", "istio-proxy"):
        mine, istio = _named(ours, name), _named(theirs, name)
        if mine is None or istio is None:
            found.check(f"{name} present", mine is not None, istio is not None)
            continue
        found.check(f"{name} securityContext", mine.get("securityContext"),
                    istio.get("securityContext"))  # fmt: skip
        found.check(f"{name} restartPolicy", mine.get("restartPolicy"), istio.get("restartPolicy"))
        found.check(f"{name} ports", mine.get("ports"), istio.get("ports"))
    init, istio_init = _named(ours, "istio-init"), _named(theirs, "istio-init")
    if init is not None and istio_init is not None:
        found.check("istio-init capture flags", _capture_flags(init), _capture_flags(istio_init))


def compare_proxy(ours: Json, theirs: Json, found: Differences) -> None:
    mine, istio = _named(ours, "istio-proxy"), _named(theirs, "istio-proxy")
    if mine is None or istio is None:
        return
    env, istio_env = _env(mine), _env(istio)
    found.check("istio-proxy env names", set(env) - PILOT_ONLY_ENV, set(istio_env) - GO_ONLY_ENV)
    for name in sorted((set(env) & set(istio_env)) - DIFFERENT_VALUE_ENV):
        found.check(f"env {name}", env[name], istio_env[name])
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        found.check(f"istio-proxy {probe}", _probe(mine.get(probe)), _probe(istio.get(probe)))
    mounts = {m["name"]: m["mountPath"] for m in mine.get("volumeMounts") or []}
    istio_mounts = {m["name"]: m["mountPath"] for m in istio.get("volumeMounts") or []}
    for volume in ISTIO_ONLY_VOLUMES:
        istio_mounts.pop(volume, None)
    found.check("istio-proxy volumeMounts", mounts, istio_mounts)
    found.check("istio-proxy resources", mine.get("resources"), istio.get("resources"))
    istio_lifecycle = copy.deepcopy(istio.get("lifecycle") or {})
    istio_lifecycle.pop("preStop", None)  # ALLOWED: preStop drain
    found.check("istio-proxy lifecycle", _agent_spelled(mine.get("lifecycle") or {}),
                istio_lifecycle)  # fmt: skip


def _agent_spelled(lifecycle: Json) -> Json:
    """Hooks with `pilot agent ...` spelled `pilot-agent ...` (ALLOWED: command shape)."""
    spelled = copy.deepcopy(lifecycle)
    for hook in spelled.values():
        command = (hook.get("exec") or {}).get("command") or []
        if command[:2] == ["pilot", "agent"]:
            hook["exec"]["command"] = ["pilot-agent", *command[2:]]
    return spelled


def compare_app(ours: Json, theirs: Json, found: Differences) -> None:
    """The app's containers: the same, probes rewritten to the same paths and ports."""
    mine = [c for c in _containers(ours, "containers") if c["name"] != "istio-proxy"]
    istio = [c for c in _containers(theirs, "containers") if c["name"] != "istio-proxy"]
    for container, other in zip(mine, istio, strict=False):
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            found.check(f"{container['name']} {probe}", _probe(container.get(probe)),
                        _probe(other.get(probe)))  # fmt: skip
        rest = {k: v for k, v in container.items() if not k.endswith("Probe") and v != {}}
        other_rest = {k: v for k, v in other.items() if not k.endswith("Probe") and v != {}}
        found.check(f"{container['name']} otherwise", rest, other_rest)


def compare_pod(ours: Json, theirs: Json, found: Differences) -> None:
    volumes = {v["name"]: _volume_source(v) for v in ours["spec"].get("volumes") or []}
    istio_volumes = {v["name"]: _volume_source(v) for v in theirs["spec"].get("volumes") or []}
    for volume in ISTIO_ONLY_VOLUMES:
        istio_volumes.pop(volume, None)
    found.check("volumes", volumes, istio_volumes)
    found.check("labels", ours["metadata"].get("labels"), theirs["metadata"].get("labels"))
    annotations = dict(ours["metadata"].get("annotations") or {})
    istio_annotations = dict(theirs["metadata"].get("annotations") or {})
    found.check("annotation keys", sorted(annotations), sorted(istio_annotations))
    for key in sorted((set(annotations) & set(istio_annotations)) - DIFFERENT_VALUE_ANNOTATIONS):
        mine, istio = annotations[key], istio_annotations[key]
        if key == "sidecar.istio.io/status":
            mine, istio = _status(mine), _status(istio)
        found.check(f"annotation {key}", mine, istio)
    others = {k: v for k, v in ours["spec"].items() if k not in _COMPARED_SPEC}
    istio_others = {k: v for k, v in theirs["spec"].items() if k not in _COMPARED_SPEC}
    if others.get("securityContext") == {"fsGroup": 1337} and "securityContext" not in istio_others:
        del others["securityContext"]  # ALLOWED: fsGroup
    found.check("the pod's other fields", others, istio_others)


_COMPARED_SPEC = {"containers", "initContainers", "volumes"}


def _status(text: str) -> Json:
    status: Json = json.loads(text)
    status["volumes"] = [v for v in status.get("volumes") or [] if v not in ISTIO_ONLY_VOLUMES]
    return status


def differences(ours: Json, theirs: Json) -> list[str]:
    """What differs between the two injected Deployments, past what ALLOWED allows."""
    found = Differences()
    mine, istio = _template(ours), _template(theirs)
    compare_containers(mine, istio, found)
    compare_proxy(mine, istio, found)
    compare_app(mine, istio, found)
    compare_pod(mine, istio, found)
    return found


# -- the Deployments ------------------------------------------------------------------


def deployment(name: str, change: Callable[[Json], None] | None = None) -> Json:
    made = workload("Deployment", name=name)
    if change is not None:
        change(made["spec"]["template"])
    return made


def _probes(template: Json) -> None:
    template["spec"]["containers"] = probed_pod()["spec"]["containers"]


def _annotated(template: Json) -> None:
    template["metadata"]["annotations"] = dict(TRAFFIC)


def _held(template: Json) -> None:
    """holdApplicationUntilProxyStarts, with probes (Istio's template moves the proxy first)."""
    _probes(template)
    hold = json.dumps({"holdApplicationUntilProxyStarts": True})
    template["metadata"]["annotations"] = {"proxy.istio.io/config": hold}


def _not_injected(template: Json) -> None:
    template["metadata"]["labels"]["sidecar.istio.io/inject"] = "false"


def _host_network(template: Json) -> None:
    template["spec"]["hostNetwork"] = True


@dataclass(frozen=True)
class Case:
    name: str
    change: Callable[[Json], None] | None = None
    native: bool = True


CASES = [Case("plain"), Case("probes", _probes), Case("annotated", _annotated),
         Case("classic", _probes, native=False), Case("held", _held, native=False),
         Case("held-native", _held)]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_pilot_injects_what_istioctl_injects(
    istioctl: Istioctl, offline: list[str], tmp_path: Path, case: Case
) -> None:
    made = deployment(case.name, case.change)
    ours, theirs = inject_both(istioctl, offline, made, tmp_path, case.native)
    assert _named(_template(theirs), "istio-proxy") is not None, "istioctl injected nothing"
    assert differences(ours, theirs) == []


@pytest.mark.parametrize(("name", "change"), [("off", _not_injected), ("host", _host_network)])
def test_neither_injects_what_istio_would_not(
    istioctl: Istioctl,
    offline: list[str],
    tmp_path: Path,
    name: str,
    change: Callable[[Json], None],
) -> None:
    original = deployment(name, change)
    ours, theirs = inject_both(istioctl, offline, original, tmp_path)
    for injected in (ours, theirs):
        template = _template(injected)
        assert _named(template, "istio-proxy") is None
        assert "sidecar.istio.io/status" not in (template["metadata"].get("annotations") or {})
    assert _template(ours)["spec"] == _template(original)["spec"]


HOSTILE = [
    ("traffic.sidecar.istio.io/excludeOutboundIPRanges", "10.0.0.0/8 -j ACCEPT"),
    ("traffic.sidecar.istio.io/includeOutboundIPRanges", "*,10.0.0.0/8"),
    ("traffic.sidecar.istio.io/includeInboundPorts", "8080\n-j ACCEPT"),
    ("traffic.sidecar.istio.io/excludeInboundPorts", "70000"),
    ("traffic.sidecar.istio.io/excludeOutboundPorts", "-1"),
    ("sidecar.istio.io/proxyCPU", "lots"),
]


@pytest.mark.parametrize(("key", "value"), HOSTILE, ids=[f"{k}={v!r}" for k, v in HOSTILE])
def test_both_refuse_the_same_hostile_annotations(
    istioctl: Istioctl, offline: list[str], tmp_path: Path, key: str, value: str
) -> None:
    """A value that would reach an iptables rule or a resource unchecked: istioctl refuses
    it, and so does pilot, in one line naming the annotation, printing no workload."""
    source = tmp_path / "hostile.yaml"
    made = deployment("hostile")
    _template(made)["metadata"]["annotations"] = {key: value}
    source.write_text(yaml.safe_dump(made))
    theirs = subprocess.run(
        [str(istioctl.binary), "kube-inject", *offline, "-f", str(source)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    ours = subprocess.run(
        [str(PILOT), "kube-inject", "-f", str(source)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert theirs.returncode != 0, theirs.stdout
    assert ours.returncode != 0 and ours.stdout == "", ours.stdout
    [line] = ours.stderr.splitlines()
    assert key in line, line


def test_the_comparison_finds_a_difference(
    istioctl: Istioctl, offline: list[str], tmp_path: Path
) -> None:
    """The comparison is not blind: a moved mount, a dropped env entry and istio-init
    running as another user in pilot's output are each reported, by name."""
    ours, theirs = inject_both(istioctl, offline, deployment("broken", _probes), tmp_path)
    proxy = _named(_template(ours), "istio-proxy")
    init = _named(_template(ours), "istio-init")
    assert proxy is not None and init is not None
    proxy["volumeMounts"][0]["mountPath"] = "/elsewhere"
    proxy["env"] = [e for e in proxy["env"] if e["name"] != "ISTIO_META_WORKLOAD_NAME"]
    init["securityContext"]["runAsUser"] = 1337
    found = "\n".join(differences(ours, theirs))
    assert "istio-proxy volumeMounts" in found
    assert "istio-proxy env names" in found
    assert "istio-init securityContext" in found
