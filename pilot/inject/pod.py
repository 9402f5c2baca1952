"""The injection template: a pod in, the same pod with pilot's sidecar out.

Istio's `injection-template.yaml` (native-sidecar variant) written as Python, shaped
by docs/contract of issue 38: `istio-init` (the capture rules, `pilot agent
iptables`), `istio-proxy` (`pilot agent ... proxy sidecar`: SDS, bootstrap, Envoy),
their volumes, labels and annotations, and the app's probes moved to the agent; a
pod's own `istio-proxy` or `istio-init` is merged over ours (overrides.py).
Pure: the caller's pod is never changed, a new one is returned. Nothing in the
injected spec names an identity: the certificate comes from the pod's own projected
token, and SERVICE_ACCOUNT is read by the downward API, never copied from the pod.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pilot.inject import overrides, probes
from pilot.inject.annotations import STATUS, PodOptions, pod_options, proxy_config_json
from pilot.inject.errors import InjectError
from pilot.inject.settings import InjectSettings
from pilot.inject.shape import (
    dns_label,
    dns_subdomain,
    mapping,
    objects,
    sequence,
    shown,
    strings,
    text,
)

__all__ = ["InjectError", "inject"]

PROXY = "istio-proxy"
INIT = "istio-init"
PROXY_UID = 1337
REVISION = "default"
ENVOY_PORTS = "15090,15021"  # Envoy's Prometheus and its readiness
STATUS_PORT = "15020"  # the agent's status port
SDS_SOCKET = "/var/run/secrets/workload-spiffe-uds/socket"
CONFIG_PATH = "/etc/istio/proxy"
TOKEN_FILE = "/var/run/secrets/tokens/istio-token"
ROOT_CERT = "/var/run/secrets/istio/root-cert.pem"
# Istio's chart default (global.proxy.resources: 2000m, 1024Mi, written as the API server
# and istioctl write them), replaced whole by any resource annotation.
DEFAULT_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "2", "memory": "1Gi"},
}

# (volume, mount path) of istio-proxy, Istio's names and paths.
_MOUNTS = (
    ("workload-socket", "/var/run/secrets/workload-spiffe-uds"),
    ("credential-socket", "/var/run/secrets/credential-uds"),
    ("workload-certs", "/var/run/secrets/workload-spiffe-credentials"),
    ("istiod-ca-cert", "/var/run/secrets/istio"),
    ("istio-data", "/var/lib/istio/data"),
    ("istio-envoy", CONFIG_PATH),
    ("istio-token", "/var/run/secrets/tokens"),
    ("istio-podinfo", "/etc/istio/pod"),
)
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")
_API_VERSION = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?v[0-9]+([a-z]+[0-9]+)?")
_CRON_JOB = re.compile(r"(.+)-\d{8,10}")  # a Job a CronJob made: NAME-<scheduled minute>


def inject(
    pod: dict[str, Any],
    settings: InjectSettings,
    *,
    namespace: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`pod` with the sidecar (a new dict); an injected pod comes back unchanged.

    `namespace` is where the pod is created (else its metadata's, else "default");
    `owner` the workload (kind, apiVersion, name) when the caller knows it (kube-inject),
    else read from the pod's controller reference as Istio does. Raises InjectError.
    """
    if not isinstance(pod, dict):
        raise InjectError(f"expected a pod object, got {type(pod).__name__}")
    new = copy.deepcopy(pod)
    metadata = mapping(new, "metadata", "metadata")
    annotations = strings(metadata, "annotations", "metadata.annotations")
    if STATUS in annotations:
        return new
    labels = strings(metadata, "labels", "metadata.labels")
    spec = mapping(new, "spec", "spec")
    _checked_containers(spec, settings)
    own = overrides.take(spec, (PROXY, INIT))  # the pod's customizations, merged below
    containers, init_containers = _app_containers(spec, own)
    _check_volumes(spec, settings)
    options = pod_options(annotations, settings.max_proxy_config_bytes)
    given = namespace or text(metadata, "namespace", "metadata.namespace") or "default"
    workload = _workload(metadata, labels, dns_label(given, "namespace"), owner)
    native = settings.native_sidecars if options.native_sidecar is None else options.native_sidecar
    probed = [*containers, *(c for c in init_containers if c.get("restartPolicy") == "Always")]
    probers = probes.rewrite(probed) if options.rewrite_probes else {}
    proxy = _proxy_container(
        settings, options, containers=containers, workload=workload, probers=probers, native=native
    )
    init, proxy = _customized(_init_container(settings, options), proxy, own, settings, native)
    _add_to_spec(spec, init, proxy, native=native)
    metadata["labels"] = _labels(labels, workload)
    metadata["annotations"] = _annotations(annotations, containers, native)
    new["metadata"], new["spec"] = metadata, spec
    return new


