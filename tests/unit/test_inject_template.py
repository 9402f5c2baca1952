"""The injected pod, field by field against issue 38's contract (Istio's template,
native-sidecar variant), and what a second injection does (nothing)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.support.inject_pods import app_pod

SETTINGS = InjectSettings(proxy_image="registry.example/pilot-proxy:9")


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(item for item in items if item["name"] == name)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container["env"]}


def test_native_sidecars_come_first_among_init_containers() -> None:
    pod = app_pod(initContainers=[{"name": "migrate", "image": "registry.example/migrate"}])
    spec = inject(pod, SETTINGS, namespace="shop")["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["istio-init", "istio-proxy", "migrate"]
    assert [c["name"] for c in spec["containers"]] == ["web"]
    assert spec["initContainers"][1]["restartPolicy"] == "Always"


@pytest.mark.parametrize(
    ("settings", "annotations"),
    [
        (InjectSettings(native_sidecars=False), {}),
        (SETTINGS, {"sidecar.istio.io/nativeSidecar": "false"}),
    ],
)
def test_classic_mode_puts_the_proxy_first_among_containers(
    settings: InjectSettings, annotations: dict[str, str]
) -> None:
    spec = inject(app_pod(annotations=annotations), settings, namespace="shop")["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["istio-init"]
    assert [c["name"] for c in spec["containers"]] == ["istio-proxy", "web"]
    proxy = spec["containers"][0]
    assert "restartPolicy" not in proxy
    assert "lifecycle" not in proxy
    # Istio's startupProbe in classic mode too: readiness is not probed until Envoy is up.
    assert proxy["startupProbe"] == {"httpGet": {"path": "/healthz/ready", "port": 15021},
                                     "initialDelaySeconds": 0, "periodSeconds": 1,
                                     "timeoutSeconds": 3, "failureThreshold": 600}  # fmt: skip


def test_the_annotation_turns_native_sidecars_on_against_the_setting() -> None:
    pod = app_pod(annotations={"sidecar.istio.io/nativeSidecar": "true"})
    spec = inject(pod, InjectSettings(native_sidecars=False), namespace="shop")["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["istio-init", "istio-proxy"]


def test_istio_init_runs_the_capture_rules_as_root_with_two_capabilities() -> None:
    init = inject(app_pod(), SETTINGS, namespace="shop")["spec"]["initContainers"][0]
    assert init["image"] == "registry.example/pilot-proxy:9"
    assert init["command"] == ["pilot", "agent", "iptables"]
    assert init["args"] == ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
                            "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"]  # fmt: skip
    assert init["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
        "readOnlyRootFilesystem": False,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "runAsUser": 0,
    }


def test_istio_proxy_says_fully_what_runs() -> None:
    settings = InjectSettings(
        discovery_address="pilot.mesh.svc:15012", proxy_log_level="debug", proxy_concurrency=4
    )
    proxy = inject(app_pod(), settings, namespace="shop")["spec"]["initContainers"][1]
    assert proxy["command"] == ["pilot", "agent"]
    args = proxy["args"]
    assert args[:6] == ["--discovery-address", "pilot.mesh.svc:15012", "--proxy-log-level",
                        "debug", "--concurrency", "4"]  # fmt: skip
    assert args[-2:] == ["proxy", "sidecar"]
    # The agent's files at the volumes' absolute paths, never relative to its cwd.
    assert args[args.index("--sds-socket") + 1] == "/var/run/secrets/workload-spiffe-uds/socket"
    assert args[args.index("--config-path") + 1] == "/etc/istio/proxy"


def test_istio_proxy_runs_as_1337_read_only_with_no_capability() -> None:
    spec = inject(app_pod(), SETTINGS, namespace="shop")["spec"]
    proxy = spec["initContainers"][1]
    assert proxy["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsGroup": 1337,
        "runAsNonRoot": True,
        "runAsUser": 1337,
    }
    assert spec["securityContext"] == {"fsGroup": 1337}
    assert proxy["ports"] == [
        {"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}
    ]
    assert proxy["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"cpu": "2", "memory": "1Gi"}}  # fmt: skip


def test_a_pods_own_fs_group_is_kept() -> None:
    pod = app_pod(securityContext={"fsGroup": 2000, "runAsUser": 1000})
    spec = inject(pod, SETTINGS, namespace="shop")["spec"]
    assert spec["securityContext"] == {"fsGroup": 2000, "runAsUser": 1000}


def test_readiness_and_startup_probes_are_envoys_readiness() -> None:
    proxy = inject(app_pod(), SETTINGS, namespace="shop")["spec"]["initContainers"][1]
    ready = {"path": "/healthz/ready", "port": 15021}
    assert proxy["readinessProbe"] == {"httpGet": ready, "initialDelaySeconds": 0,
                                       "periodSeconds": 15, "timeoutSeconds": 3,
                                       "failureThreshold": 4}  # fmt: skip
    assert proxy["startupProbe"]["httpGet"] == ready
    assert proxy["startupProbe"]["periodSeconds"] == 1


def test_the_proxys_env_is_istios() -> None:
    pod = app_pod(labels={"service.istio.io/workload-name": "ignored"})
    pod["spec"]["containers"].append({"name": "metrics", "image": "registry.example/m",
                                      "ports": [{"containerPort": 9100}]})  # fmt: skip
    settings = InjectSettings(
        ca_address="ca.example:15012", cluster_id="west", trust_domain="td.example"
    )
    env = _env(inject(pod, settings, namespace="shop")["spec"]["initContainers"][1])
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["INSTANCE_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["SERVICE_ACCOUNT"] == {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    assert env["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["ISTIO_META_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["ISTIO_CPU_LIMIT"] == {
        "resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}
    }
    assert env["PROXY_CONFIG"] == "{}"
    assert json.loads(env["ISTIO_META_POD_PORTS"]) == [
        {"containerPort": 8080, "name": "http", "protocol": "TCP"},
        {"containerPort": 9100},
    ]
    assert env["ISTIO_META_APP_CONTAINERS"] == "web,metrics"
    assert env["ISTIO_META_CLUSTER_ID"] == "west"
    assert env["ISTIO_META_INTERCEPTION_MODE"] == "REDIRECT"
    assert env["ISTIO_META_WORKLOAD_NAME"] == "web-1"
    assert env["ISTIO_META_OWNER"] == "kubernetes://apis/v1/namespaces/shop/pods/web-1"
    assert env["ISTIO_META_MESH_ID"] == env["TRUST_DOMAIN"] == "td.example"
    assert env["CA_ADDR"] == "ca.example:15012"
    assert env["CA_TOKEN_FILE"] == "/var/run/secrets/tokens/istio-token"
    assert env["CA_ROOT_CERT"] == "/var/run/secrets/istio/root-cert.pem"
    assert "ISTIO_KUBE_APP_PROBERS" not in env  # no probe was rewritten


def test_ca_addr_is_the_discovery_address_unless_named() -> None:
    env = _env(inject(app_pod(), SETTINGS, namespace="shop")["spec"]["initContainers"][1])
    assert env["CA_ADDR"] == "pilot.pilot-system.svc:15012"


def test_a_deployments_pod_names_its_deployment_as_owner() -> None:
    pod = app_pod(labels={"pod-template-hash": "7d9f8"})
    pod["metadata"] = {
        "generateName": "web-7d9f8-",
        "labels": pod["metadata"]["labels"],
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8",
                             "uid": "u", "controller": True}],
    }  # fmt: skip
    env = _env(inject(pod, SETTINGS, namespace="shop")["spec"]["initContainers"][1])
    assert env["ISTIO_META_WORKLOAD_NAME"] == "web"
    assert env["ISTIO_META_OWNER"] == "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"


def test_a_cron_jobs_pod_names_its_cron_job() -> None:
    pod = app_pod()
    pod["metadata"] = {
        "generateName": "report-28391234-",
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "report-28391234",
                             "uid": "u", "controller": True}],
    }  # fmt: skip
    pod["spec"]["restartPolicy"] = "Never"
    metadata = inject(pod, SETTINGS, namespace="jobs")["metadata"]
    env = _env(inject(pod, SETTINGS, namespace="jobs")["spec"]["initContainers"][1])
    assert env["ISTIO_META_OWNER"] == "kubernetes://apis/batch/v1/namespaces/jobs/cronjobs/report"
    assert metadata["labels"]["service.istio.io/canonical-name"] == "report"


def test_the_volumes_and_mounts_are_istios() -> None:
    pod = app_pod(volumes=[{"name": "data", "emptyDir": {}}])
    spec = inject(pod, SETTINGS, namespace="shop")["spec"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert next(iter(volumes)) == "data"
    assert volumes["istio-envoy"] == {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}
    assert volumes["istiod-ca-cert"]["configMap"] == {"name": "istio-ca-root-cert"}
    assert volumes["istio-token"]["projected"] == {"sources": [{"serviceAccountToken": {
        "path": "istio-token", "expirationSeconds": 43200, "audience": "istio-ca"}}]}  # fmt: skip
    assert [
        item["fieldRef"]["fieldPath"] for item in volumes["istio-podinfo"]["downwardAPI"]["items"]
    ] == [
        "metadata.labels",
        "metadata.annotations",
    ]
    mounts = {m["name"]: m["mountPath"] for m in spec["initContainers"][1]["volumeMounts"]}
    assert mounts == {
        "workload-socket": "/var/run/secrets/workload-spiffe-uds",
        "credential-socket": "/var/run/secrets/credential-uds",
        "workload-certs": "/var/run/secrets/workload-spiffe-credentials",
        "istiod-ca-cert": "/var/run/secrets/istio",
        "istio-data": "/var/lib/istio/data",
        "istio-envoy": "/etc/istio/proxy",
        "istio-token": "/var/run/secrets/tokens",
        "istio-podinfo": "/etc/istio/pod",
    }
    assert set(mounts) <= set(volumes)


def test_labels_are_added_and_the_pods_own_kept() -> None:
    labels = inject(app_pod(), SETTINGS, namespace="shop")["metadata"]["labels"]
    assert labels == {
        "app": "web",
        "security.istio.io/tlsMode": "istio",
        "service.istio.io/canonical-name": "web",
        "service.istio.io/canonical-revision": "latest",
    }
    own = app_pod(labels={"app.kubernetes.io/name": "shop-web", "version": "v2",
                          "service.istio.io/canonical-revision": "blue"})  # fmt: skip
    labels = inject(own, SETTINGS, namespace="shop")["metadata"]["labels"]
    assert labels["service.istio.io/canonical-name"] == "shop-web"
    assert labels["service.istio.io/canonical-revision"] == "blue"


def test_annotations_say_what_was_injected() -> None:
    annotations = inject(app_pod(), SETTINGS, namespace="shop")["metadata"]["annotations"]
    assert json.loads(annotations["sidecar.istio.io/status"]) == {
        "initContainers": ["istio-init", "istio-proxy"],
        "containers": None,
        "volumes": ["workload-socket", "credential-socket", "workload-certs", "istio-envoy",
                    "istio-data", "istio-podinfo", "istio-token", "istiod-ca-cert"],
        "imagePullSecrets": None,
        "revision": "default",
    }  # fmt: skip
    assert annotations["istio.io/rev"] == "default"
    assert annotations["kubectl.kubernetes.io/default-container"] == "web"
    assert annotations["kubectl.kubernetes.io/default-logs-container"] == "web"
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "15090"
    assert annotations["prometheus.io/path"] == "/stats/prometheus"


def test_the_pods_own_prometheus_and_default_container_annotations_are_kept() -> None:
    pod = app_pod(annotations={"prometheus.io/port": "9100",
                               "kubectl.kubernetes.io/default-container": "other"})  # fmt: skip
    annotations = inject(pod, SETTINGS, namespace="shop")["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations
    assert annotations["prometheus.io/port"] == "9100"
    assert annotations["kubectl.kubernetes.io/default-container"] == "other"


@pytest.mark.parametrize("native", [True, False])
def test_injecting_an_injected_pod_changes_nothing(native: bool) -> None:
    settings = InjectSettings(native_sidecars=native)
    once = inject(app_pod(), settings, namespace="shop")
    assert inject(once, settings, namespace="shop") == once


def test_the_callers_pod_is_left_as_it_was() -> None:
    pod = app_pod()
    before = json.dumps(pod)
    inject(pod, SETTINGS, namespace="shop")
    assert json.dumps(pod) == before


def test_holding_the_app_in_classic_mode_waits_in_post_start() -> None:
    pod = app_pod(annotations={"proxy.istio.io/config": "holdApplicationUntilProxyStarts: true"})
    spec = inject(pod, InjectSettings(native_sidecars=False), namespace="shop")["spec"]
    proxy = spec["containers"][0]
    assert proxy["name"] == "istio-proxy"
    assert proxy["lifecycle"] == {"postStart": {"exec": {"command": ["pilot", "agent", "wait"]}}}
    assert _env(proxy)["PROXY_CONFIG"] == '{"holdApplicationUntilProxyStarts":true}'


def test_holding_the_app_with_native_sidecars_is_the_startup_probe() -> None:
    pod = app_pod(
        annotations={"proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}'}
    )
    proxy = inject(pod, SETTINGS, namespace="shop")["spec"]["initContainers"][1]
    assert "lifecycle" not in proxy
    assert proxy["startupProbe"]["httpGet"]["port"] == 15021


def test_a_null_fs_group_is_unset() -> None:
    spec = inject(app_pod(securityContext={"fsGroup": None}), SETTINGS, namespace="shop")["spec"]
    assert spec["securityContext"] == {"fsGroup": 1337}
