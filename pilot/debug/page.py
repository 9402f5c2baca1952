"""The /debug page: one server-rendered HTML page for an operator, like Envoy's admin page.

It shows the connected proxies with their CDS / LDS / EDS / RDS / SDS state (the cells
`pilot proxy-status` prints), the resources they rejected with what each said
of it (a row per resource, cut short), the registry's size, the last pushes, and links
to every JSON endpoint. No JavaScript: the page reloads itself every
`REFRESH_SECONDS` (`?refresh=0` stops it, to read or copy in peace).

Everything shown is escaped: node ids, identities, service names and NACK
messages are strings that proxies and registries choose. Nothing of a resource's content
is shown, so no private key can be.

A render runs on the event loop and walks every resource of every proxy it
shows (about 5 us each: 50 proxies holding 4,000 resources each take a
second). So the proxies table stops at `PROXY_ROWS` rows (all of them are in
/debug/syncz), and a page that took long to render asks to be reloaded less
often: an open page keeps to `LOOP_SHARE` of the loop's time.
"""

from __future__ import annotations

import html
import math
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable

from pilot.debug import views
from pilot.debug.proxy_status import LiveProxies, ProxyStatus
from pilot.debug.proxy_status_table import COLUMNS, summarize_counts
from pilot.logs import clipped
from pilot.push.history import KEPT, PushHistory, PushRecord, Sample
from pilot.registry.index import EndpointIndex
from pilot.registry.traffic_config import TrafficConfig
from pilot.xds import types

# A push reaches Envoys well within a second, so a change shows up on the next
# reload; 5 s leaves time to read a row between reloads.
REFRESH_SECONDS = 5
LOOP_SHARE = 0.05
PROXY_ROWS = 50
# Rejected resources listed (of the proxies shown), and how much of a name or of what
# the proxy said each row shows: a proxy writes these, so they are bounded.
REJECTED_ROWS = 100
NAME_CHARS = 200
ERROR_CHARS = 300

# Every JSON (and text) endpoint, with what it answers. Both listeners serve them all.
ENDPOINTS = (
    ("/debug/syncz", "sync state per proxy and type: how many resources SYNCED, STALE, ..."),
    ("/debug/connections", "every stream: proxy, peer, identity, since when, subscriptions"),
    ("/debug/pushz", f"the last {KEPT} pushes, newest first"),
    ("/debug/edsz", "every ClusterLoadAssignment's version (?cluster=NAME: one, in full)"),
    ("/debug/registryz", "services and the endpoint sets feeding each"),
    ("/debug/configz", "Istio objects held (DestinationRule, VirtualService, unsupported kinds)"),
    (
        "/debug/authorizationz",
        "AuthorizationPolicies and RequestAuthentications held: scope, what fails closed,"
        " the sidecars each applies to",
    ),
    ("/debug/config_dump", "one proxy's resources, secrets redacted: linked per proxy above"),
    ("/debug/tasks", "every asyncio task and the awaits it sits in"),
    ("/metrics", "Prometheus metrics"),
    ("/ready", "200 once the registry has its first full state"),
)