def _add_to_spec(
    spec: dict[str, Any], init: dict[str, Any], proxy: dict[str, Any], *, native: bool
) -> None:
    """The sidecar's containers before the pod's own, its volumes after, and an fsGroup."""
    containers = spec["containers"]
    init_containers = sequence(spec, "initContainers", "spec.initContainers")
    if native:
        spec["initContainers"] = [init, proxy, *init_containers]
    else:
        spec["initContainers"] = [init, *init_containers]
        spec["containers"] = [proxy, *containers]
    spec["volumes"] = [*sequence(spec, "volumes", "spec.volumes"), *_volumes()]
    security = mapping(spec, "securityContext", "spec.securityContext")
    # The projected token is 0600 to its fsGroup: 1337 must read it (null is unset).
    group = security.get("fsGroup")
    spec["securityContext"] = {**security, "fsGroup": PROXY_UID if group is None else group}


def _checked_containers(spec: dict[str, Any], settings: InjectSettings) -> None:
    """The pod's containers and init containers: their names and sizes checked."""
    containers = objects(spec, "containers", "spec.containers")
    init_containers = objects(spec, "initContainers", "spec.initContainers")
    if not containers:
        raise InjectError("spec.containers: a pod needs at least one container")
    if len(containers) + len(init_containers) > settings.max_containers:
        raise InjectError(
            f"spec: {len(containers) + len(init_containers)} containers, over the injector's"
            f" bound of {settings.max_containers}"
        )
    for field, items in (("containers", containers), ("initContainers", init_containers)):
        for index, container in enumerate(items):
            where = f"spec.{field}[{index}]"
            dns_label(text(container, "name", f"{where}.name"), f"{where}.name")
            env = sequence(container, "env", f"{where}.env")
            if len(env) > settings.max_env:
                raise InjectError(
                    f"{where}.env: {len(env)} entries, over the bound of {settings.max_env}"
                )


