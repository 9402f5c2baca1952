"""The container image and the Kubernetes manifests, checked as far as a machine without
Docker and without a cluster can: what a user would hit first when applying them.

* every manifest under deploy/ is valid for the Kubernetes API (strict: a misspelt field
  fails), and each kustomization lists every file of its folder;
* the RBAC grants exactly what pilot uses, the pods pass the "restricted" Pod Security
  Standard (which pilot's namespace enforces; the example's allows the injected
  istio-init, the only container that standard refuses), and pilot's Deployment is the
  hardened, highly available one deploy/README.md describes;
* every flag the manifests pass to pilot is one that `pilot discovery` accepts;
* the example app is the app alone, in a namespace asking for injection; `pilot
  kube-inject` gives it the sidecar that reaches pilot at its Service;
* the Dockerfile passes hadolint, and the build context (.dockerignore) holds what it
  copies.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pilot.durations import parse_duration
from pilot.security.root_publisher import CONFIGMAP as ROOT_CONFIGMAP
from pilot.sources.kubernetes.istio_config import KINDS as ISTIO_KINDS

Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLE = DEPLOY / "example-app"
CA_COMPONENT = DEPLOY / "ca"
BY_DEFAULT = DEPLOY / "inject-by-default"
WEBHOOK_CONFIGURATION = "pilot-sidecar-injector"
SYSTEM_NAMESPACES = ["kube-system", "kube-public", "kube-node-lease", "local-path-storage"]
BIN = Path(sys.executable).parent

# The oldest Kubernetes the manifests are meant for (deploy/README.md), and the newest
# this kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
PILOT_UID = 1337
PILOT_PORTS = {
    "grpc-xds": 15010,
    "https-xds": 15012,
    "http-monitoring": 15014,
    "https-webhook": 15017,
}
# The Service's port for each, where it is not the container's: the API server calls
# webhooks on 443.
SERVICE_PORTS = PILOT_PORTS | {"https-webhook": 443}

# What pilot does with the API server: (apiGroup, resource, verb).
CLUSTER_GRANTS = {
    ("", "services", "list"),
    ("", "services", "watch"),
    ("", "endpoints", "list"),
    ("", "endpoints", "watch"),
    ("discovery.k8s.io", "endpointslices", "list"),
    ("discovery.k8s.io", "endpointslices", "watch"),
    # Auto mTLS: which endpoints run a sidecar (pilot/sources/kubernetes/cluster_source.py).
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    # Istio's PeerAuthentications (pilot/sources/kubernetes/peer_authentications.py):
    # readiness waits for their list (tests/cluster/test_deploy_as_shipped.py).
    ("security.istio.io", "peerauthentications", "list"),
    ("security.istio.io", "peerauthentications", "watch"),
    # DestinationRule, VirtualService and the Istio kinds only counted
    # (pilot/sources/kubernetes/istio_config.py): each kind pilot watches, and no other.
    *((kind.group, kind.plural, verb) for kind in ISTIO_KINDS for verb in ("list", "watch")),
    # And AuthorizationPolicies (pilot/sources/kubernetes/authorization_policies.py).
    ("security.istio.io", "authorizationpolicies", "list"),
    ("security.istio.io", "authorizationpolicies", "watch"),
    ("security.istio.io", "requestauthentications", "list"),
    ("security.istio.io", "requestauthentications", "watch"),
    # Endpoint locality: the Nodes' topology labels (pilot/sources/kubernetes/cluster_source.py).
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    # The root in every namespace (pilot/security/root_publisher.py).
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "configmaps", "create"),
    ("", "configmaps", "update"),
    # The caBundle of pilot's own webhook configuration (pilot/webhook/ca_bundle.py).
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "list"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "watch"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch"),
}
# Verbs RBAC can limit to one name, and the names: pilot reads and changes nothing else.
NAMED_GRANTS = {
    ("configmaps", "list"): [ROOT_CONFIGMAP],
    ("configmaps", "watch"): [ROOT_CONFIGMAP],
    ("configmaps", "update"): [ROOT_CONFIGMAP],
    ("secrets", "get"): ["pilot-ca-secret"],
    ("secrets", "update"): ["pilot-ca-secret"],
    **{
        ("mutatingwebhookconfigurations", verb): [WEBHOOK_CONFIGURATION]
        for verb in ("get", "list", "watch", "patch")
    },
}
NAMESPACE_GRANTS = {
    ("", "secrets", "get"),
    ("", "secrets", "create"),
    ("", "secrets", "update"),
    # Remote clusters' Secrets, by label (pilot/sources/kubernetes/clusters.py).
    ("", "secrets", "list"),
    ("", "secrets", "watch"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
}

# Pod Security Standards, "restricted": the volume types it admits.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Manifest:
    path: Path
    doc: Json

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}: {self.kind}/{self.name}"


def _yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _kustomization(folder: Path) -> Json:
    docs = _yaml_docs(folder / "kustomization.yaml")
    assert len(docs) == 1, f"{folder}/kustomization.yaml: expected one document"
    kustomization: Json = docs[0]
    return kustomization


def _resources(folder: Path) -> list[Manifest]:
    """The objects a kustomization applies (its `resources:` files), in order."""
    found = []
    for entry in _kustomization(folder).get("resources", []):
        path = folder / entry
        found.extend(Manifest(path, doc) for doc in _yaml_docs(path))
    return found


@functools.cache
def _pilot() -> list[Manifest]:
    return _resources(DEPLOY)


@functools.cache
def _example() -> list[Manifest]:
    return _resources(EXAMPLE)


def _one(manifests: list[Manifest], kind: str, name: str | None = None) -> Json:
    matches = [m.doc for m in manifests if m.kind == kind and name in (None, m.name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def _container(deployment: Json, name: str) -> Json:
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert name in containers, f"no container {name!r}: {sorted(containers)}"
    container: Json = containers[name]
    return container


def _pilot_deployment() -> Json:
    return _one(_pilot(), "Deployment", "pilot")


def _with_ca_component() -> Json:
    """pilot's Deployment as `kustomize build` renders it with the `ca` component."""
    component = _kustomization(CA_COMPONENT)
    assert component["kind"] == "Component"
    deployment = copy.deepcopy(_pilot_deployment())
    for patch in component["patches"]:
        assert patch["target"]["kind"] == "Deployment"
        assert patch["target"]["name"] == "pilot"
        for operation in _yaml_docs(CA_COMPONENT / patch["path"])[0]:
            _json_patch_add(deployment, operation)
    return deployment


