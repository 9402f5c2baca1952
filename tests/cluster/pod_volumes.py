"""A Pod's volumes laid out on this machine as the kubelet lays them out, and its mounts.

`make_volumes` makes one host directory per volume under the pod's folder:
* emptyDir: an empty directory, root-owned and 0777 (with the pod's fsGroup: that
  group, setgid); `medium: Memory` is a plain directory here;
* configMap: the ConfigMap's keys (or `items`) as files, fetched from the API server;
* projected: its sources together: serviceAccountToken from the TokenRequest API with
  the audience and lifetime asked, bound to the Pod, as the kubelet asks for it;
  configMap and downwardAPI as their own volumes;
* downwardAPI: labels and annotations as `key="value"` lines, fields as their values.
File modes are the volume's `defaultMode` (0644) or the item's `mode`; a token file is
0600 whenever the pod has an fsGroup, as the kubelet makes it; with an fsGroup every file
is then chowned to that group and made group-readable (0640 for the token), so a
container running as that group reads it. Anything else (secret, hostPath, CSI) raises
`VolumeError`: this kubelet never gives a container part of the host.

`mounts_of` says where each of a container's volumeMounts goes: (host directory, mount
path, read-only), for tests.cluster.container_process to bind.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.client import Kube, path_of
from tests.cluster.pod_env import field_value, resource_value
from tests.support.envoy_process import wait_until

Obj = dict[str, Any]
DEFAULT_MODE = 0o644
TOKEN_MODE = 0o600
CONFIG_MAP_WAIT = 30.0  # seconds a pod waits for a ConfigMap it mounts to exist


class VolumeError(ValueError):
    """A volume this kubelet does not make (which and why, in one line)."""


@dataclass(frozen=True)
class Mount:
    """One volumeMount: the volume's host directory (or file, with subPath) at `path`."""

    source: Path
    path: str
    read_only: bool


def _fs_group(pod: Obj) -> int | None:
    group = pod["spec"].get("securityContext", {}).get("fsGroup")
    return None if group is None else int(group)


def _write(path: Path, content: str, mode: int, fs_group: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    if fs_group is not None:
        os.chown(path, 0, fs_group)
        mode |= 0o440
    path.chmod(mode)


async def _config_map_files(kube: Kube, pod: Obj, source: Obj) -> dict[str, tuple[str, int | None]]:
    """relative path -> (content, item mode) for a configMap source."""
    path = path_of("ConfigMap", pod["metadata"]["namespace"], source["name"])
    status, config_map = await kube.request("GET", path)
    if status == 404 and not source.get("optional"):
        # A kubelet keeps the pod waiting until the ConfigMap exists (e.g. until
        # a controller has published it): so does this one, for a while.
        config_map = await wait_until(lambda: kube.get(path), CONFIG_MAP_WAIT,
                                      f"ConfigMap {source['name']}")  # fmt: skip
    elif status != 200:
        if source.get("optional"):
            return {}
        raise VolumeError(f"ConfigMap {source['name']}: {status} from the API server")
    data: dict[str, str] = config_map.get("data", {})
    items = source.get("items") or [{"key": key, "path": key} for key in sorted(data)]
    return {item["path"]: (data[item["key"]], item.get("mode")) for item in items}


def _downward_files(pod: Obj, source: Obj) -> dict[str, tuple[str, int | None]]:
    """relative path -> (content, item mode) for a downwardAPI source."""
    files: dict[str, tuple[str, int | None]] = {}
    for item in source.get("items", []):
        if "fieldRef" in item:
            path = item["fieldRef"]["fieldPath"]
            if path in ("metadata.labels", "metadata.annotations"):
                values = pod["metadata"].get(path.split(".")[1], {})
                text = "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(values.items()))
            else:
                text = field_value(pod, path)
        else:
            reference = item["resourceFieldRef"]
            (container,) = [c for c in pod["spec"]["containers"]
                            if c["name"] == reference.get("containerName")]  # fmt: skip
            text = resource_value(container, reference)
        files[item["path"]] = (text, item.get("mode"))
    return files


async def _token(kube: Kube, pod: Obj, source: Obj) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    audiences = [source["audience"]] if source.get("audience") else []
    seconds = int(source.get("expirationSeconds", 3600))
    account = spec.get("serviceAccountName") or "default"
    return await kube.token(meta["namespace"], account, audiences, seconds, pod)


async def _projected(kube: Kube, pod: Obj, volume: Obj, folder: Path) -> None:
    projected = volume["projected"]
    default_mode = projected.get("defaultMode", DEFAULT_MODE)
    fs_group = _fs_group(pod)
    for source in projected["sources"]:
        if "serviceAccountToken" in source:
            spec = source["serviceAccountToken"]
            mode = TOKEN_MODE if fs_group is not None else default_mode
            _write(folder / spec["path"], await _token(kube, pod, spec), mode, fs_group)
            continue
        if "configMap" in source:
            files = await _config_map_files(kube, pod, source["configMap"])
        elif "downwardAPI" in source:
            files = _downward_files(pod, source["downwardAPI"])
        else:
            raise VolumeError(f"volume {volume['name']}: projected {sorted(source)} not made here")
        for relative, (content, mode) in files.items():
            _write(folder / relative, content, mode or default_mode, fs_group)


def _empty_dir(pod: Obj, folder: Path) -> None:
    folder.mkdir()
    fs_group = _fs_group(pod)
    if fs_group is not None:
        os.chown(folder, 0, fs_group)
        folder.chmod(0o2777)
    else:
        folder.chmod(0o777)


def _directory(folder: Path) -> None:
    folder.mkdir(mode=0o755)


async def _make(kube: Kube, pod: Obj, volume: Obj, folder: Path) -> None:
    if "emptyDir" in volume:
        _empty_dir(pod, folder)
        return
    _directory(folder)
    fs_group = _fs_group(pod)
    if "projected" in volume:
        await _projected(kube, pod, volume, folder)
        return
    if "configMap" in volume:
        files = await _config_map_files(kube, pod, volume["configMap"])
        default_mode = volume["configMap"].get("defaultMode", DEFAULT_MODE)
    elif "downwardAPI" in volume:
        files = _downward_files(pod, volume["downwardAPI"])
        default_mode = volume["downwardAPI"].get("defaultMode", DEFAULT_MODE)
    else:
        kinds = sorted(set(volume) - {"name"})
        raise VolumeError(f"volume {volume['name']}: {kinds} is not made by this kubelet")
    for relative, (content, mode) in files.items():
        _write(folder / relative, content, mode or default_mode, fs_group)


async def make_volumes(kube: Kube, pod: Obj, folder: Path) -> dict[str, Path]:
    """Each of `pod`'s volumes made under `folder`: volume name -> its host directory."""
    made: dict[str, Path] = {}
    for index, volume in enumerate(pod["spec"].get("volumes", [])):
        target = folder / f"volume-{index}"  # never the volume's name in a path
        await _make(kube, pod, volume, target)
        made[volume["name"]] = target
    return made


def mounts_of(container: Obj, volumes: dict[str, Path]) -> list[Mount]:
    """Where each of the container's volumeMounts binds, in the order given."""
    mounts = []
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in volumes:
            raise VolumeError(f"container {container['name']}: no volume {mount['name']!r}")
        source = volumes[mount["name"]]
        sub_path = mount.get("subPath", "")
        if sub_path.startswith("/") or ".." in Path(sub_path).parts:
            raise VolumeError(f"volumeMount {mount['name']}: subPath leaves the volume")
        if sub_path:
            source = source / sub_path
        mounts.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts
