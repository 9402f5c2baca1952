"""The annotations that reach the proxy's own command line and image, honest beside
hostile: `sidecar.istio.io/proxyImage`, `logLevel`, `agentLogLevel` and ProxyConfig's
`concurrency`. Each value is checked against its grammar before it becomes an argument
or an image; a bad one is refused naming the annotation, on one line."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from pilot.logs import parse_levels
from tests.support.inject_pods import app_pod

SETTINGS = InjectSettings(proxy_image="registry.example/pilot-proxy:1", proxy_concurrency=2)
IMAGE = "sidecar.istio.io/proxyImage"
LOG_LEVEL = "sidecar.istio.io/logLevel"
AGENT_LOG_LEVEL = "sidecar.istio.io/agentLogLevel"
CONFIG = "proxy.istio.io/config"


def _containers(annotations: dict[str, str], **settings: Any) -> tuple[dict[str, Any], ...]:
    chosen = InjectSettings(**{**SETTINGS.__dict__, **settings}) if settings else SETTINGS
    injected = inject(app_pod(annotations=annotations), chosen, namespace="shop")
    init, proxy = injected["spec"]["initContainers"][:2]
    return init, proxy


def _proxy_args(annotations: dict[str, str], **settings: Any) -> list[str]:
    return list(_containers(annotations, **settings)[1]["args"])


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _refused(annotations: dict[str, str], name: str) -> str:
    with pytest.raises(InjectError, match=re.escape(f"annotation {name}: ")) as refused:
        _containers(annotations)
    message = str(refused.value)
    assert "\n" not in message
    assert len(message) < 300
    return message


# --- proxyImage -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "registry.example/team/pilot-proxy:1.2-debug",
        "pilot-proxy:dev",  # a local image (kind load): Istio ignores one without a `/`
        "registry.example:5000/pilot-proxy@sha256:" + "a" * 64,
    ],
)
def test_proxy_image_is_the_image_of_both_injected_containers(image: str) -> None:
    init, proxy = _containers({IMAGE: image})
    assert init["image"] == proxy["image"] == image


def test_without_proxy_image_the_operators_image_is_used() -> None:
    init, proxy = _containers({})
    assert init["image"] == proxy["image"] == "registry.example/pilot-proxy:1"


@pytest.mark.parametrize(
    "image",
    ["", "-registry.example/proxy", "proxy:1\nevil", "proxy 1", "proxy:'1'", "a" * 300,
     "proxy:1;rm", "${IMAGE}", "prôxy:1"],
)  # fmt: skip
def test_hostile_proxy_images_are_refused(image: str) -> None:
    assert "is not an image reference" in _refused({IMAGE: image}, IMAGE)


# --- logLevel -----------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["trace", "debug", "info", "warning", "warn", "error",
                                   "critical", "off"])  # fmt: skip
def test_log_level_reaches_envoys_flag(level: str) -> None:
    assert _flag(_proxy_args({LOG_LEVEL: level}), "--proxy-log-level") == level


def test_without_log_level_the_operators_level_is_used() -> None:
    assert _flag(_proxy_args({}, proxy_log_level="error"), "--proxy-log-level") == "error"


@pytest.mark.parametrize(
    "level", ["", "DEBUG", "verbose", " info", "info\n", "--concurrency", "-l", "info,debug",
              "upstream:debug", "d" * 10_000],
)  # fmt: skip
def test_hostile_log_levels_are_refused(level: str) -> None:
    assert "is not one of Envoy's log levels" in _refused({LOG_LEVEL: level}, LOG_LEVEL)


# --- agentLogLevel ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("debug", "debug"),
        ("default:warn", "default:warning"),
        ("info, sds:debug,ca:error", "info,sds:debug,ca:error"),
        ("xds:warning", "xds:warning"),
    ],
)
def test_agent_log_level_becomes_the_agents_log_level(value: str, expected: str) -> None:
    args = _proxy_args({AGENT_LOG_LEVEL: value})
    assert _flag(args, "--log-level") == expected
    assert args.index("--log-level") < args.index("proxy")  # an agent flag, before its step
    parse_levels(expected)  # the agent's own parser takes what the pod will run


def test_without_agent_log_level_the_agent_keeps_its_default() -> None:
    assert "--log-level" not in _proxy_args({})


@pytest.mark.parametrize(
    "value",
    ["", ",", "fatal", "none", "ads:debug", "default:", ":debug", "info\n--binary-path=/x",
     "--binary-path", "debug,-x", "sds:debug:x", "info," * 200],
)  # fmt: skip
def test_hostile_agent_log_levels_are_refused(value: str) -> None:
    _refused({AGENT_LOG_LEVEL: value}, AGENT_LOG_LEVEL)


# --- concurrency in proxy.istio.io/config -------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [("concurrency: 4", "4"), ('{"concurrency": 0}', "0"), ('concurrency: "8"', "8"),
     ("concurrency: 1024", "1024")],
)  # fmt: skip
def test_proxy_config_concurrency_becomes_the_concurrency_flag(config: str, expected: str) -> None:
    proxy = _containers({CONFIG: config})[1]
    assert _flag(list(proxy["args"]), "--concurrency") == expected
    env = {entry["name"]: entry.get("value") for entry in proxy["env"]}
    assert "concurrency" in json.loads(env["PROXY_CONFIG"])  # and still in ProxyConfig


def test_without_concurrency_the_operators_is_used() -> None:
    args = _proxy_args({CONFIG: "holdApplicationUntilProxyStarts: true"}, proxy_concurrency=6)
    assert _flag(args, "--concurrency") == "6"


@pytest.mark.parametrize(
    "config",
    ["concurrency: -1", "concurrency: 1025", "concurrency: 99999999999999999999",
     "concurrency: true", "concurrency: 2.5", 'concurrency: "2\\n--x"', 'concurrency: "-2"',
     "concurrency: [2]", "concurrency: {a: 1}", 'concurrency: ""'],
)  # fmt: skip
def test_hostile_concurrency_is_refused(config: str) -> None:
    assert "concurrency" in _refused({CONFIG: config}, CONFIG)


def test_every_proxy_arg_is_a_string_and_none_smuggles_a_flag() -> None:
    args = _proxy_args({IMAGE: "registry.example/p:2", LOG_LEVEL: "debug",
                        AGENT_LOG_LEVEL: "info,sds:debug", CONFIG: "concurrency: 3"})  # fmt: skip
    assert all(isinstance(arg, str) and "\n" not in arg for arg in args)
    values = args[1::2][: args.index("proxy") // 2]
    assert not [value for value in values if value.startswith("-")]
