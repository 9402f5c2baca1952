"""`pilot kube-inject` as a user runs it: every workload kind in multi-document YAML and
in JSON, printed injected in order and in the same format, other documents unchanged;
hostile files refused whole with one line naming the document."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.support.ca import new_ca
from tests.support.inject_pods import app_pod, customized_pod, workload

KINDS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"]
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
}


def kube_inject(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pilot", "kube-inject", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _template(document: dict[str, Any]) -> dict[str, Any]:
    spec = document["spec"]
    return dict(
        spec["jobTemplate"]["spec"]["template"]
        if document["kind"] == "CronJob"
        else spec["template"]
    )


def _names(containers: list[dict[str, Any]]) -> list[str]:
    return [container["name"] for container in containers]


def _documents() -> list[dict[str, Any]]:
    pod = app_pod(name="solo")
    pod["metadata"]["namespace"] = "shop"
    return [*(workload(kind) for kind in KINDS), SERVICE, pod]


def _check_injected(documents: list[dict[str, Any]], printed: list[dict[str, Any]]) -> None:
    assert [d["kind"] for d in printed] == [d["kind"] for d in documents]
    for before, after in zip(documents, printed, strict=True):
        if before["kind"] == "Service":
            assert after == before
            continue
        template = after if after["kind"] == "Pod" else _template(after)
        assert _names(template["spec"]["initContainers"]) == ["istio-init", "istio-proxy"]
        assert _names(template["spec"]["containers"]) == ["web"]
        env = {e["name"]: e.get("value") for e in template["spec"]["initContainers"][1]["env"]}
        name = before["metadata"]["name"]
        plural = before["kind"].lower() + "s"
        assert env["ISTIO_META_OWNER"] == (
            f"kubernetes://apis/{before['apiVersion']}/namespaces/shop/{plural}/{name}"
        )
        if before["kind"] != "Pod":
            assert _without_template(after) == _without_template(before)  # only the pod changed


def _without_template(document: dict[str, Any]) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    spec = copied["spec"]["jobTemplate"]["spec"] if copied["kind"] == "CronJob" else copied["spec"]
    del spec["template"]
    return copied


def test_every_workload_kind_in_multi_document_yaml(tmp_path: Path) -> None:
    documents = _documents()
    source = tmp_path / "app.yaml"
    source.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    done = kube_inject("-f", str(source))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    _check_injected(documents, list(yaml.safe_load_all(done.stdout)))


def test_json_in_json_out_and_a_list_of_workloads(tmp_path: Path) -> None:
    documents = _documents()
    listed = {"apiVersion": "v1", "kind": "List", "items": documents[:2]}
    text = json.dumps(listed) + "\n" + "\n".join(json.dumps(d, indent=1) for d in documents[2:])
    source = tmp_path / "app.json"
    source.write_text(text)
    done = kube_inject("-f", str(source))
    assert done.returncode == 0, done.stderr
    decoder, printed, position = json.JSONDecoder(), [], 0
    while position < len(done.stdout.rstrip()):
        document, position = decoder.raw_decode(done.stdout, position)
        printed.append(document)
        position += len(done.stdout[position:]) - len(done.stdout[position:].lstrip())
    assert printed[0]["kind"] == "List"
    _check_injected(documents, [*printed[0]["items"], *printed[1:]])


def test_standard_input_and_an_output_file(tmp_path: Path) -> None:
    target = tmp_path / "out.yaml"
    done = kube_inject("-f", "-", "-o", str(target), stdin=yaml.safe_dump(workload("Deployment")))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    printed = yaml.safe_load(target.read_text())
    assert _names(_template(printed)["spec"]["initContainers"]) == ["istio-init", "istio-proxy"]


def test_the_pod_template_is_what_the_webhook_would_make() -> None:
    """The same template: kube-inject's pod is inject()'s for the same workload."""
    deployment = workload("Deployment")
    done = kube_inject("-f", "-", stdin=yaml.safe_dump(deployment))
    assert done.returncode == 0, done.stderr
    owner = {"kind": "Deployment", "apiVersion": "apps/v1", "name": "web"}
    expected = inject(_template(deployment), InjectSettings(), namespace="shop", owner=owner)
    assert _template(yaml.safe_load(done.stdout)) == expected


def test_the_injection_flags_reach_the_pod() -> None:
    done = kube_inject(
        "-f", "-", "--proxy-image", "registry.example/proxy:2", "--no-native-sidecars",
        "--injection-discovery-address", "pilot.mesh.svc:15012", "--proxy-concurrency", "1",
        stdin=yaml.safe_dump(workload("Deployment", namespace=None)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec = _template(yaml.safe_load(done.stdout))["spec"]
    proxy = spec["containers"][0]
    assert proxy["image"] == spec["initContainers"][0]["image"] == "registry.example/proxy:2"
    assert proxy["args"][:2] == ["--discovery-address", "pilot.mesh.svc:15012"]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["ISTIO_META_OWNER"].startswith("kubernetes://apis/apps/v1/namespaces/default/")


def test_the_trust_domain_and_cluster_id_reach_the_proxy() -> None:
    done = kube_inject(
        "-f", "-", "--trust-domain", "mesh.example", "--cluster-id", "west",
        stdin=yaml.safe_dump(workload("Deployment")),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    proxy = _template(yaml.safe_load(done.stdout))["spec"]["initContainers"][1]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["TRUST_DOMAIN"] == env["ISTIO_META_MESH_ID"] == "mesh.example"
    assert env["ISTIO_META_CLUSTER_ID"] == "west"
    assert proxy["args"][proxy["args"].index("--trust-domain") + 1] == "mesh.example"


@pytest.mark.parametrize(
    ("flag", "value"), [("--cluster-id", "west\nforged"), ("--trust-domain", "a b")]
)
def test_names_reaching_the_proxy_from_flags_are_checked(flag: str, value: str) -> None:
    done = kube_inject("-f", "-", flag, value, stdin="")
    assert done.returncode == 2
    assert done.stderr.startswith(f"pilot: error: {flag}: ")
    assert done.stderr.count("\n") == 1


def test_the_namespace_flag_is_for_objects_that_name_none() -> None:
    documents = [workload("Deployment", namespace=None), workload("Job", namespace="kube-system")]
    done = kube_inject("-f", "-", "-n", "team-a", stdin=yaml.safe_dump_all(documents))
    assert done.returncode == 0, done.stderr
    first, second = yaml.safe_load_all(done.stdout)
    env = {e["name"]: e.get("value") for e in _template(first)["spec"]["initContainers"][1]["env"]}
    assert "/namespaces/team-a/" in env["ISTIO_META_OWNER"]
    assert second == documents[1]  # kube-system: never injected


def test_documents_the_decision_leaves_alone_are_printed_unchanged() -> None:
    opted_out = workload("Deployment")
    opted_out["spec"]["template"]["metadata"]["annotations"] = {"sidecar.istio.io/inject": "false"}
    host = workload("DaemonSet")
    host["spec"]["template"]["spec"]["hostNetwork"] = True
    done = kube_inject("-f", "-", stdin=yaml.safe_dump_all([opted_out, host]))
    assert done.returncode == 0, done.stderr
    assert list(yaml.safe_load_all(done.stdout)) == [opted_out, host]


def test_injecting_the_output_again_changes_nothing() -> None:
    first = kube_inject("-f", "-", stdin=yaml.safe_dump_all(_documents()))
    second = kube_inject("-f", "-", stdin=first.stdout)
    assert first.returncode == second.returncode == 0
    assert second.stdout == first.stdout


def _customized(kind: str) -> dict[str, Any]:
    """A workload as Istio's docs customize injection: its own istio-proxy, and the
    annotations users set for the proxy's image, log levels and concurrency."""
    document = workload(kind)
    template = _template(document)
    template["metadata"]["annotations"] = {
        "sidecar.istio.io/proxyImage": "registry.example/pilot-proxy:debug",
        "sidecar.istio.io/logLevel": "debug",
        "sidecar.istio.io/agentLogLevel": "default:warn,sds:debug",
        "proxy.istio.io/config": "concurrency: 4",
    }
    template["spec"]["containers"].append({
        "name": "istio-proxy",
        "image": "auto",
        "resources": {"limits": {"memory": "2Gi"}},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}},
    })  # fmt: skip
    return document