def _with_by_default_component() -> Json:
    """pilot's webhook configuration as `kustomize build` renders it with the
    `inject-by-default` component."""
    component = _kustomization(BY_DEFAULT)
    assert component["kind"] == "Component"
    configuration = copy.deepcopy(_one(_pilot(), "MutatingWebhookConfiguration"))
    for patch in component["patches"]:
        assert patch["target"]["kind"] == "MutatingWebhookConfiguration"
        assert patch["target"]["name"] == WEBHOOK_CONFIGURATION
        for operation in _yaml_docs(BY_DEFAULT / patch["path"])[0]:
            _json_patch_add(configuration, operation)
    return configuration


def _json_patch_add(document: Json, operation: Json) -> None:
    """RFC 6902 `add`, the only operation the components use."""
    assert operation["op"] == "add", operation
    *parents, last = operation["path"].lstrip("/").split("/")
    target: Any = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        index = len(target) if last == "-" else int(last)
        target.insert(index, operation["value"])
    else:
        target[last] = operation["value"]


# --------------------------------------------------------------------------- validity


def _every_object() -> Iterator[tuple[str, Json]]:
    for manifest in [*_pilot(), *_example()]:
        yield str(manifest), manifest.doc
    yield f"{CA_COMPONENT.relative_to(REPO)}: Deployment/pilot with cacerts", _with_ca_component()
    yield f"{BY_DEFAULT.relative_to(REPO)}: the webhooks with auto", _with_by_default_component()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_the_kubernetes_api(version: str) -> None:
    errors = []
    for label, doc in _every_object():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            errors.append(f"{label}: {where}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(f"{label}: {error.message}")
    assert not errors, f"invalid for Kubernetes {version}:\n" + "\n".join(errors)


def test_a_strict_validation_catches_a_misspelt_field() -> None:
    deployment = copy.deepcopy(_pilot_deployment())
    context = _container(deployment, "discovery")["securityContext"]
    context["readOnlyRootFileSystem"] = context.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def _kustomize_folders() -> list[Path]:
    return sorted(path.parent for path in DEPLOY.rglob("kustomization.yaml"))


def test_each_kustomization_lists_every_file_of_its_folder() -> None:
    folders = _kustomize_folders()
    assert folders == [DEPLOY, CA_COMPONENT, EXAMPLE, BY_DEFAULT]
    stray = [
        path.relative_to(REPO) for path in DEPLOY.rglob("*.y*ml") if path.parent not in folders
    ]
    assert not stray, f"YAML outside every kustomization: {stray}"
    for folder in folders:
        kustomization = _kustomization(folder)
        listed = {
            *kustomization.get("resources", []),
            *(patch["path"] for patch in kustomization.get("patches", [])),
        }
        present = {path.name for path in folder.glob("*.y*ml") if path.name != "kustomization.yaml"}
        assert listed == present, (
            f"{folder.relative_to(REPO)}/kustomization.yaml: missing {sorted(present - listed)}, "
            f"listing absent files {sorted(listed - present)}"
        )
        for component in kustomization.get("components", []):
            assert _kustomization(folder / component)["kind"] == "Component"


@pytest.mark.parametrize("folder", [DEPLOY, EXAMPLE], ids=["pilot", "example-app"])
def test_every_object_is_in_the_kustomization_namespace(folder: Path) -> None:
    namespace = _kustomization(folder)["namespace"]
    manifests = _resources(folder)
    assert _one(manifests, "Namespace")["metadata"]["name"] == namespace
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
    }
    for manifest in manifests:
        if manifest.kind not in cluster_scoped:
            assert manifest.doc["metadata"].get("namespace") == namespace, str(manifest)
        for subject in manifest.doc.get("subjects", []):
            assert subject.get("namespace") == namespace, f"{manifest}: {subject}"