NEEDS_A_PROXY = frozenset({"/debug/config_dump"})

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; } th, td { padding: 3px 10px; text-align: left;
  border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f3f3f3; } td.when { white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
code, td.id { font-family: ui-monospace, monospace; word-break: break-all; }
.SYNCED { color: #17692c; } .STALE { color: #9a6200; } .ERROR { color: #b3261e; font-weight: bold; }
.NOT_SENT, .none, .meta { color: #666; }
"""


def _e(value: object) -> str:
    """Text made safe for HTML content and attribute values."""
    return html.escape(str(value), quote=True)


def _link(path: str, text: str, query: dict[str, str] | None = None) -> str:
    href = f"{path}?{urllib.parse.urlencode(query)}" if query else path
    return f'<a href="{_e(href)}">{_e(text)}</a>'


def _row(cells: Iterable[str]) -> str:
    """A table row of cells already rendered (`_th`, `_td`)."""
    return "<tr>" + "".join(cells) + "</tr>"


def _th(text: str) -> str:
    return f"<th>{_e(text)}</th>"


def _td(text: object, css: str = "", inner: str | None = None) -> str:
    """A cell showing `text` (escaped here), or the HTML `inner` (escaped by its maker)."""
    content = _e(text) if inner is None else inner
    return f'<td class="{_e(css)}">{content}</td>' if css else f"<td>{content}</td>"


def render(
    proxies: LiveProxies,
    index: EndpointIndex,
    pushes: PushHistory,
    refresh: bool = True,
    traffic: TrafficConfig | None = None,
) -> str:
    """The whole page."""
    started = time.perf_counter()
    statuses = proxies.statuses(PROXY_ROWS)
    sections = [
        _proxies(proxies.count(), statuses),
        _rejected(statuses),
        _registry(views.registry_size(index)),
        _istio_config(traffic or TrafficConfig()),
        _pushes(pushes),
        _endpoints(),
    ]
    period = reload_period(time.perf_counter() - started) if refresh else None
    head = f'<meta http-equiv="refresh" content="{period}">' if period else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"{head}<title>pilot debug</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join([_header(period), *sections])
        + "\n</body></html>\n"
    )


def reload_period(render_seconds: float) -> int:
    """Seconds between reloads: `REFRESH_SECONDS`, longer if a render costs the loop more
    than `LOOP_SHARE` of that."""
    return max(REFRESH_SECONDS, math.ceil(render_seconds / LOOP_SHARE))


def _header(period: int | None) -> str:
    now = views.timestamp(time.time())
    if period:
        reload = f"reloads every {period} s ({_link('/debug/', 'stop', {'refresh': '0'})})"
    else:
        reload = f"not reloading ({_link('/debug/', 'resume reloading')})"
    return f'<h1>pilot</h1>\n<p class="meta">Rendered {_e(now)}; {reload}.</p>'


# -- connected proxies ---------------------------------------------------------------


def _proxies(total: int, statuses: list[ProxyStatus]) -> str:
    names = ["Node id", "Identity", "Connections", *(name for name, _ in COLUMNS), "Config"]
    header = _row(map(_th, names))
    rows = [_proxy_row(status) for status in statuses]
    if not rows:
        rows = [f'<tr><td class="none" colspan="{len(names)}">No proxy is connected.</td></tr>']
    more = ""
    if total > len(statuses):
        more = f'<p class="meta">The first {len(statuses)} of {total}: all of them in '
        more += f"{_link('/debug/syncz', '/debug/syncz')}.</p>"
    return (
        f"<h2>Connected proxies ({total})</h2>\n"
        f'<table id="proxies"><thead>{header}</thead><tbody>\n'
        + "\n".join(rows)
        + f"\n</tbody></table>{more}"
    )


def _proxy_row(status: ProxyStatus) -> str:
    proxy = status.proxy
    connections = ", ".join(
        f"#{number} {label}"
        for number, label in zip(status.connection_ids, status.streams, strict=True)
    )
    query = {"proxyID": proxy.node_id} | ({"identity": proxy.identity} if proxy.identity else {})
    cells = [
        _td(proxy.node_id, "id"),
        _td(proxy.identity or "-", "id"),
        _td(connections),
        *(_state(status, type_url) for _, type_url in COLUMNS),
        _td("", inner=_link("/debug/config_dump", "config_dump", query)),
    ]
    return _row(cells)


def _state(status: ProxyStatus, type_url: str) -> str:
    """The proxy-status cell for one type, coloured by its worst state."""
    counts = Counter(str(resource.status) for resource in status.by_type(type_url))
    worst = next((s for s in ("ERROR", "STALE", "SYNCED", "NOT_SENT") if counts.get(s)), "none")
    return _td(summarize_counts(counts) or "-", worst)


# -- rejected resources ---------------------------------------------------------------


def _rejected(statuses: list[ProxyStatus]) -> str:
    """A row per resource a proxy rejected, with what it said (one line, cut short)."""
    found = [(status, r) for status in statuses for r in status.resources if r.error is not None]
    names = ["Node id", "Type", "Resource", "What the proxy said"]
    rows = [
        _row(
            [
                _td(status.proxy.node_id, "id"),
                _td(types.short_name(resource.type_url).upper()),
                _td(clipped(resource.name, NAME_CHARS), "id"),
                _td(clipped(resource.error or "", ERROR_CHARS), "ERROR"),
            ]
        )
        for status, resource in found[:REJECTED_ROWS]
    ]
    if not rows:
        rows = [f'<tr><td class="none" colspan="{len(names)}">None.</td></tr>']
    more = ""
    if len(found) > len(rows):
        more = f'<p class="meta">The first {len(rows)} of {len(found)}: all of them in '
        more += f"{_link('/debug/syncz', '/debug/syncz')}.</p>"
    return (
        f"<h2>Rejected resources ({len(found)})</h2>\n"
        f'<table id="rejected"><thead>{_row(map(_th, names))}</thead><tbody>\n'
        + "\n".join(rows)
        + f"\n</tbody></table>{more}"
    )


# -- registry, pushes, endpoints ---------------------------------------------------------


def _registry(size: dict[str, int]) -> str:
    rows = [
        _row([_th(label), _td(size[key], "num")])
        for label, key in (
            ("Services", "services"),
            ("Endpoint sets", "endpoint_sets"),
            ("Endpoints", "endpoints"),
        )
    ]
    return (
        '<h2>Registry</h2>\n<table id="registry">'
        + "".join(rows)
        + f'</table>\n<p class="meta">{_link("/debug/registryz", "every service")}</p>'
    )


def _istio_config(traffic: TrafficConfig) -> str:
    """How many Istio objects pilot holds, by kind; those of kinds it does not implement
    marked so (each is listed in /debug/configz)."""
    held = Counter(config.key.kind for config in traffic.objects())
    rows = [
        _row([_th(kind), _td(count, "num"), _td("applied")]) for kind, count in sorted(held.items())
    ]
    rows += [
        _row([_th(kind), _td(count, "num"), _td("not implemented by pilot: ignored", "ERROR")])
        for kind, count in sorted(traffic.unsupported_counts().items())
    ]
    body = "".join(rows) or _row([_td("none", "none")])
    return (
        '<h2>Istio config</h2>\n<table id="istio-config">'
        + body
        + f'</table>\n<p class="meta">{_link("/debug/configz", "every object")}</p>'
    )


def _pushes(history: PushHistory) -> str:
    names = [
        "When (UTC)",
        "What changed",
        "Resources changed",
        "Streams",
        "Debounce",
        "Build + fan-out",
    ]
    header = _row(map(_th, names))
    now = time.time()
    rows = [_push_row(record, now) for record in history.newest_first()]
    if not rows:
        rows = ['<tr><td class="none" colspan="6">No push yet.</td></tr>']
    return (
        f"<h2>Last pushes ({len(history)} of at most {KEPT}, newest first)</h2>\n"
        f'<table id="pushes"><thead>{header}</thead><tbody>\n'
        + "\n".join(rows)
        + f'\n</tbody></table>\n<p class="meta">{_link("/debug/pushz", "as JSON")}</p>'
    )


def _push_row(record: PushRecord, now: float) -> str:
    when = views.timestamp(record.at)
    resources = ", ".join(f"{t.upper()} {n}" for t, n in sorted(record.resources.items()))
    if record.owned:
        resources += f"{', ' if resources else ''}own resources of {record.owned} proxies"
    return _row(
        [
            _td(f"{when[11:23]} ({_ago(now - record.at)})", "when"),
            _td(_changed(record)),
            _td(resources or "none"),
            _td(record.streams, "num"),
            _td(_ms(record.debounce_seconds), "num"),
            _td(_ms(record.seconds), "num"),
        ]
    )


def _changed(record: PushRecord) -> str:
    parts = [
        _sample("full (clusters)", record.full),
        _sample("endpoints only", record.endpoints),
        _sample("certificates", record.certificates),
    ]
    return "; ".join(part for part in parts if part) or "nothing"


def _sample(what: str, sample: Sample) -> str:
    if not sample.total:
        return ""
    more = sample.total - len(sample.names)
    return f"{what}: {', '.join(sample.names)}" + (f" and {more} more" if more else "")


def _endpoint(path: str) -> str:
    """A link, unless the endpoint needs a proxy named (the proxies table links those)."""
    return f"<code>{_e(path)}</code>" if path in NEEDS_A_PROXY else _link(path, path)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _endpoints() -> str:
    items = [f"<li>{_endpoint(path)}: {_e(about)}</li>" for path, about in ENDPOINTS]
    return "<h2>JSON endpoints</h2>\n<ul>" + "".join(items) + "</ul>"
