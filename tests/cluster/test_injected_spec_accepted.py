"""The real API server takes what the injector makes: `pilot kube-inject`'s output of
every workload kind and of a pod that customizes its istio-proxy (server-side dry run,
so every field is validated as on create: native sidecars, probes, volumes, env), and
the webhook's JSON patch applied by the API server's own RFC 6902 code.

The patch is applied to a PodTemplate (a pod spec the API server validates as a pod's,
and which, unlike a Pod, may change), with each path under `/template`: the template the
server then holds is the injected pod the webhook meant.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

import yaml

from pilot.inject.pod import inject
from pilot.inject.review import answer
from pilot.inject.settings import InjectSettings
from tests.cluster.control_plane import ControlPlane
from tests.support.admission import review_body
from tests.support.inject_pods import app_pod, customized_pod, probed_pod, workload

KINDS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"]


def _kube_inject(text: str, *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pilot", "kube-inject", "-f", "-", *flags],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _in_a_pod(path: str) -> bool:
    """A path into a Pod's spec (a workload's is under .template)."""
    return not path.startswith(".template")


def _contains(server: Any, ours: Any, path: str = "") -> list[str]:
    """Where the server's object lacks or differs from what we sent (it adds defaults,
    and leaves out zero values, as Go's omitempty)."""
    if server is None and ours in (0, "", False) and not isinstance(ours, (dict, list)):
        return []
    if isinstance(ours, dict):
        if not isinstance(server, dict):
            return [path]
        return [p for key in ours for p in _contains(server.get(key), ours[key], f"{path}.{key}")]
    if isinstance(ours, list):
        # The service-account admission appends its token volume and mounts to a Pod.
        appended = path.endswith(("volumes", "volumeMounts")) and _in_a_pod(path)
        if not isinstance(server, list) or len(server) < len(ours):
            return [path]
        if len(server) > len(ours) and not appended:
            return [path]
        return [
            p for n, item in enumerate(ours) for p in _contains(server[n], item, f"{path}[{n}]")
        ]
    return [] if server == ours else [f"{path}: {server!r} != {ours!r}"]


def test_the_api_server_takes_every_injected_workload_kind(
    control_plane: ControlPlane, namespace: str
) -> None:
    documents = [workload(kind, namespace=namespace) for kind in KINDS]
    for pod in (probed_pod(), customized_pod()):
        pod["metadata"]["namespace"] = namespace
        documents.append(pod)
    for native in ("--native-sidecars", "--no-native-sidecars"):
        injected = _kube_inject(yaml.safe_dump_all(documents), native)
        printed = control_plane.kubectl(
            "apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=injected
        )
        accepted = json.loads(printed)
        items = accepted["items"] if accepted.get("kind") == "List" else [accepted]
        sent = list(yaml.safe_load_all(injected))
        assert [item["kind"] for item in items] == [doc["kind"] for doc in sent]
        for item, doc in zip(items, sent, strict=True):
            assert not _contains(item["spec"], doc["spec"]), (doc["kind"], native)


def test_the_api_server_applies_the_webhooks_patch_to_the_injected_pod(
    control_plane: ControlPlane, namespace: str
) -> None:
    settings = InjectSettings()
    for pod in (app_pod(), probed_pod(), customized_pod()):
        name = f"{pod['metadata']['name']}-{len(pod['spec']['containers'][0])}"
        template = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": name, "namespace": namespace},
                    "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}  # fmt: skip
        control_plane.kubectl("create", "-f", "-", stdin=json.dumps(template))
        response = json.loads(
            answer(review_body(pod, namespace=namespace), "application/json", settings)
        )
        patch = json.loads(base64.b64decode(response["response"]["patch"]))
        under_template = [{**op, "path": "/template" + op["path"]} for op in patch]
        control_plane.kubectl(
            "patch", "podtemplate", name, "-n", namespace, "--type=json",
            "-p", json.dumps(under_template),
        )  # fmt: skip
        held = json.loads(
            control_plane.kubectl("get", "podtemplate", name, "-n", namespace, "-o", "json")
        )
        expected = inject(pod, settings, namespace=namespace)
        assert not _contains(held["template"]["spec"], expected["spec"])
        assert not _contains(held["template"]["metadata"], expected["metadata"])