# --------------------------------------------------------------------------- RBAC


def _grants(role: Json) -> set[tuple[str, str, str]]:
    found = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    found.add((group, resource, verb))
    return found


def _binds_pilot(binding: Json, role_kind: str, role_name: str) -> bool:
    subjects = [(s["kind"], s["name"], s.get("namespace")) for s in binding["subjects"]]
    ref = binding["roleRef"]
    return (ref["kind"], ref["name"]) == (role_kind, role_name) and subjects == [
        ("ServiceAccount", "pilot", "pilot-system")
    ]


def test_rbac_grants_exactly_what_pilot_uses() -> None:
    manifests = _pilot()
    roles = [m for m in manifests if m.kind in ("ClusterRole", "Role")]
    assert sorted((m.kind, m.name) for m in roles) == [("ClusterRole", "pilot"), ("Role", "pilot")]
    assert _grants(_one(manifests, "ClusterRole")) == CLUSTER_GRANTS
    role = _one(manifests, "Role")
    assert _grants(role) == NAMESPACE_GRANTS
    assert role["metadata"]["namespace"] == _pilot_deployment()["metadata"]["namespace"]
    for (resource, verb), names in NAMED_GRANTS.items():
        rules = [
            rule
            for kind in ("ClusterRole", "Role")
            for rule in _one(manifests, kind)["rules"]
            if resource in rule["resources"] and verb in rule["verbs"]
        ]
        assert [rule.get("resourceNames") for rule in rules] == [names], (resource, verb)
    assert _binds_pilot(_one(manifests, "ClusterRoleBinding"), "ClusterRole", "pilot")
    assert _binds_pilot(_one(manifests, "RoleBinding"), "Role", "pilot")
    assert _pilot_deployment()["spec"]["template"]["spec"]["serviceAccountName"] == "pilot"
    assert not [m for m in _example() if "Role" in m.kind], "the example app needs no RBAC"


# --------------------------------------------------------------------------- pods


def _pod_templates() -> Iterator[tuple[str, Json]]:
    for manifest in [*_pilot(), *_example()]:
        if manifest.kind == "Deployment":
            yield str(manifest), manifest.doc["spec"]["template"]["spec"]


def _effective(pod: Json, container: Json) -> Json:
    """A container's security context over its pod's (the container's settings win)."""
    return {**pod.get("securityContext", {}), **container.get("securityContext", {})}


def _restricted_violations(pod: Json) -> list[str]:
    problems = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds)}")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name, context = container["name"], _effective(pod, container)
        if context.get("runAsNonRoot") is not True or context.get("runAsUser") == 0:
            problems.append(f"{name}: may run as root")
        if container.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {
            "NET_BIND_SERVICE"
        }:
            problems.append(f"{name}: capabilities {capabilities}")
        if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: no RuntimeDefault seccomp profile")
        if any("hostPort" in port for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems


def test_every_pod_meets_the_restricted_pod_security_standard() -> None:
    labels = _one(_pilot(), "Namespace")["metadata"].get("labels", {})
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted"
    templates = list(_pod_templates())
    assert len(templates) == 2
    for label, pod in templates:
        assert not _restricted_violations(pod), f"{label}: {_restricted_violations(pod)}"


def test_pilot_runs_as_1337_on_a_read_only_root_with_emptydirs_for_writing() -> None:
    deployment = _pilot_deployment()
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment, "discovery")
    context = _effective(pod, container)
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == PILOT_UID
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        writable = not mount.get("readOnly", False)
        assert not writable or "emptyDir" in volumes[mount["name"]], mount
    state = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "state"]
    assert state == ["/var/lib/pilot"], "the image's XDG_STATE_HOME must be writable"


def _args(container: Json) -> dict[str, str]:
    """`--flag=value` arguments as a dict (the manifests always use the `=` form)."""
    found = {}
    for arg in container["args"]:
        assert arg.startswith("--") and "=" in arg, f"write {arg!r} as --flag=value"
        flag, _, value = arg.partition("=")
        found[flag] = value
    return found


def _env(container: Json) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}) for e in container["env"]}


def test_pilot_knows_its_identity_and_drains_before_it_is_killed() -> None:
    deployment = _pilot_deployment()
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment, "discovery")
    env = _env(container)
    assert env["POD_NAMESPACE"] == {"fieldPath": "metadata.namespace"}
    assert env["SERVICE_ACCOUNT"] == {"fieldPath": "spec.serviceAccountName"}
    drain = parse_duration(_args(container)["--drain-duration"])
    assert pod["terminationGracePeriodSeconds"] > drain
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == PILOT_PORTS


def test_pilot_probes_ready_on_the_monitoring_port() -> None:
    container = _container(_pilot_deployment(), "discovery")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/ready", "port": "http-monitoring"}
    liveness = container["livenessProbe"]
    # A minute without an answer before a restart; the startup probe covers the first sync.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_pilot_has_resources_and_spreads_over_nodes() -> None:
    deployment = _pilot_deployment()
    resources = _container(deployment, "discovery")["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    by_host = [
        c
        for c in pod.get("topologySpreadConstraints", [])
        if c["topologyKey"] == "kubernetes.io/hostname"
    ]
    assert len(by_host) == 1 and by_host[0]["whenUnsatisfiable"] == "DoNotSchedule"
    assert by_host[0]["labelSelector"]["matchLabels"].items() <= labels.items()


def test_the_service_and_the_disruption_budget_select_pilot() -> None:
    deployment = _pilot_deployment()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = _one(_pilot(), "Service", "pilot")
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {name: (number, name) for name, number in SERVICE_PORTS.items()}
    budget = _one(_pilot(), "PodDisruptionBudget", "pilot")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


# --------------------------------------------------------------------------- injection


def _expressions(*triples: tuple[str, str, list[str] | None]) -> list[Json]:
    return [
        {"key": key, "operator": operator, **({"values": values} if values else {})}
        for key, operator, values in triples
    ]


NOT_SYSTEM = ("kubernetes.io/metadata.name", "NotIn", SYSTEM_NAMESPACES)
# Istio's chart (istio-discovery/templates/mutatingwebhook.yaml) for revision "default":
# webhook -> (namespaceSelector, objectSelector), each namespaceSelector also excluding
# the system namespaces.
ISTIO_WEBHOOKS = {
    "rev.namespace.sidecar-injector.istio.io": (
        _expressions(
            ("istio.io/rev", "In", ["default"]), ("istio-injection", "DoesNotExist", None),
            NOT_SYSTEM,
        ),
        _expressions(("sidecar.istio.io/inject", "NotIn", ["false"])),
    ),
    "rev.object.sidecar-injector.istio.io": (
        _expressions(
            ("istio.io/rev", "DoesNotExist", None), ("istio-injection", "DoesNotExist", None),
            NOT_SYSTEM,
        ),
        _expressions(
            ("sidecar.istio.io/inject", "NotIn", ["false"]), ("istio.io/rev", "In", ["default"])
        ),
    ),
    "namespace.sidecar-injector.istio.io": (
        _expressions(("istio-injection", "In", ["enabled"]), NOT_SYSTEM),
        _expressions(("sidecar.istio.io/inject", "NotIn", ["false"])),
    ),
    "object.sidecar-injector.istio.io": (
        _expressions(
            ("istio-injection", "DoesNotExist", None), ("istio.io/rev", "DoesNotExist", None),
            NOT_SYSTEM,
        ),
        _expressions(
            ("sidecar.istio.io/inject", "In", ["true"]), ("istio.io/rev", "DoesNotExist", None)
        ),
    ),
}  # fmt: skip
# The by-default webhook (Istio's `enableNamespacesByDefault`), behind a component.
AUTO_WEBHOOK = (
    _expressions(
        ("istio-injection", "DoesNotExist", None), ("istio.io/rev", "DoesNotExist", None),
        NOT_SYSTEM,
    ),
    _expressions(
        ("sidecar.istio.io/inject", "DoesNotExist", None), ("istio.io/rev", "DoesNotExist", None)
    ),
)  # fmt: skip


