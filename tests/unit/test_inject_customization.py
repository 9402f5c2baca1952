"""Istio's "customizing injection": a pod's own `istio-proxy` (or `istio-init`) is merged
over the injected one as Istio's webhook merges it (a strategic merge by container
name), wherever the pod declared it; the result is checked again as the template's
own, and a customization that would make a broken pod is refused on one line."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.review import ReviewError, answer
from pilot.inject.settings import InjectSettings
from tests.support.admission import review_body
from tests.support.inject_pods import app_pod, probed_pod
from tests.support.json_patch import apply_patch

NATIVE = InjectSettings(proxy_image="registry.example/pilot-proxy:1")
CLASSIC = InjectSettings(proxy_image="registry.example/pilot-proxy:1", native_sidecars=False)


def _istio_docs_pod() -> dict[str, Any]:
    """The example of Istio's docs: an istio-proxy among the app's containers."""
    pod = app_pod()
    pod["spec"]["containers"].append({
        "name": "istio-proxy",
        "image": "auto",
        "resources": {"requests": {"cpu": "500m"}},
        "volumeMounts": [{"mountPath": "/etc/certs", "name": "certs"}],
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}},
    })  # fmt: skip
    pod["spec"]["volumes"] = [{"name": "certs", "secret": {"secretName": "istio-certs"}}]
    return pod


def _proxy(injected: dict[str, Any]) -> dict[str, Any]:
    spec = injected["spec"]
    found = [c for c in [*spec["containers"], *spec.get("initContainers", [])]
             if c["name"] == "istio-proxy"]  # fmt: skip
    assert len(found) == 1
    return dict(found[0])


def _init(injected: dict[str, Any]) -> dict[str, Any]:
    first = injected["spec"]["initContainers"][0]
    assert first["name"] == "istio-init"
    return dict(first)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry for entry in container["env"]}


def _with_proxy(container: dict[str, Any], *, init: bool = False) -> dict[str, Any]:
    pod = app_pod()
    field = "initContainers" if init else "containers"
    pod["spec"].setdefault(field, []).append({"name": "istio-proxy", **container})
    return pod


def test_the_docs_example_is_merged_into_the_native_sidecar() -> None:
    plain = _proxy(inject(app_pod(), NATIVE, namespace="shop"))
    injected = inject(_istio_docs_pod(), NATIVE, namespace="shop")
    spec = injected["spec"]
    assert [c["name"] for c in spec["containers"]] == ["web"]
    assert [c["name"] for c in spec["initContainers"]] == ["istio-init", "istio-proxy"]
    proxy = _proxy(injected)
    assert proxy["image"] == "registry.example/pilot-proxy:1"  # `auto` is the injector's
    assert proxy["restartPolicy"] == "Always"
    assert proxy["resources"] == {"requests": {"cpu": "500m", "memory": "128Mi"},
                                  "limits": {"cpu": "2", "memory": "1Gi"}}  # fmt: skip
    assert proxy["volumeMounts"] == [*plain["volumeMounts"],
                                     {"mountPath": "/etc/certs", "name": "certs"}]  # fmt: skip
    assert proxy["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "10"]}}}
    assert proxy["args"] == plain["args"]
    assert proxy["env"] == plain["env"]  # the app's containers are still just `web`
    assert _env(proxy)["ISTIO_META_APP_CONTAINERS"]["value"] == "web"
    assert injected["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "web"


def test_in_classic_mode_it_is_the_first_container_with_its_lifecycle_beside_ours() -> None:
    pod = _istio_docs_pod()
    pod["metadata"]["annotations"] = {
        "proxy.istio.io/config": "holdApplicationUntilProxyStarts: true"
    }
    injected = inject(pod, CLASSIC, namespace="shop")
    assert [c["name"] for c in injected["spec"]["containers"]] == ["istio-proxy", "web"]
    assert [c["name"] for c in injected["spec"]["initContainers"]] == ["istio-init"]
    proxy = _proxy(injected)
    assert "restartPolicy" not in proxy
    assert proxy["lifecycle"] == {
        "postStart": {"exec": {"command": ["pilot", "agent", "wait"]}},
        "preStop": {"exec": {"command": ["sleep", "10"]}},
    }


@pytest.mark.parametrize("settings_", [NATIVE, CLASSIC])
def test_a_native_sidecar_declared_in_init_containers_is_merged_where_the_mode_puts_it(
    settings_: InjectSettings,
) -> None:
    pod = _with_proxy({"restartPolicy": "Always", "image": "registry.example/own:2"}, init=True)
    if not settings_.native_sidecars:
        del pod["spec"]["initContainers"][0]["restartPolicy"]
    injected = inject(pod, settings_, namespace="shop")
    names = [
        c["name"] for c in [*injected["spec"]["initContainers"], *injected["spec"]["containers"]]
    ]
    assert names.count("istio-proxy") == 1
    assert _proxy(injected)["image"] == "registry.example/own:2"


def test_env_merges_by_name_and_a_source_replaces_ours() -> None:
    pod = _with_proxy({"env": [
        {"name": "ISTIO_META_CLUSTER_ID", "value": "east"},
        {"name": "POD_NAME", "value": "fixed"},
        {"name": "EXTRA", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]})  # fmt: skip
    env = _env(_proxy(inject(pod, NATIVE, namespace="shop")))
    assert env["ISTIO_META_CLUSTER_ID"] == {"name": "ISTIO_META_CLUSTER_ID", "value": "east"}
    assert env["POD_NAME"] == {"name": "POD_NAME", "value": "fixed"}  # not value and valueFrom
    assert env["EXTRA"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["CA_ADDR"]["value"] == NATIVE.ca  # the rest kept


def test_args_and_command_replace_ours_and_ports_merge_by_number() -> None:
    pod = _with_proxy({
        "args": ["--discovery-address", "other.example:15012", "proxy", "sidecar"],
        "ports": [{"containerPort": 15090, "name": "metrics"}, {"containerPort": 15000}],
    })  # fmt: skip
    proxy = _proxy(inject(pod, NATIVE, namespace="shop"))
    assert proxy["args"] == ["--discovery-address", "other.example:15012", "proxy", "sidecar"]
    assert proxy["command"] == ["pilot", "agent"]
    assert proxy["ports"] == [
        {"containerPort": 15090, "name": "metrics", "protocol": "TCP"},
        {"containerPort": 15000},
    ]


def test_a_probe_handler_replaces_ours_and_its_timings_merge() -> None:
    pod = _with_proxy({"readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 30}})
    probe = _proxy(inject(pod, NATIVE, namespace="shop"))["readinessProbe"]
    assert probe == {"exec": {"command": ["true"]}, "initialDelaySeconds": 0,
                     "periodSeconds": 30, "timeoutSeconds": 3, "failureThreshold": 4}  # fmt: skip


def test_the_proxys_own_probes_are_not_moved_to_the_agent() -> None:
    pod = probed_pod()
    pod["spec"]["containers"].append(
        {"name": "istio-proxy", "livenessProbe": {"tcpSocket": {"port": 15021}}}
    )
    injected = inject(pod, NATIVE, namespace="shop")
    proxy = _proxy(injected)
    assert proxy["livenessProbe"] == {"tcpSocket": {"port": 15021}}
    probers = json.loads(_env(proxy)["ISTIO_KUBE_APP_PROBERS"]["value"])
    assert all(path.startswith("/app-health/web/") for path in probers)


def test_the_proxys_uid_is_the_one_istio_init_lets_out() -> None:
    pod = _with_proxy({"securityContext": {"runAsUser": 1500, "runAsGroup": 1500}})
    injected = inject(pod, NATIVE, namespace="shop")
    proxy, init = _proxy(injected), _init(injected)
    assert proxy["securityContext"]["runAsUser"] == 1500
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True  # the rest is ours
    assert proxy["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["args"][init["args"].index("-u") + 1] == "1500"
    assert init["securityContext"]["runAsUser"] == 0  # iptables still runs as root


def test_a_root_proxy_leaves_istio_init_on_1337_as_istio_does() -> None:
    injected = inject(_with_proxy({"securityContext": {"runAsUser": 0}}), NATIVE)
    args = _init(injected)["args"]
    assert args[args.index("-u") + 1] == "1337"  # iptables' --uid-owner 0 would free root


def test_a_pods_own_istio_init_is_merged_over_ours() -> None:
    pod = app_pod(initContainers=[
        {"name": "migrate", "image": "registry.example/migrate:1"},
        {"name": "istio-init", "image": "auto", "resources": {"limits": {"cpu": "50m"}}},
    ])  # fmt: skip
    for chosen in (NATIVE, CLASSIC):
        injected = inject(pod, chosen, namespace="shop")
        names = [c["name"] for c in injected["spec"]["initContainers"]]
        assert names[0] == "istio-init"
        assert names.count("istio-init") == 1
        assert "migrate" in names
        init = _init(injected)
        assert init["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                     "limits": {"cpu": "50m", "memory": "1Gi"}}  # fmt: skip
        assert init["command"] == ["pilot", "agent", "iptables"]


@pytest.mark.parametrize("settings_", [NATIVE, CLASSIC])
def test_the_webhooks_patch_gives_the_customized_pod(settings_: InjectSettings) -> None:
    pod = _istio_docs_pod()
    response = json.loads(answer(review_body(pod), "application/json", settings_))["response"]
    assert response["allowed"] is True
    patch = json.loads(base64.b64decode(response["patch"]))
    assert apply_patch(pod, patch) == inject(pod, settings_, namespace="shop")


def test_injecting_a_customized_pod_twice_changes_nothing() -> None:
    injected = inject(_istio_docs_pod(), NATIVE, namespace="shop")
    assert inject(injected, NATIVE, namespace="shop") == injected


# --- hostile customizations ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "settings_", "why"),
    [
        ({"restartPolicy": "Never"}, NATIVE, "restartPolicy"),
        ({"restartPolicy": "Always"}, CLASSIC, "restartPolicy"),
        ({"image": "registry.example/p:1\n--x"}, NATIVE, "not an image reference"),
        ({"image": "-p"}, NATIVE, "not an image reference"),
        ({"image": 7}, NATIVE, "not an image reference"),
        ({"image": ""}, NATIVE, "not an image reference"),
        ({"args": ["proxy", 1]}, NATIVE, "list of strings"),
        ({"args": "proxy sidecar"}, NATIVE, "expected a list"),
        ({"command": [None]}, NATIVE, "list of strings"),
        ({"env": "A=1"}, NATIVE, "expected a list"),
        ({"env": [["A", "1"]]}, NATIVE, "expected an object with name"),
        ({"env": [{"value": "1"}]}, NATIVE, "expected an object with name"),
        ({"env": [{"name": 5, "value": "1"}]}, NATIVE, "needs a name"),
        ({"env": [{"name": f"E{n}", "value": "x"} for n in range(990)]}, NATIVE, "over the bound"),
        ({"volumeMounts": [{"name": "certs"}]}, NATIVE, "expected an object with mountPath"),
        (
            {"volumeMounts": [{"name": "v", "mountPath": f"/m{n}"} for n in range(100_000)]},
            NATIVE,
            "100000 entries, over the bound of 1000",
        ),
        (
            {"ports": [{"containerPort": 1 + n % 65535} for n in range(100_000)]},
            NATIVE,
            "over the bound",
        ),
        ({"env": [{"name": {"a": 1}, "value": "1"}]}, NATIVE, "needs a name"),
        ({"volumeMounts": [{"mountPath": "/x"}]}, NATIVE, "needs a name and a mountPath"),
        ({"ports": [{"containerPort": "15000"}]}, NATIVE, "not a port"),
        ({"ports": [{"containerPort": 70000}]}, NATIVE, "not a port"),
        ({"ports": [{"containerPort": True}]}, NATIVE, "not a port"),
        ({"securityContext": {"runAsUser": "1337; true"}}, NATIVE, "not a user or group id"),
        ({"securityContext": {"runAsUser": True}}, NATIVE, "not a user or group id"),
        ({"securityContext": {"runAsUser": -1}}, NATIVE, "not a user or group id"),
        ({"securityContext": {"runAsUser": 2**31}}, NATIVE, "not a user or group id"),
        ({"securityContext": {"runAsGroup": 1.5}}, NATIVE, "not a user or group id"),
        ({"securityContext": "root"}, NATIVE, "expected an object"),
        ({"resources": "lots"}, NATIVE, "istio-proxy.resources: expected an object"),
        ({"readinessProbe": ["exec"]}, NATIVE, "istio-proxy.readinessProbe: expected an object"),
        ({"lifecycle": "sleep"}, CLASSIC, "expected an object"),
    ],
)
def test_a_customization_that_would_break_the_pod_is_refused(
    container: dict[str, Any], settings_: InjectSettings, why: str
) -> None:
    with pytest.raises(InjectError, match=why) as refused:
        inject(_with_proxy(container), settings_, namespace="shop")
    message = str(refused.value)
    assert "\n" not in message
    assert len(message) < 300


def test_an_istio_init_that_would_keep_running_is_refused() -> None:
    pod = app_pod(initContainers=[{"name": "istio-init", "restartPolicy": "Always"}])
    with pytest.raises(InjectError, match=r"istio-init\.restartPolicy"):
        inject(pod, NATIVE, namespace="shop")


def test_two_istio_proxies_are_refused() -> None:
    pod = _with_proxy({})
    pod["spec"]["initContainers"] = [{"name": "istio-proxy", "restartPolicy": "Always"}]
    with pytest.raises(InjectError, match="more than one container named istio-proxy"):
        inject(pod, NATIVE, namespace="shop")


def test_a_pod_of_only_istio_proxy_is_refused() -> None:
    pod = app_pod()
    pod["spec"]["containers"][0]["name"] = "istio-proxy"
    with pytest.raises(InjectError, match="at least one container besides istio-proxy"):
        inject(pod, NATIVE, namespace="shop")


def test_a_deeply_nested_customization_is_answered() -> None:
    deep: Any = {}
    for _ in range(900):
        deep = {"x": deep}
    body = review_body(_with_proxy({"securityContext": {"seLinuxOptions": deep}}))
    try:
        response = json.loads(answer(body, "application/json", NATIVE))["response"]
    except ReviewError as error:
        assert error.status == 400
        return
    assert response["allowed"] in (True, False)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
_FIELDS = ["image", "args", "command", "env", "ports", "volumeMounts", "resources",
           "lifecycle", "securityContext", "readinessProbe", "startupProbe", "restartPolicy",
           "workingDir"]  # fmt: skip


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=300)
@given(st.sampled_from(_FIELDS), _json, st.booleans())
def test_any_value_in_a_customization_is_answered(field: str, value: Any, init: bool) -> None:
    pod = _with_proxy({field: copy.deepcopy(value)}, init=init)
    response = json.loads(answer(review_body(pod, uid="u"), "application/json", NATIVE))
    assert response["response"]["uid"] == "u"
    if response["response"]["allowed"] is False:
        assert "\n" not in response["response"]["status"]["message"]