def _app_containers(
    spec: dict[str, Any], own: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's containers and init containers once its own istio-* are taken out."""
    containers = objects(spec, "containers", "spec.containers")
    if not containers:
        besides = f" besides {', '.join(own)}" if own else ""
        raise InjectError(f"spec.containers: a pod needs at least one container{besides}")
    return containers, objects(spec, "initContainers", "spec.initContainers")


def _merge_limit(settings: InjectSettings) -> int:
    """The longest env, ports, mounts or devices list a customization may bring."""
    return max(settings.max_env, settings.max_volumes)


def _customized(
    init: dict[str, Any],
    proxy: dict[str, Any],
    own: dict[str, dict[str, Any]],
    settings: InjectSettings,
    native: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's own istio-init and istio-proxy merged over the template's (Istio's
    customizing injection), each checked again as the template's own."""
    if INIT in own:
        init = overrides.merge(init, own[INIT], _merge_limit(settings))
        overrides.check(init, settings, restart=None)
    if PROXY in own:
        proxy = overrides.merge(proxy, own[PROXY], _merge_limit(settings))
        overrides.check(proxy, settings, restart="Always" if native else None)
        # As Istio: iptables must let the proxy's own uid out, whatever uid it runs as.
        security = mapping(own[PROXY], "securityContext", f"{PROXY}.securityContext")
        uid = overrides.user_id(security, "runAsUser", f"{PROXY}.securityContext.runAsUser")
        args = init["args"]
        if uid and "-u" in args[:-1]:
            args[args.index("-u") + 1] = str(uid)
    return init, proxy


def _check_volumes(spec: dict[str, Any], settings: InjectSettings) -> None:
    volumes = objects(spec, "volumes", "spec.volumes")
    if len(volumes) > settings.max_volumes:
        raise InjectError(
            f"spec.volumes: {len(volumes)} volumes, over the bound of {settings.max_volumes}"
        )
    ours = {name for name, _ in _MOUNTS}
    for volume in volumes:
        if volume.get("name") in ours:
            raise InjectError(f"spec.volumes: {shown(volume['name'])} is the injector's own volume")


def _workload(
    metadata: dict[str, Any], labels: dict[str, str], namespace: str, owner: dict[str, Any] | None
) -> dict[str, str]:
    """name, kind, apiVersion of the workload and the pod's namespace (checked: they reach
    the proxy's env and node metadata)."""
    if owner is None:
        owner = _owner_from_pod(metadata, labels)
    name = dns_subdomain(text(owner, "name", "owner name"), "workload name")
    kind = text(owner, "kind", "owner kind") or "Pod"
    api_version = text(owner, "apiVersion", "owner apiVersion") or "v1"
    if not _KIND.fullmatch(kind):
        raise InjectError(f"workload kind: {shown(kind)} is not a Kubernetes kind")
    if not _API_VERSION.fullmatch(api_version):
        raise InjectError(f"workload apiVersion: {shown(api_version)} is not an API version")
    return {"name": name, "kind": kind, "apiVersion": api_version, "namespace": namespace}


def _owner_from_pod(metadata: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """Istio's heuristics: a generated pod's controller names the workload (a ReplicaSet
    with the pod's template hash is its Deployment; a Job named NAME-<minute> a CronJob)."""
    name = text(metadata, "name", "metadata.name")
    references = objects(metadata, "ownerReferences", "metadata.ownerReferences")
    controller = next((ref for ref in references if ref.get("controller") is True), None)
    if not text(metadata, "generateName", "metadata.generateName") or controller is None:
        return {"name": name, "kind": "Pod", "apiVersion": "v1"}
    kind = text(controller, "kind", "ownerReferences kind")
    api_version = text(controller, "apiVersion", "ownerReferences apiVersion")
    owner_name = text(controller, "name", "ownerReferences name") or name
    template_hash = labels.get("pod-template-hash", "")
    if kind == "ReplicaSet" and template_hash and owner_name.endswith(f"-{template_hash}"):
        return {
            "name": owner_name.removesuffix(f"-{template_hash}"),
            "kind": "Deployment",
            "apiVersion": api_version,
        }
    if kind == "Job" and (cron := _CRON_JOB.fullmatch(owner_name)):
        return {"name": cron.group(1), "kind": "CronJob", "apiVersion": "batch/v1"}
    return {"name": owner_name, "kind": kind, "apiVersion": api_version}


def _init_container(settings: InjectSettings, options: PodOptions) -> dict[str, Any]:
    """istio-init: `pilot agent iptables` with istio-iptables' arguments, as root."""
    capture = options.capture
    excluded = _excluded_inbound(capture.exclude_inbound_ports)
    args = ["-p", "15001", "-z", "15006", "-u", str(PROXY_UID), "-m", "REDIRECT",
            "-i", capture.include_outbound_ranges, "-x", capture.exclude_outbound_ranges,
            "-b", capture.include_inbound_ports, "-d", excluded]  # fmt: skip
    if capture.include_outbound_ports is not None:
        args += ["-q", capture.include_outbound_ports]
    if capture.exclude_outbound_ports is not None:
        args += ["-o", capture.exclude_outbound_ports]
    return {
        "name": INIT,
        "image": options.proxy_image or settings.proxy_image,
        "command": ["pilot", "agent", "iptables"],
        "args": args,
        "resources": _resources(options),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
            "readOnlyRootFilesystem": False,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "runAsUser": 0,
        },
    }


def _excluded_inbound(annotation: str) -> str:
    """istio-init's `-d`, in Istio's order: Envoy's ports, the annotation's (checked),
    then the status port unless the annotation has it already."""
    ports = annotation.split(",") if annotation else []
    if STATUS_PORT not in ports:
        ports.append(STATUS_PORT)
    return ",".join([ENVOY_PORTS, *ports])


def _resources(options: PodOptions) -> dict[str, Any]:
    return copy.deepcopy(options.resources if options.resources is not None else DEFAULT_RESOURCES)


def _proxy_container(
    settings: InjectSettings,
    options: PodOptions,
    *,
    containers: list[dict[str, Any]],
    workload: dict[str, str],
    probers: dict[str, dict[str, Any]],
    native: bool,
) -> dict[str, Any]:
    """istio-proxy: `pilot agent ... proxy sidecar` as 1337, read-only, no capability."""
    proxy: dict[str, Any] = {
        "name": PROXY,
        "image": options.proxy_image or settings.proxy_image,
        "command": ["pilot", "agent"],
        "args": _proxy_args(settings, options),
        "ports": [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}],
        "env": _proxy_env(settings, options, containers, workload, probers),
        "readinessProbe": _ready_probe(period=15, failures=4),
        # As Istio's, in both modes: a native sidecar's startup holds the app's start
        # (kubelet waits for it); a classic one's holds its readiness probe until then.
        "startupProbe": _ready_probe(period=1, failures=600),
    }
    if native:
        proxy["restartPolicy"] = "Always"
    elif options.hold_application:
        proxy["lifecycle"] = {"postStart": {"exec": {"command": ["pilot", "agent", "wait"]}}}
    proxy["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsGroup": PROXY_UID,
        "runAsNonRoot": True,
        "runAsUser": PROXY_UID,
    }
    proxy["resources"] = _resources(options)
    proxy["volumeMounts"] = [{"name": name, "mountPath": path} for name, path in _MOUNTS]
    return proxy


def _proxy_args(settings: InjectSettings, options: PodOptions) -> list[str]:
    """What runs, said fully: the agent's files at the volumes' absolute paths; the pod's
    annotations (checked) over the operator's levels and concurrency."""
    concurrency = settings.proxy_concurrency if options.concurrency is None else options.concurrency
    args = [
        "--discovery-address", settings.discovery_address,
        "--proxy-log-level", options.proxy_log_level or settings.proxy_log_level,
        "--concurrency", str(concurrency),
        "--trust-domain", settings.trust_domain,
        "--sds-socket", SDS_SOCKET,
        "--config-path", CONFIG_PATH,
    ]  # fmt: skip
    if options.agent_log_level is not None:
        args += ["--log-level", options.agent_log_level]
    return [*args, "proxy", "sidecar"]


def _ready_probe(*, period: int, failures: int) -> dict[str, Any]:
    """Envoy's /healthz/ready on 15021 (Istio's timings)."""
    return {
        "httpGet": {"path": "/healthz/ready", "port": 15021},
        "initialDelaySeconds": 0,
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def _proxy_env(
    settings: InjectSettings,
    options: PodOptions,
    containers: list[dict[str, Any]],
    workload: dict[str, str],
    probers: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """Istio's env; every pod-chosen value JSON-encoded or checked, none from a shell."""
    ports = [
        port for c in containers for port in objects(c, "ports", f"container {c['name']} ports")
    ]
    env: list[dict[str, Any]] = [
        {"name": "CA_ADDR", "value": settings.ca},
        {"name": "POD_NAME", "valueFrom": _field("metadata.name")},
        {"name": "POD_NAMESPACE", "valueFrom": _field("metadata.namespace")},
        {"name": "INSTANCE_IP", "valueFrom": _field("status.podIP")},
        {"name": "SERVICE_ACCOUNT", "valueFrom": _field("spec.serviceAccountName")},
        {"name": "HOST_IP", "valueFrom": _field("status.hostIP")},
        {"name": "ISTIO_CPU_LIMIT",
         "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}},
        {"name": "PROXY_CONFIG", "value": proxy_config_json(options.proxy_config)},
        {"name": "ISTIO_META_POD_PORTS", "value": json.dumps(ports, separators=(",", ":"))},
        {"name": "ISTIO_META_APP_CONTAINERS", "value": ",".join(c["name"] for c in containers)},
        {"name": "ISTIO_META_CLUSTER_ID", "value": settings.cluster_id},
        {"name": "ISTIO_META_NODE_NAME", "valueFrom": _field("spec.nodeName")},
        {"name": "ISTIO_META_INTERCEPTION_MODE", "value": "REDIRECT"},
    ]  # fmt: skip
    if workload["name"]:
        owner = (
            f"kubernetes://apis/{workload['apiVersion']}/namespaces/{workload['namespace']}/"
            f"{workload['kind'].lower()}s/{workload['name']}"
        )
        env.append({"name": "ISTIO_META_WORKLOAD_NAME", "value": workload["name"]})
        env.append({"name": "ISTIO_META_OWNER", "value": owner})
    env += [
        {"name": "ISTIO_META_MESH_ID", "value": settings.trust_domain},
        {"name": "TRUST_DOMAIN", "value": settings.trust_domain},
        {"name": "CA_TOKEN_FILE", "value": TOKEN_FILE},
        {"name": "CA_ROOT_CERT", "value": ROOT_CERT},
    ]
    if probers:
        env.append({"name": "ISTIO_KUBE_APP_PROBERS", "value": probes.probers_json(probers)})
    return env


def _volumes() -> list[dict[str, Any]]:
    """Istio's volumes: emptyDirs for the sockets and bootstrap, the pod's own projected
    token (audience istio-ca), the root ConfigMap, the downward API's labels."""
    return [
        {"name": "workload-socket", "emptyDir": {}},
        {"name": "credential-socket", "emptyDir": {}},
        {"name": "workload-certs", "emptyDir": {}},
        {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
        {"name": "istio-data", "emptyDir": {}},
        {"name": "istio-podinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}},
        {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
            "path": "istio-token", "expirationSeconds": 43200, "audience": "istio-ca"}}]}},
        {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
    ]  # fmt: skip


def _label_value(value: str) -> str:
    """Istio's `trunc 63 | trimAll "-_."`: a valid label value from a longer name."""
    return value[:63].strip("-_.")


def _labels(labels: dict[str, str], workload: dict[str, str]) -> dict[str, str]:
    """tlsMode and the canonical service labels; values the pod set are kept."""
    name = (
        labels.get("service.istio.io/canonical-name")
        or labels.get("app.kubernetes.io/name")
        or labels.get("app")
        or _label_value(workload["name"])
    )
    revision = (
        labels.get("service.istio.io/canonical-revision")
        or labels.get("app.kubernetes.io/version")
        or labels.get("version")
        or "latest"
    )
    added = {"security.istio.io/tlsMode": labels.get("security.istio.io/tlsMode") or "istio"}
    if name:
        added["service.istio.io/canonical-name"] = name
    added["service.istio.io/canonical-revision"] = revision
    return {**labels, **added}


def _annotations(
    annotations: dict[str, str], containers: list[dict[str, Any]], native: bool
) -> dict[str, str]:
    """The status (what was added, so a second injection changes nothing), the default
    container for kubectl, and Prometheus' scrape of Envoy's own endpoint."""
    status = {
        "initContainers": [INIT, PROXY] if native else [INIT],
        "containers": None if native else [PROXY],
        "volumes": [volume["name"] for volume in _volumes()],
        "imagePullSecrets": None,
        "revision": REVISION,
    }
    first = containers[0]["name"]
    added = {
        "istio.io/rev": REVISION,  # Istio's template says which revision injected the pod
        "kubectl.kubernetes.io/default-container": first,
        "kubectl.kubernetes.io/default-logs-container": first,
    }
    if not any(key.startswith("prometheus.io/") for key in annotations):
        added.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "15090",
                "prometheus.io/path": "/stats/prometheus",
            }
        )
    # What the pod set is kept; the status is always the injector's.
    return {**added, **annotations, STATUS: json.dumps(status, separators=(",", ":"))}