def _selectors(configuration: Json) -> dict[str, tuple[list[Json], list[Json]]]:
    return {
        w["name"]: (w["namespaceSelector"]["matchExpressions"],
                    w["objectSelector"]["matchExpressions"])
        for w in configuration["webhooks"]
    }  # fmt: skip


def test_the_webhooks_select_pods_as_istios_chart_does() -> None:
    configuration = _one(_pilot(), "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    assert _selectors(configuration) == ISTIO_WEBHOOKS
    assert list(_selectors(configuration)) == list(ISTIO_WEBHOOKS), "Istio's order"


def test_injecting_by_default_is_a_component_that_is_off() -> None:
    assert "inject-by-default" not in _kustomization(DEPLOY).get("components", [])
    selectors = _selectors(_with_by_default_component())
    assert selectors == ISTIO_WEBHOOKS | {"auto.sidecar-injector.istio.io": AUTO_WEBHOOK}


def test_every_webhook_calls_pilot_on_443_and_fails_closed() -> None:
    configuration = _with_by_default_component()
    service = _one(_pilot(), "Service", "pilot")
    for webhook in configuration["webhooks"]:
        name = webhook["name"]
        assert webhook["clientConfig"] == {
            "service": {"name": "pilot", "namespace": service["metadata"]["namespace"],
                        "path": "/inject", "port": 443},
        }, f"{name}: no caBundle (pilot writes it), pilot's Service on 443"  # fmt: skip
        assert webhook["failurePolicy"] == "Fail", name
        assert webhook["sideEffects"] == "None", name
        assert webhook["reinvocationPolicy"] == "Never", name
        assert webhook["admissionReviewVersions"] == ["v1"], name
        assert webhook["rules"] == [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
             "resources": ["pods"]}
        ], name  # fmt: skip
    webhook_port = {p["name"]: p for p in service["spec"]["ports"]}["https-webhook"]
    assert (webhook_port["port"], webhook_port["targetPort"]) == (443, "https-webhook")


def test_pilot_serves_the_webhook_on_the_port_the_service_targets() -> None:
    container = _container(_pilot_deployment(), "discovery")
    assert _args(container)["--webhook-addr"] == f"0.0.0.0:{PILOT_PORTS['https-webhook']}"


def test_the_ca_component_mounts_cacerts_for_ca_cert_dir() -> None:
    deployment = _with_ca_component()
    container = _container(deployment, "discovery")
    directory = _args(container)["--ca-cert-dir"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[directory]["readOnly"] is True
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[directory]["name"]]["secret"]["secretName"] == "cacerts"


