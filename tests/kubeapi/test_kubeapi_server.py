"""Tests of the test API server through the real kubernetes_asyncio client.

Owns the evidence that `KubeAPIServer` behaves like kube-apiserver where a
client can tell: list/watch semantics, resume, bookmarks, selectors, paging,
metadata-only lists and watches, 410 Expired, injected faults, restart on the
same port, TokenReview and the standalone `python -m tests.kubeapi` mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.deadline import bounded

from .kubeconfig import write_kubeconfig
from .server import KubeAPIServer

Obj = dict[str, Any]
WORKTREE = Path(__file__).resolve().parents[2]


def service(name: str, namespace: str = "default", **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"app": name}},
    }


def typed_service(name: str) -> client.V1Service:
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=80)]),
    )


def endpoint_slice(name: str, service_name: str, ip: str) -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8080}],
    }


def status_of(error: ApiException) -> Obj:
    """The Status object an API error carried."""
    status: Obj = json.loads(error.body or b"{}")
    return status


def stored(srv: KubeAPIServer, kind: str, namespace: str, name: str) -> Obj:
    obj = srv.get(kind, namespace, name)
    assert obj is not None, (kind, namespace, name)
    return obj


class WatchSink:
    """Runs a watch stream in a task and records its events (or its error)."""

    def __init__(self, stream: watch.Watch) -> None:
        self.stream = stream
        self.events: list[Obj] = []
        self.error: BaseException | None = None
        self.finished = False
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for event in self.stream:
                async with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        except Exception as error:
            self.error = error
        finally:
            async with self._changed:
                self.finished = True
                self._changed.notify_all()

    async def wait(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_events(self, count: int, within: float = 5.0) -> list[Obj]:
        await self.wait(lambda: len(self.events) >= count or self.finished, within)
        assert len(self.events) >= count, (self.events, self.error)
        return self.events

    async def wait_finished(self, within: float = 5.0) -> None:
        await self.wait(lambda: self.finished, within)

    def summary(self) -> list[tuple[str, str]]:
        return [(e["type"], e["raw_object"]["metadata"].get("name", "")) for e in self.events]

    async def close(self) -> None:
        self.stream.stop()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.stream.close()


@pytest.fixture
async def server() -> AsyncIterator[KubeAPIServer]:
    srv = KubeAPIServer(bookmark_interval=0.2)
    await srv.start()
    yield srv
    await srv.stop()


async def _api_client(srv: KubeAPIServer, path: Path, token: str | None = None) -> client.ApiClient:
    write_kubeconfig(path, srv.url, token=token)
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
async def api(server: KubeAPIServer, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    api_client = await _api_client(server, tmp_path / "kubeconfig")
    yield api_client
    await api_client.close()


@pytest.fixture
async def sinks() -> AsyncIterator[list[WatchSink]]:
    opened: list[WatchSink] = []
    yield opened
    for sink in opened:
        await sink.close()


def start_watch(sinks: list[WatchSink], func: Any, *args: Any, **kwargs: Any) -> WatchSink:
    sink = WatchSink(watch.Watch().stream(func, *args, **kwargs))
    sinks.append(sink)
    return sink


# ----------------------------------------------------------------------- list / CRUD


async def test_list_returns_objects_with_resource_versions(
    server: KubeAPIServer, api: client.ApiClient
) -> None:
    server.apply(service("a"))
    server.apply(service("b", namespace="other"))
    services = await client.CoreV1Api(api).list_service_for_all_namespaces()
    assert services.metadata.resource_version == server.resource_version
    assert [s.metadata.name for s in services.items] == ["a", "b"]
    for item in services.items:
        assert int(item.metadata.resource_version) <= int(server.resource_version)
        assert item.metadata.uid and item.metadata.creation_timestamp
        assert item.spec.cluster_ip and item.spec.ports[0].protocol == "TCP"
    only_other = await client.CoreV1Api(api).list_namespaced_service("other")
    assert [s.metadata.name for s in only_other.items] == ["b"]


async def test_typed_list_on_the_wire(server: KubeAPIServer) -> None:
    server.apply(service("a"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/api/v1/services") as resp,
    ):
        body = await resp.json()
    assert body["kind"] == "ServiceList" and body["apiVersion"] == "v1"
    assert body["metadata"] == {"resourceVersion": server.resource_version}
    assert "kind" not in body["items"][0]  # list items carry no kind, as on a real server


async def test_create_read_replace_delete_with_status_errors(
    server: KubeAPIServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    created = await core.create_namespaced_service("default", typed_service("a"))
    with pytest.raises(ApiException) as exists:
        await core.create_namespaced_service("default", typed_service("a"))
    assert exists.value.status == 409 and status_of(exists.value)["reason"] == "AlreadyExists"

    created.metadata.labels = {"v": "2"}
    replaced = await core.replace_namespaced_service("a", "default", created)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    created.metadata.labels = {"v": "3"}
    with pytest.raises(ApiException) as stale:
        await core.replace_namespaced_service("a", "default", created)
    assert stale.value.status == 409 and status_of(stale.value)["reason"] == "Conflict"

    patched = await core.patch_namespaced_service(
        "a", "default", {"metadata": {"labels": {"p": "1"}}}
    )
    assert patched.metadata.labels == {"v": "2", "p": "1"}
    json_patched = await core.patch_namespaced_service(
        "a", "default", [{"op": "replace", "path": "/metadata/labels/p", "value": "2"}]
    )
    assert json_patched.metadata.labels == {"v": "2", "p": "2"}
    await core.delete_namespaced_service("a", "default")
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_service("a", "default")
    status = status_of(missing.value)
    assert missing.value.status == 404
    assert status["kind"] == "Status" and status["reason"] == "NotFound" and status["code"] == 404


async def test_endpointslices_leases_and_secrets(
    server: KubeAPIServer, api: client.ApiClient
) -> None:
    server.apply(endpoint_slice("a-1", "a", "10.0.0.1"))
    slices = await client.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces(
        label_selector="kubernetes.io/service-name=a"
    )
    assert slices.metadata.resource_version == server.resource_version
    assert slices.items[0].endpoints[0].addresses == ["10.0.0.1"]

    coordination = client.CoordinationV1Api(api)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="me", lease_duration_seconds=15),
    )
    created = await coordination.create_namespaced_lease("default", lease)
    assert stored(server, "Lease", "default", "leader")["spec"]["holderIdentity"] == "me"
    created.spec.holder_identity = "you"
    await coordination.replace_namespaced_lease("leader", "default", created)
    assert stored(server, "leases", "default", "leader")["spec"]["holderIdentity"] == "you"

    server.apply({"kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "dg=="}})
    secret = await client.CoreV1Api(api).read_namespaced_secret("s", "default")
    assert secret.type == "Opaque" and secret.data == {"k": "dg=="}


async def test_configmaps_by_name_in_every_namespace(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    named = "metadata.name=root"
    by_name = start_watch(sinks, core.list_config_map_for_all_namespaces, field_selector=named)
    await server.wait_for_watches(1, kind="ConfigMap")
    for namespace in ("a", "b"):
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="root"), data={"k": "v"})
        await core.create_namespaced_config_map(namespace, body)
    await core.create_namespaced_config_map(
        "a", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="other"))
    )
    current = await core.read_namespaced_config_map("root", "a")
    current.data = {"k": "changed"}
    await core.replace_namespaced_config_map("root", "a", current)
    await core.delete_namespaced_config_map("root", "b")
    await by_name.wait_events(4)
    assert by_name.summary() == [
        ("ADDED", "root"),
        ("ADDED", "root"),
        ("MODIFIED", "root"),
        ("DELETED", "root"),
    ]
    listed = await core.list_config_map_for_all_namespaces(field_selector=named)
    assert [(c.metadata.namespace, c.data) for c in listed.items] == [("a", {"k": "changed"})]


async def _get_json(url: str, accept: str) -> tuple[int, Obj]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Accept": accept}) as r,
    ):
        return r.status, await r.json()


METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


async def test_metadata_only_lists_and_watches(server: KubeAPIServer) -> None:
    server.apply({"kind": "Namespace", "metadata": {"name": "shop", "labels": {"x": "y"}}})
    url = f"{server.url}/api/v1/namespaces"
    status, body = await _get_json(url + "?fieldSelector=metadata.name=shop", METADATA_LIST)
    assert status == 200
    assert (body["kind"], body["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert body["metadata"] == {"resourceVersion": server.resource_version}
    [item] = body["items"]
    assert set(item) == {"kind", "apiVersion", "metadata"}, "metadata only: no spec, no status"
    assert item["kind"] == "PartialObjectMetadata"
    assert item["metadata"]["labels"]["x"] == "y"
    _, whole = await _get_json(url, f"application/vnd.kubernetes.protobuf,{METADATA_LIST}")
    assert whole["kind"] == "PartialObjectMetadataList", "alternatives are tried in order"
    _, whole = await _get_json(url, "application/json")
    assert whole["kind"] == "NamespaceList" and "spec" in whole["items"][0]
    status, refused = await _get_json(url, METADATA_WATCH)  # the watch shape, on a list
    assert status == 406 and refused["reason"] == "NotAcceptable"

    query = f"?watch=true&allowWatchBookmarks=true&resourceVersion={server.resource_version}"
    headers = {"Accept": METADATA_WATCH}
    async with aiohttp.ClientSession() as session, session.get(url + query, headers=headers) as r:
        server.apply({"kind": "Namespace", "metadata": {"name": "web"}})
        server.delete("Namespace", None, "web")
        server.send_bookmarks()
        events = [json.loads(await r.content.readline()) for _ in range(3)]
    assert [e["type"] for e in events] == ["ADDED", "DELETED", "BOOKMARK"]
    for event in events:
        assert set(event["object"]) == {"kind", "apiVersion", "metadata"}
        assert event["object"]["kind"] == "PartialObjectMetadata"
    assert [e["object"]["metadata"].get("name") for e in events[:2]] == ["web", "web"]
    assert [r.accept for r in server.requests_for("Namespace")][-1] == METADATA_WATCH


async def test_paging_is_consistent_with_the_first_page(
    server: KubeAPIServer, api: client.ApiClient
) -> None:
    for name in "abcde":
        server.apply(service(name))
    core = client.CoreV1Api(api)
    first = await core.list_namespaced_service("default", limit=2)
    assert [s.metadata.name for s in first.items] == ["a", "b"]
    assert first.metadata.remaining_item_count == 3
    server.delete("Service", "default", "c")
    server.apply(service("bb"))
    rest = await core.list_namespaced_service(
        "default", limit=10, _continue=first.metadata._continue
    )
    assert [s.metadata.name for s in rest.items] == ["c", "d", "e"]
    assert rest.metadata.resource_version == first.metadata.resource_version
    assert not rest.metadata._continue

    server.compact()
    with pytest.raises(ApiException) as expired:
        await core.list_namespaced_service("default", limit=2, _continue=first.metadata._continue)
    assert expired.value.status == 410


async def test_label_and_field_selectors_filter_lists(
    server: KubeAPIServer, api: client.ApiClient
) -> None:
    server.apply(service("a", app="x", tier="web"))
    server.apply(service("b", app="y"))
    server.apply(service("c"))
    core = client.CoreV1Api(api)

    async def names(label_selector: str = "", field_selector: str = "") -> list[str]:
        found = await core.list_service_for_all_namespaces(
            label_selector=label_selector, field_selector=field_selector
        )
        return [s.metadata.name for s in found.items]

    assert await names(label_selector="app=x") == ["a"]
    assert await names(label_selector="app==x,tier") == ["a"]
    assert await names(label_selector="app!=x") == ["b", "c"]
    assert await names(label_selector="app in (x, y)") == ["a", "b"]
    assert await names(label_selector="app notin (x)") == ["b", "c"]
    assert await names(label_selector="!app") == ["c"]
    assert await names(field_selector="metadata.name=b") == ["b"]
    assert await names(field_selector="metadata.namespace=default,metadata.name!=b") == ["a", "c"]
    with pytest.raises(ApiException) as bad:
        await names(label_selector="app in x")
    assert bad.value.status == 400


async def test_fail_lists_answers_500_and_spares_watches(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    server.fail_lists(1)
    with pytest.raises(ApiException) as failed:
        await core.list_namespaced_service("default")
    assert failed.value.status == 500
    assert status_of(failed.value)["reason"] == "InternalError"
    await core.list_namespaced_service("default")

    server.fail_lists()
    for _ in range(3):
        with pytest.raises(ApiException):
            await core.list_namespaced_service("default")
    sink = start_watch(sinks, core.list_namespaced_service, "default", timeout_seconds=5)
    await server.wait_for_watches(1)
    server.apply(service("a"))
    await sink.wait_events(1)
    assert sink.summary() == [("ADDED", "a")]
    server.fail_lists(0)
    await core.list_namespaced_service("default")


# --------------------------------------------------------------------------- watch


async def test_watch_sees_added_modified_deleted_in_order(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    server.apply(service("existing"))
    core = client.CoreV1Api(api)
    sink = start_watch(sinks, core.list_namespaced_service, "default")
    await server.wait_for_watches(1, kind="Service")
    server.apply(service("a"))
    server.apply(service("a", v="2"))
    server.delete("Service", "default", "a")
    events = await sink.wait_events(4)
    assert sink.summary() == [
        ("ADDED", "existing"),
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    rvs = [int(e["object"].metadata.resource_version) for e in events]
    assert rvs[1:] == sorted(rvs[1:]) and rvs[-1] == int(server.resource_version)
    assert events[3]["raw_object"]["metadata"]["labels"] == {"v": "2"}  # last state
    assert events[1]["raw_object"]["kind"] == "Service"


async def test_noop_update_makes_no_event(server: KubeAPIServer) -> None:
    first = server.apply(service("a"))
    again = server.apply(service("a"))
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


async def test_watch_resumes_from_resource_version(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    server.apply(service("old"))
    mark = server.resource_version
    server.apply(service("a"))
    server.apply(service("old", v="2"))
    core = client.CoreV1Api(api)
    sink = start_watch(sinks, core.list_namespaced_service, "default", resource_version=mark)
    await sink.wait_events(2)
    server.delete("Service", "default", "a")
    await sink.wait_events(3)
    assert sink.summary() == [("ADDED", "a"), ("MODIFIED", "old"), ("DELETED", "a")]
    assert not any(r.is_watch is False for r in server.requests_for("Service"))


async def test_watch_accepts_true_and_1_and_streams_chunked_json_lines(
    server: KubeAPIServer,
) -> None:
    server.apply(service("a"))
    async with aiohttp.ClientSession() as session:
        for flag in ("true", "True", "1"):
            url = f"{server.url}/api/v1/services?watch={flag}&timeoutSeconds=1"
            async with session.get(url) as resp:
                assert resp.headers["Content-Type"] == "application/json"
                assert resp.headers["Transfer-Encoding"] == "chunked"
                line = await resp.content.readline()
                event = json.loads(line)
                assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "a"
                assert event["object"]["apiVersion"] == "v1"


async def test_send_initial_events_ends_with_annotated_bookmark(server: KubeAPIServer) -> None:
    server.apply(service("a"))
    server.apply(service("b"))
    query = (
        "watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan&resourceVersion=0&timeoutSeconds=1"
    )
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/api/v1/namespaces/default/services?{query}") as resp,
    ):
        events = [json.loads(await resp.content.readline()) for _ in range(3)]
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    bookmark = events[2]["object"]["metadata"]
    assert bookmark["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert bookmark["resourceVersion"] == server.resource_version


async def test_watch_field_selector_and_cluster_scoped_namespaces(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    server.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1"}})
    assert (await core.read_namespace("ns1")).metadata.namespace is None
    one = start_watch(sinks, core.list_namespace, field_selector="metadata.name=ns2")
    await server.wait_for_watches(1, kind="namespaces")
    server.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns2"}})
    server.apply({"kind": "Namespace", "metadata": {"name": "ns2", "labels": {"x": "y"}}})
    await one.wait_events(2)
    assert one.summary() == [("ADDED", "ns2"), ("MODIFIED", "ns2")]
    names = [n.metadata.name for n in (await core.list_namespace()).items]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system", "ns1", "ns2"]


async def test_bookmarks_only_when_allowed(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    quiet = start_watch(sinks, core.list_namespaced_service, "default")
    marked = start_watch(sinks, core.list_namespaced_service, "default", allow_watch_bookmarks=True)
    await server.wait_for_watches(2)
    await marked.wait_events(1)  # periodic, every bookmark_interval
    server.apply(service("a"))
    server.send_bookmarks()
    added_then_bookmark = [("ADDED", "a"), ("BOOKMARK", "")]

    def bookmark_after_add() -> bool:
        seen = marked.summary()
        return any(seen[i : i + 2] == added_then_bookmark for i in range(len(seen)))

    await marked.wait(bookmark_after_add)
    index = marked.summary().index(("ADDED", "a")) + 1
    bookmark = marked.events[index]["raw_object"]
    assert bookmark["kind"] == "Service" and bookmark["apiVersion"] == "v1"
    assert bookmark["metadata"]["resourceVersion"] == server.resource_version
    await quiet.wait_events(1)
    assert quiet.summary() == [("ADDED", "a")]
    assert marked.stream.resource_version == server.resource_version


async def test_timeout_seconds_ends_watch_cleanly(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    began = time.monotonic()
    sink = start_watch(
        sinks, client.CoreV1Api(api).list_namespaced_service, "default", timeout_seconds=1
    )
    await sink.wait_finished(within=4)
    assert sink.error is None and sink.events == []
    assert 0.9 <= time.monotonic() - began < 3
    assert server.open_watches == 0


async def test_watch_label_selector_adds_and_deletes_on_label_change(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    server.apply(service("a", app="x"))
    server.apply(service("b", app="y"))
    core = client.CoreV1Api(api)
    sink = start_watch(sinks, core.list_namespaced_service, "default", label_selector="app=x")
    await sink.wait_events(1)
    server.apply(service("b", app="x"))  # enters the selection
    server.apply(service("a", app="z"))  # leaves it
    server.apply(service("c", app="y"))  # never seen
    server.apply(service("b", app="x", more="1"))
    await sink.wait_events(4)
    assert sink.summary() == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a"), ("MODIFIED", "b")]
    left = sink.events[2]["raw_object"]
    assert left["metadata"]["labels"] == {"app": "x"}  # previous content ...
    assert int(left["metadata"]["resourceVersion"]) > int(
        sink.events[1]["raw_object"]["metadata"]["resourceVersion"]
    )


async def test_410_after_compaction(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    server.apply(service("a"))
    old = server.resource_version
    server.apply(service("b"))
    server.compact()
    core = client.CoreV1Api(api)

    with_timeout = start_watch(
        sinks, core.list_namespaced_service, "default", resource_version=old, timeout_seconds=5
    )
    await with_timeout.wait_finished()
    assert isinstance(with_timeout.error, ApiException) and with_timeout.error.status == 410
    assert f"too old resource version: {old} ({server.resource_version})" in str(
        with_timeout.error.reason
    )
    assert with_timeout.events == []

    # Without timeout_seconds the client retries a 410 once, then raises.
    before = len(server.requests_for("Service", watch=True))
    forever = start_watch(sinks, core.list_namespaced_service, "default", resource_version=old)
    await forever.wait_finished()
    assert isinstance(forever.error, ApiException) and forever.error.status == 410
    assert len(server.requests_for("Service", watch=True)) - before == 2

    # From the compaction point on, watching works.
    current = start_watch(
        sinks, core.list_namespaced_service, "default", resource_version=server.resource_version
    )
    await server.wait_for_watches(1)
    server.delete("Service", "default", "a")
    await current.wait_events(1)
    assert current.summary() == [("DELETED", "a")]


async def test_expire_watches_ends_open_watches_with_410(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    server.apply(service("a"))
    sink = start_watch(sinks, core.list_namespaced_service, "default", timeout_seconds=30)
    await sink.wait_events(1)
    server.expire_watches()
    await sink.wait_finished()
    assert isinstance(sink.error, ApiException) and sink.error.status == 410
    assert server.open_watches == 0


async def test_drop_watches_abrupt_and_clean(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    server.apply(service("a"))
    cut = start_watch(sinks, core.list_namespaced_service, "default", timeout_seconds=30)
    await cut.wait_events(1)
    server.drop_watches()
    await cut.wait_finished()
    assert isinstance(cut.error, aiohttp.ClientPayloadError)

    # A clean end makes the client (no timeout_seconds) re-watch from the last
    # resourceVersion it saw, without listing again.
    resumed = start_watch(sinks, core.list_namespaced_service, "default")
    await resumed.wait_events(1)
    seen = resumed.events[0]["object"].metadata.resource_version
    server.drop_watches(abrupt=False)
    await server.wait_until(lambda: len(server.requests_for("Service", watch=True)) == 3)
    rewatch = server.requests_for("Service", watch=True)[-1]
    assert rewatch.query["resourceVersion"] == seen
    server.apply(service("b"))
    await resumed.wait_events(2)
    assert resumed.summary() == [("ADDED", "a"), ("ADDED", "b")]
    assert server.requests_for("Service", watch=False) == []


async def test_stop_start_on_same_port_keeps_state(
    server: KubeAPIServer, api: client.ApiClient, sinks: list[WatchSink]
) -> None:
    core = client.CoreV1Api(api)
    server.apply(service("a"))
    listed = await core.list_namespaced_service("default")
    url = server.url
    sink = start_watch(
        sinks,
        core.list_namespaced_service,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    )
    await server.wait_for_watches(1)
    await server.stop()
    await sink.wait_finished()
    assert sink.error is not None  # connection cut
    with pytest.raises(aiohttp.ClientConnectionError):
        await core.list_namespaced_service("default")

    server.apply(service("b"))
    server.delete("Service", "default", "a")
    await server.start()
    assert server.url == url
    after = await core.list_namespaced_service("default")
    assert [s.metadata.name for s in after.items] == ["b"]
    resumed = start_watch(
        sinks,
        core.list_namespaced_service,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    )
    await resumed.wait_events(2)
    assert resumed.summary() == [("ADDED", "b"), ("DELETED", "a")]


# -------------------------------------------------------------- auth and discovery


async def test_token_review(server: KubeAPIServer, api: client.ApiClient) -> None:
    token = server.add_service_account_token("ns1", "sa1", audiences=["istio-ca", "other"])
    auth = client.AuthenticationV1Api(api)

    async def review(token: str, audiences: list[str] | None) -> client.V1TokenReviewStatus:
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
        return (await auth.create_token_review(body)).status

    ok = await review(token, ["istio-ca"])
    assert ok.authenticated and ok.audiences == ["istio-ca"]
    assert ok.user.username == "system:serviceaccount:ns1:sa1"
    assert "system:serviceaccounts:ns1" in ok.user.groups
    wrong_audience = await review(token, ["vault"])
    assert not wrong_audience.authenticated and wrong_audience.error
    unknown = await review("nope", ["istio-ca"])
    assert not unknown.authenticated and unknown.error
    assert [r.authenticated for r in server.token_reviews] == [True, False, False]
    assert server.token_reviews[0].username == "system:serviceaccount:ns1:sa1"


async def test_required_bearer_token(tmp_path: Path) -> None:
    async with KubeAPIServer(require_token="secret") as srv:
        good = await _api_client(srv, tmp_path / "good", token="secret")
        bad = await _api_client(srv, tmp_path / "bad")
        async with good, bad:
            await client.CoreV1Api(good).list_namespaced_service("default")
            with pytest.raises(ApiException) as denied:
                await client.CoreV1Api(bad).list_namespaced_service("default")
            assert denied.value.status == 401


async def test_discovery_documents(server: KubeAPIServer, api: client.ApiClient) -> None:
    version = await client.VersionApi(api).get_code()
    assert version.major == "1" and version.git_version.startswith("v1.")
    assert (await client.CoreApi(api).get_api_versions()).versions == ["v1"]
    groups = await client.ApisApi(api).get_api_versions()
    assert {"discovery.k8s.io", "coordination.k8s.io"} <= {g.name for g in groups.groups}
    resources = await client.DiscoveryV1Api(api).get_api_resources()
    assert [r.name for r in resources.resources] == ["endpointslices"]


async def test_load_yaml_multi_document_and_list(server: KubeAPIServer) -> None:
    loaded = server.load_yaml(
        """
apiVersion: v1
kind: Service
metadata: {name: a}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Endpoints, metadata: {name: a}, subsets: []}
- {apiVersion: coordination.k8s.io/v1, kind: Lease, metadata: {name: l, namespace: kube-system}}
"""
    )
    assert [o["kind"] for o in loaded] == ["Service", "Endpoints", "Lease"]
    assert server.get("Lease", "kube-system", "l") is not None
    assert server.objects("Endpoints") == [server.get("Endpoints", "default", "a")]


# ---------------------------------------------------------------------- standalone


async def test_standalone_process_with_control_api(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.kubeapi",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        cwd=WORKTREE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(WORKTREE)},
    )
    try:
        assert proc.stdout is not None
        line = await bounded(proc.stdout.readline(), 15)
        url = line.decode().split()[-1]
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/_test/apply", json=service("a")) as resp,
        ):
            assert resp.status == 200
        configuration = client.Configuration()
        await config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            found = await client.CoreV1Api(api).list_namespaced_service("default")
        assert [s.metadata.name for s in found.items] == ["a"]
    finally:
        proc.terminate()
        await bounded(proc.wait(), 10)