@pytest.mark.parametrize("native", ["--native-sidecars", "--no-native-sidecars"])
def test_a_customized_istio_proxy_and_the_proxy_annotations(native: str) -> None:
    documents = [_customized(kind) for kind in ("Deployment", "CronJob")]
    done = kube_inject("-f", "-", native, stdin=yaml.safe_dump_all(documents))
    assert done.returncode == 0, done.stderr
    for printed in yaml.safe_load_all(done.stdout):
        spec = _template(printed)["spec"]
        proxies = [c for c in [*spec["initContainers"], *spec["containers"]]
                   if c["name"] == "istio-proxy"]  # fmt: skip
        assert len(proxies) == 1
        proxy = proxies[0]
        in_init = native == "--native-sidecars"
        assert (proxy in spec["initContainers"]) is in_init
        assert _names(spec["containers"]) == (["web"] if in_init else ["istio-proxy", "web"])
        assert (
            proxy["image"]
            == spec["initContainers"][0]["image"]
            == ("registry.example/pilot-proxy:debug")
        )
        # Merged key by key over the injector's (Istio's) defaults.
        assert proxy["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                      "limits": {"cpu": "2", "memory": "2Gi"}}  # fmt: skip
        assert proxy["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "10"]}}
        args = proxy["args"]
        assert args[args.index("--proxy-log-level") + 1] == "debug"
        assert args[args.index("--log-level") + 1] == "default:warning,sds:debug"
        assert args[args.index("--concurrency") + 1] == "4"
        env = {e["name"]: e.get("value") for e in proxy["env"]}
        assert env["ISTIO_META_APP_CONTAINERS"] == "web"


def test_the_real_agent_takes_the_customized_proxys_command_line(tmp_path: Path) -> None:
    """The injected command and args, annotations and customization included, run as
    the real agent (its `bootstrap` step in place of `proxy sidecar`: it parses every
    flag and prints the bootstrap the proxy would start Envoy with)."""
    pod = customized_pod()
    pod["metadata"]["namespace"] = "shop"
    done = kube_inject("-f", "-", stdin=yaml.safe_dump(pod))
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(done.stdout)["spec"]
    proxy = next(c for c in spec["initContainers"] if c["name"] == "istio-proxy")
    argv = [*proxy["command"], *proxy["args"]]
    assert argv[:2] == ["pilot", "agent"]
    assert argv[-2:] == ["proxy", "sidecar"]
    root = tmp_path / "root-cert.pem"
    root.write_text(new_ca("root").cert_pem)
    literal = {entry["name"]: entry["value"] for entry in proxy["env"] if "value" in entry}
    downward = {"POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "default", "INSTANCE_IP": "10.1.2.3"}
    env = {"PATH": os.environ["PATH"], **downward, **literal, "CA_ROOT_CERT": str(root)}
    ran = subprocess.run(
        [sys.executable, "-m", "pilot", *argv[1:-2], "bootstrap"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    node = json.loads(ran.stdout)["node"]
    assert node["id"] == "sidecar~10.1.2.3~fixed.shop~shop.svc.cluster.local"  # env merged


@pytest.mark.parametrize(
    ("container", "annotations", "expected"),
    [
        ({"restartPolicy": "Never"}, {}, "istio-proxy.restartPolicy"),
        ({"securityContext": {"runAsUser": "0; id"}}, {}, "not a user or group id"),
        ({}, {"sidecar.istio.io/logLevel": "debug\n--x"}, "sidecar.istio.io/logLevel"),
        ({}, {"proxy.istio.io/config": "concurrency: 100000"}, "concurrency"),
    ],
)
def test_a_hostile_customization_is_refused_naming_the_document(
    container: dict[str, Any], annotations: dict[str, str], expected: str
) -> None:
    bad = workload("Deployment", name="api")
    template = _template(bad)
    template["metadata"]["annotations"] = annotations
    template["spec"]["containers"].append({"name": "istio-proxy", **container})
    line = _refused(yaml.safe_dump_all([workload("Job"), bad]))
    assert line.startswith("pilot: error: document 2 (Deployment api): "), line
    assert expected in line


def _refused(text: str) -> str:
    done = kube_inject("-f", "-", stdin=text)
    assert done.returncode == 1, done
    assert done.stdout == ""  # nothing half-printed
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def test_a_bad_document_names_its_index_kind_and_name() -> None:
    bad = workload("StatefulSet", name="db")
    bad["spec"]["template"]["metadata"]["annotations"] = {
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/8; iptables -F"
    }
    line = _refused(yaml.safe_dump_all([workload("Deployment"), SERVICE, bad]))
    assert line.startswith("pilot: error: document 3 (StatefulSet db): annotation"), line
    assert "excludeOutboundIPRanges" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: Deployment\nspec: [\n", "not YAML"),
        ("a: &x [1, 2]\nb: *x\n", "YAML aliases"),
        ('{"kind": "Pod", "spec": ', "document 1: not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        ("- just\n- a list\n", "document 1 (list): not a Kubernetes object"),
        (json.dumps({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "web"}}),
         "document 1 (Pod p): spec.containers: expected a list"),
        (json.dumps({"kind": "List", "items": [SERVICE, {"kind": "Job", "metadata": {"name": "j\n"},
                                                         "spec": {"template": []}}]}),
         "document 1 (item 1 (Job 'j\\n')): spec.template: expected an object"),
    ],
)  # fmt: skip
def test_hostile_files_are_refused_whole(text: str, expected: str) -> None:
    assert expected in _refused(text)


def test_a_file_that_is_not_there_is_one_line() -> None:
    done = kube_inject("-f", "/nonexistent/app.yaml")
    assert done.returncode == 1
    assert done.stderr.startswith("pilot: error: [Errno 2]")
    assert done.stderr.count("\n") == 1


def test_a_bad_flag_value_is_refused_naming_the_flag() -> None:
    done = kube_inject("-f", "-", "--proxy-image", "img --privileged", stdin="")
    assert done.returncode == 2
    assert done.stderr.startswith("pilot: error: --proxy-image: ")