# --------------------------------------------------------------------------- pilot's CLI


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            instruction, _, rest = stripped.partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile()
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def _entrypoint() -> list[str]:
    entrypoints = [json.loads(rest) for name, rest in _final_stage() if name == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    entrypoint: list[str] = entrypoints[0]
    return entrypoint


def test_every_flag_in_the_manifests_is_one_pilot_accepts() -> None:
    entrypoint = _entrypoint()
    assert entrypoint == ["pilot", "discovery"]
    help_text = subprocess.run(
        [sys.executable, "-m", "pilot", *entrypoint[1:], "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    accepted = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
    used = set(_args(_container(_with_ca_component(), "discovery")))
    assert used <= accepted, f"`pilot discovery` does not accept {sorted(used - accepted)}"


# --------------------------------------------------------------------------- the example


ISTIO_INIT_NEEDS = [
    "istio-init: may run as root",
    "istio-init: capabilities " + str({"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}),
]


def _echo() -> Json:
    return _one(_example(), "Deployment", "echo")


def _injected_echo(tmp_path: Path) -> Json:
    """The echo Deployment as `pilot kube-inject` prints it (what the webhook makes)."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pilot")), "kube-inject", "-f",
         str(EXAMPLE / "deployment.yaml")],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    injected: Json = yaml.safe_load(result.stdout)
    return injected


def test_the_example_is_the_app_alone_in_a_namespace_asking_for_injection() -> None:
    namespace = _one(_example(), "Namespace")
    assert namespace["metadata"]["labels"]["istio-injection"] == "enabled"
    assert not [m for m in _example() if m.kind == "ConfigMap"], "no hand-written bootstrap"
    pod = _echo()["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["echo"]
    assert "initContainers" not in pod and "volumes" not in pod, "no sidecar by hand"
    (container,) = pod["containers"]
    assert not container["image"].startswith("envoyproxy/")
    (port,) = _one(_example(), "Service", "echo")["spec"]["ports"]
    # An HTTP port by name (Istio's protocol selection), at the app's named port.
    assert port["name"] == "http"
    assert port["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_example_namespace_allows_istio_init_and_the_app_meets_restricted(
    tmp_path: Path,
) -> None:
    labels = _one(_example(), "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert not _restricted_violations(_echo()["spec"]["template"]["spec"])
    injected = _injected_echo(tmp_path)["spec"]["template"]["spec"]
    # What "restricted" (and "baseline") would refuse is istio-init's alone: why the
    # namespace enforces "privileged", as Istio's namespaces must without its CNI plugin.
    assert _restricted_violations(injected) == ISTIO_INIT_NEEDS


def test_the_injected_example_reaches_pilot_at_its_service(tmp_path: Path) -> None:
    injected = _injected_echo(tmp_path)["spec"]["template"]["spec"]
    init = {c["name"]: c for c in injected["initContainers"]}
    assert list(init) == ["istio-init", "istio-proxy"]
    args = init["istio-proxy"]["args"]
    service = _one(_pilot(), "Service", "pilot")
    tls_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "https-xds")
    address = f"pilot.{service['metadata']['namespace']}.svc:{tls_port}"
    assert args[args.index("--discovery-address") + 1] == address
    (app,) = injected["containers"]
    assert app["readinessProbe"]["httpGet"]["port"] == 15020, "the probe goes to the agent"


# --------------------------------------------------------------------------- the image


def test_the_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), "--failure-threshold", "style", "Dockerfile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_serves_what_the_manifests_expect() -> None:
    final = _final_stage()
    instructions = dict(final)  # the last of each instruction
    assert final[0][1] == "python:3.11-slim"
    assert instructions["USER"].split(":")[0] == str(PILOT_UID)
    assert {int(p) for p in instructions["EXPOSE"].split()} == set(PILOT_PORTS.values())
    # /ready where the container's own --http-addr points (tests/unit/test_healthcheck.py).
    assert '"pilot.healthcheck"' in instructions["HEALTHCHECK"]
    state = re.search(r"XDG_STATE_HOME=(\S+)", instructions["ENV"])
    assert state is not None and state[1] == "/var/lib/pilot"
    copies = [rest.split() for name, rest in final if name == "COPY"]
    assert ["examples/mesh.yaml", "/etc/pilot/mesh.yaml"] in copies


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match, plus `**`) as a regular expression."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _in_build_context(path: str) -> bool:
    """Whether `docker build` sends this file: the last pattern that matches it or one
    of its parent folders decides, as in Docker's .dockerignore."""
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            include = line.startswith("!")
            rules.append((include, _dockerignore_regex(line.lstrip("!").strip("/"))))
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    sent = True
    for include, regex in rules:
        if any(regex.fullmatch(candidate) for candidate in candidates):
            sent = include
    return sent


def _tracked(*paths: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [line for line in listed.splitlines() if (REPO / line).is_file()]


def test_the_build_context_holds_what_the_dockerfile_copies_and_little_else() -> None:
    sources = [
        source
        for name, rest in _dockerfile()
        if name == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    ]
    assert {"pyproject.toml", "README.md", "pilot"} <= set(sources)
    copied = [p for p in _tracked(*sources) if "__pycache__" not in p]
    assert "pilot/cli/main.py" in copied and "pilot/py.typed" in copied
    missing = [p for p in copied if not _in_build_context(p)]
    assert not missing, f".dockerignore leaves out {missing}"
    sent = [p for p in _tracked() if _in_build_context(p)]
    assert not [p for p in sent if p.startswith(("tests/", "deploy/", "bench/", ".git/"))]
    assert not _in_build_context("pilot/__pycache__/cli.cpython-311.pyc")
