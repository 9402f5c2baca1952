"""`pilot kube-inject -f FILE`: workloads in, the same workloads with pilot's sidecar out
(istioctl's kube-inject), through the webhook's template and decision.

Multi-document YAML or a stream of JSON values in; the same format out, documents in
order; a document the decision leaves alone (or of a kind without pods) is printed
as it came. All or nothing: a bad document is one line on stderr naming its index,
kind and name, exit status 1, and nothing printed. YAML anchors are refused (an
alias is one object in memory and copies in the output: a few lines could print
gigabytes), and dates stay strings, as the API server reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from pilot.cli.flags import Parser
from pilot.cli.injection_flags import inject_settings, injection_flags
from pilot.inject.errors import InjectError
from pilot.inject.settings import InjectSettings, InjectSettingsError
from pilot.inject.shape import dns_label
from pilot.inject.workloads import ObjectError, inject_object

MAX_INPUT_BYTES = 64 * 1024 * 1024


class InputError(Exception):
    """The input as a whole cannot be read: one line."""


def kube_inject_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    command = commands.add_parser(
        "kube-inject",
        help="print Kubernetes workloads with pilot's sidecar injected (istioctl kube-inject)",
        description="Inject pilot's sidecar into the pod templates of Deployments, StatefulSets,"
        " DaemonSets, ReplicaSets, Jobs, CronJobs and Pods (and Lists of them), as the webhook"
        " would; other objects are printed unchanged.",
    )
    command.add_argument(
        "-f",
        "--filename",
        required=True,
        help="YAML (multi-document) or JSON to inject; - for standard input",
    )
    command.add_argument(
        "-o", "--output", type=Path, help="write here (replaced whole) instead of standard output"
    )
    command.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace of objects that name none (default %(default)s)",
    )
    # pilot discovery has these of its own; kube-inject, run away from pilot, is told them.
    command.add_argument(
        "--trust-domain",
        default="cluster.local",
        help="the mesh's trust domain, as pilot's --trust-domain (default %(default)s)",
    )
    command.add_argument(
        "--cluster-id",
        default="Kubernetes",
        help="the cluster's id, as pilot's --cluster-id (default %(default)s)",
    )
    injection_flags(command)


def kube_inject_command(args: argparse.Namespace) -> int:
    """Exit status 0 with everything printed, 1 with one line on stderr and nothing printed."""
    try:
        settings = inject_settings(args)
        namespace = dns_label(args.namespace, "--namespace")
        text = _read(args.filename)
        output = injected_text(text, settings, namespace)
        _write(args.output, output)
    except InjectSettingsError as error:
        return _fail(str(error), 2)
    except (InputError, InjectError, OSError) as error:
        return _fail(str(error), 1)
    return 0


def _fail(message: str, status: int) -> int:
    print(f"pilot: error: {message}", file=sys.stderr)
    return status


def _read(filename: str) -> str:
    """The input's text, bounded."""
    if filename == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        where = "standard input"
    else:
        with open(filename, "rb") as file:
            data = file.read(MAX_INPUT_BYTES + 1)
        where = filename
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{where}: over {MAX_INPUT_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(f"{where}: not UTF-8 (byte {error.start})") from None


def injected_text(text: str, settings: InjectSettings, namespace: str) -> str:
    """The documents of `text` injected, in its format (JSON if it starts with { or [)."""
    is_json = text.lstrip()[:1] in ("{", "[")
    documents = _json_documents(text) if is_json else _yaml_documents(text)
    injected = []
    for index, document in enumerate(documents, start=1):
        try:
            injected.append(inject_object(document, settings, namespace))
        except ObjectError as error:
            raise InputError(f"document {index} ({error.label}): {error}") from None
        except RecursionError:
            raise InputError(f"document {index}: nested too deep") from None
    if is_json:
        return "".join(json.dumps(document, indent=2) + "\n" for document in injected)
    return yaml.dump_all(injected, Dumper=_Dumper, sort_keys=False, allow_unicode=True)


def _json_documents(text: str) -> list[Any]:
    """A stream of JSON values (one, or several one after another, as `kubectl get -o json`
    pipes give)."""
    decoder = json.JSONDecoder()
    documents: list[Any] = []
    position = 0
    while (position := _skip_space(text, position)) < len(text):
        try:
            document, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            raise InputError(f"document {len(documents) + 1}: not JSON: {error}") from None
        except RecursionError:
            raise InputError(f"document {len(documents) + 1}: nested too deep") from None
        documents.append(document)
    return documents


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases, and with dates left as strings."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise InputError("YAML aliases (*name) are not accepted")
        return super().compose_node(parent, index)


def _timestamp_as_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


class _Dumper(yaml.SafeDumper):
    """No anchors in the output: the injected objects share nothing anyway."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml_documents(text: str) -> list[Any]:
    """The YAML stream's documents, empty ones dropped (as kubectl does)."""
    try:
        documents = list(yaml.load_all(text, Loader=_Loader))  # a SafeLoader
    except yaml.YAMLError as error:
        first = str(error).replace("\n", " ")[:200]
        raise InputError(f"not YAML: {first}") from None
    except RecursionError:
        raise InputError("YAML nested too deep") from None
    return [document for document in documents if document is not None]


def _write(output: Path | None, text: str) -> None:
    """To stdout, or to `output` replaced whole (a temporary file renamed over it)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    handle, temporary = tempfile.mkstemp(dir=output.parent or ".", prefix=f".{output.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # manifests, not secrets: readable as any file is
        os.replace(temporary, output)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
