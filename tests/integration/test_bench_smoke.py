"""Smoke tests of the benchmarks: tiny runs end to end print sane figures.

`python -m bench.eds_push` prints a table of finite positive figures, and with
`--peers linear,snapshot` go-control-plane's beside pilot's and the floor's, its
clients sent exactly what pilot's were (needs Go: skipped without it);
`python -m bench.sidecar` syncs sidecars with all four types and prints bytes per type,
RSS per sidecar and the CPU of a service added against an endpoint changed, and with `--secrets`
gets every sidecar its certificate and says at what rate and CPU; `python -m bench.fuzz`
prints a PASS or FAIL for each of its targets and exits 0 exactly when all pass;
`python -m bench.registry_file` loads and reloads a file in each format;
`python -m bench.route_push` sends a VirtualService's weight change as one RDS response
per sidecar and an endpoint change as one EDS response;
`python -m bench.certificates` gets N proxies their certificates from pilot and from its
floor (bare grpc.aio and pilot's mint), or N agents theirs from pilot's CA, and
`python -m bench.arrival_path` their certificates in process, without gRPC, and
`python -m bench.instructions` the same burst's instructions, which repeat run after run;
`python -m bench.sweep` writes its Markdown table and PNG plot;
`python -m bench.codecs` times every codec on one assignment, all writing the same bytes;
`python -m bench.inject` gets every review answered by pilot's webhook and prints its rate.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peers

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "latency p50 (ms)",
    "latency p99 (ms)",
    "CPU per change (ms)",
    "memory per client (KiB)",
    "initial sync (s)",
)


def _row(output: str, label: str) -> list[float]:
    for line in output.splitlines():
        if line.startswith(label):
            return [float(cell) for cell in line[len(label) :].split()]
    raise AssertionError(f"no {label!r} row in:\n{output}")


def _small_eds_push(*extra: str) -> subprocess.CompletedProcess[str]:
    """bench.eds_push at 20 services, 5 clients, 5 changes, with `extra` flags."""
    command = [sys.executable, "-m", "bench.eds_push", "--services", "20", "--clients", "5"]
    command += ["--changes", "5", "--timeout", "60", "--channels", "5", *extra]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )


def test_bench_prints_finite_positive_table() -> None:
    done = _small_eds_push("--retries", "3", "--peers", "none")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "S=20 services" in done.stdout and "N=5 delta ADS clients" in done.stdout
    assert "K=5 endpoint changes" in done.stdout
    assert "streams retried" in done.stdout and "/ready during it" in done.stdout, done.stdout
    assert "pilot's log: 0 tracebacks, 0 lines at ERROR" in done.stdout, done.stdout
    assert "go-control-plane: not run (--peers none)" in done.stdout, done.stdout
    for label in ROWS:
        pilot, floor, ratio = _row(done.stdout, label)
        for value in (pilot, floor, ratio):
            assert math.isfinite(value) and value > 0, f"{label}: {pilot} {floor} {ratio}"


def test_bench_prints_go_control_plane_beside_pilot_and_floor() -> None:
    # Built first, on its own clock: the first build downloads and compiles modules.
    subprocess.run([str(peers.BUILD)], cwd=ROOT, capture_output=True, timeout=900, check=True)
    done = _small_eds_push("--peers", "linear,snapshot")
    assert done.returncode == 0, done.stderr[-3000:]
    header = next(line for line in done.stdout.splitlines() if line.lstrip().startswith("pilot "))
    assert header.split() == ["pilot", "floor", "gcp-linear", "gcp-snapshot", "ratio"], header
    for label in ROWS:
        cells = _row(done.stdout, label)
        assert len(cells) == 5 and all(math.isfinite(v) and v > 0 for v in cells), (label, cells)
    for tag in ("gcp-linear", "gcp-snapshot"):
        # One assignment response per client per change: what pilot and the floor sent.
        assert "1.00 per client per change" in _line(done.stdout, f"{tag}: initial sync"), tag


SIDECAR_TYPES = ("CDS", "EDS", "LDS", "RDS")


def _line(output: str, prefix: str) -> str:
    found = [line for line in output.splitlines() if line.startswith(prefix)]
    assert found, f"no line starting {prefix!r} in:\n{output}"
    return found[0]


def test_bench_sidecar_prints_its_lines() -> None:
    command = [sys.executable, "-m", "bench.sidecar", "--services", "20", "--clients", "5"]
    command += ["--additions", "2", "--changes", "3", "--timeout", "60"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "N=5 sidecars" in out and "A=2 services added, K=3 endpoint changes" in out, out
    assert "initial sync of all sidecars (CDS, EDS, LDS, RDS all ACKed)" in out, out
    sizes = [float(v) for v in _line(out, "bytes received (KiB)").split()[3:]]
    assert len(sizes) == 5 and all(math.isfinite(v) and v > 0 for v in sizes), out
    for label in ("initial sync (s)", "RSS per sidecar (KiB)", "CPU (ms)"):
        cells = [float(v) for v in _line(out, label).split()[-3:]]  # pilot, floor, ratio
        assert all(math.isfinite(v) and v > 0 for v in cells), f"{label}: {cells}"
    assert "per service added " in out and "per endpoint changed " in out, out
    against = _line(out, "service added / endpoint changed, CPU: pilot ")
    assert "floor" in against and "bytes per sidecar" in against, against
    added = _line(out, "responses per sidecar per service added:")
    assert all(f"{kind} " in added for kind in SIDECAR_TYPES), added
    changed = _line(out, "responses per sidecar per endpoint changed:")
    assert changed.endswith(": EDS 1.00"), f"an endpoint change is EDS alone: {changed}"
    assert "pilot's log: 0 tracebacks, 0 lines at ERROR" in out, out


def test_bench_sidecar_secrets_gets_every_sidecar_its_certificate() -> None:
    command = [sys.executable, "-m", "bench.sidecar", "--services", "10", "--clients", "4"]
    command += ["--additions", "1", "--changes", "1", "--timeout", "60", "--secrets"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "initial sync of all sidecars (CDS, EDS, LDS, RDS all ACKed)" in out, out
    with_secrets = _line(out, "initial sync with secrets (CDS, EDS, LDS, RDS, SDS all ACKed): ")
    assert "SDS per sidecar" in with_secrets and "/ready during it p99" in with_secrets, out
    held = _line(out, "certificates: ")
    assert held.startswith("certificates: 4 sidecars hold both secrets"), held
    rate = float(held.split(": ")[-1].removesuffix(" certificates/s"))
    assert math.isfinite(rate) and rate > 0, held
    per_cert = _line(out, "pilot CPU per certificate: ")
    assert " / 4 = " in per_cert and "bare mint" in per_cert, per_cert
    assert "no secrets (it serves no SDS)" in _line(out, "floor: "), out
    assert "pilot's log: 0 tracebacks, 0 lines at ERROR" in out, out
    assert "without secrets, pilot's log: 0 tracebacks, 0 lines at ERROR" in out, out


FUZZ_TARGETS = ("crashes", "UNKNOWN statuses", "RSS growth", "asyncio tasks", "worst /ready")


def test_bench_fuzz_prints_a_verdict_per_target() -> None:
    command = [sys.executable, "-m", "bench.fuzz", "--examples", "60", "--cycles", "40"]
    command += ["--warmup", "10"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: some target failed
    assert "fuzz examples: 60 " in done.stdout, done.stdout
    assert "connect/subscribe/disconnect cycles: 40 " in done.stdout, done.stdout
    verdicts = {}
    for line in done.stdout.splitlines():
        for target in FUZZ_TARGETS:
            if line.startswith(target) and (" PASS " in line or " FAIL " in line):
                verdicts[target] = "PASS" if " PASS " in line else "FAIL"
    assert set(verdicts) == set(FUZZ_TARGETS), done.stdout
    assert verdicts["crashes"] == "PASS", done.stdout
    assert (done.returncode == 0) == all(v == "PASS" for v in verdicts.values()), done.stdout
    assert "pilot exited 0 on SIGTERM" in done.stdout, done.stdout


def test_bench_registry_file_loads_and_reloads_both_formats() -> None:
    command = [sys.executable, "-m", "bench.registry_file", "--services", "300"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `-o ")]
    assert [row.split("|")[1].strip() for row in rows] == ["`-o json`", "`-o yaml`"], done.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[2:-1]]
        assert cells[1] == "300", row  # services pilot said it loaded
        seconds = [float(cell.removesuffix(" s")) for cell in cells[2:5]]
        assert all(math.isfinite(value) and value > 0 for value in seconds), row


def test_bench_route_push_sends_a_weight_change_as_one_rds_response() -> None:
    command = [sys.executable, "-m", "bench.route_push", "--services", "20", "--sidecars", "10"]
    command += ["--changes", "3", "--processes", "1"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| weight") or line.startswith("| endpoint")
    }
    weight, endpoint = rows["weight (VirtualService)"], rows["endpoint (EndpointSlice)"]
    assert weight[3] == "rds 1.00", done.stdout  # one RDS response per sidecar, nothing else
    assert endpoint[3] == "eds 1.00", done.stdout
    for cells in (weight, endpoint):
        for timed in cells[:2]:
            p50, p99 = (float(v.replace(",", "")) for v in timed.removesuffix(" ms").split(" / "))
            assert 0 < p50 <= p99, cells
        assert float(cells[2].removesuffix(" KiB")) > 0, cells


FIGURES = ("certificates per second", "pilot CPU per certificate", "ratio")
FLOOR_FIGURES = ("floor CPU per certificate", "floor over the bare mint", "pilot over the floor")


@pytest.mark.parametrize(
    ("via", "runs", "asking"),
    [
        ("sds", 2, "20 proxies asking for `default` at once"),
        ("ca", 1, "20 agents asking pilot's CA at once"),
    ],
)
def test_bench_certificates_prints_its_figures(via: str, runs: int, asking: str) -> None:
    command = [sys.executable, "-m", "bench.certificates", "--proxies", "20", "--mints", "5"]
    command += ["--via", via, "--runs", str(runs)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(asking) == runs, done.stdout
    run_lines, _, medians = done.stdout.partition(f"median of {runs} runs (lowest-highest):")
    assert bool(medians) == (runs > 1), done.stdout
    for label in FIGURES + FLOOR_FIGURES:
        lines = [line for line in run_lines.splitlines() if line.startswith(label)]
        assert len(lines) == runs, done.stdout
        for line in lines:
            value = float(line[len(label) :].split()[0])
            assert math.isfinite(value) and value > 0, line
    for line in medians.strip().splitlines():
        middle, spread = line.rsplit(" (", 1)
        low, high = (float(v) for v in spread.rstrip(")").split("-"))
        assert 0 < low <= float(middle.split()[-1]) <= high, line
    if runs > 1:
        assert len(medians.strip().splitlines()) == 7, medians


def test_bench_certificates_runs_the_pilot_on_pythonpath(tmp_path: Path) -> None:
    """Comparing two trees: `PYTHONPATH=OTHER python -m bench.certificates` from this
    checkout must start OTHER's pilot, not this one's (`-m` puts the current directory
    first on sys.path). OTHER here is a pilot that refuses to start."""
    other = tmp_path / "other" / "pilot"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text('raise SystemExit("the other checkout\'s pilot")\n')
    command = [sys.executable, "-m", "bench.certificates", "--proxies", "2", "--mints", "2"]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(other.parent)},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "pilot exited before logging" in done.stderr, done.stderr[-3000:]


def _twenty_proxies(bench: str, timeout: float, *flags: str) -> str:
    """The one line `python -m BENCH --proxies 20 [FLAGS]` prints, once it exited cleanly."""
    return _one_line(_start_twenty(bench, *flags), timeout)


def _start_twenty(bench: str, *flags: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", bench, "--proxies", "20", *flags]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _one_line(process: subprocess.Popen[str], timeout: float) -> str:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        process.kill()  # no-op once it exited; a process past its deadline goes
    assert process.returncode == 0, stderr[-3000:]
    (line,) = stdout.splitlines()
    return line


def test_bench_arrival_path_gets_every_proxy_its_certificate() -> None:
    line = _twenty_proxies("bench.arrival_path", timeout=110)
    assert line.startswith("20 proxies at once: CPU "), line
    figures = [float(word) for word in line.replace("(", " ").split() if word[0].isdigit()]
    assert len(figures) == 4 and all(math.isfinite(f) and f > 0 for f in figures), line


def test_bench_arrival_path_storm_gets_every_proxy_its_assignments() -> None:
    line = _twenty_proxies("bench.arrival_path", 110, "--storm", "5")
    assert line.startswith("20 proxies at once, each for 5 clusters and their assignments: CPU ")
    figures = [
        float(word) for word in line.split(":", 1)[1].replace("(", " ").split() if word[0].isdigit()
    ]
    assert len(figures) == 3 and all(math.isfinite(f) and f > 0 for f in figures), line


def _instructions_per_proxy(line: str) -> tuple[float, float]:
    assert line.startswith("20 proxies at once, instructions per proxy: the loop's thread "), line
    counted = re.findall(r"\d{1,3}(?:,\d{3})*", line.split(":", 1)[1])
    loop, others, total = (float(number.replace(",", "")) for number in counted)
    assert loop > 0 and others > 0 and abs(total - (loop + others)) <= 1, line  # each rounded
    return loop, others


def test_bench_instructions_counts_the_same_burst_alike_twice() -> None:
    """The point of counting instructions: two runs of one tree agree, where CPU time
    moves by a fifth (the minting thread's crypto moves a little more: key sizes)."""
    # Side by side: valgrind runs each on one core, and counts are not times.
    runs = [_start_twenty("bench.instructions") for _ in range(2)]
    try:
        first, second = (_instructions_per_proxy(_one_line(run, timeout=170)) for run in runs)
    finally:
        for run in runs:
            run.kill()  # the other one, when one failed
    assert abs(first[0] - second[0]) <= 0.02 * first[0], (first, second)
    assert abs(first[1] - second[1]) <= 0.05 * first[1], (first, second)


def test_bench_sweep_writes_its_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "bench.sweep", "--clients", "3,6", "--services", "8,16"]
    command += ["--at-services", "8", "--at-clients", "3", "--changes", "3"]
    command += ["--timeout", "60", "--out", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=115, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in (out / "sweep.md").read_text().splitlines() if line.startswith("| ")]
    sizes = [tuple(cell.strip() for cell in row.split("|")[1:4]) for row in rows[1:]]
    assert sizes == [
        ("clients", "8", "3"),
        ("clients", "8", "6"),
        ("services", "8", "3"),
        ("services", "16", "3"),
    ], rows
    for row in rows[1:]:
        for cell in row.split("|")[4:-1]:
            pilot, floor = (float(v) for v in cell.split("(")[0].split(" / "))
            assert math.isfinite(floor) and floor > 0 and math.isfinite(pilot), row
    assert (out / "sweep.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # 8 services x 3 clients is on both axes: measured once, the same figures in both rows.
    assert done.stderr.count("sweep: 8 services x 3 clients ...") == 1, done.stderr[-3000:]
    assert rows[1].split("|")[4:] == rows[3].split("|")[4:], rows


CODECS = (
    "protobuf (upb)",
    "pilot's hand encoder, first push",
    "pilot's hand encoder, 1 endpoint moved",
    "envoy-data-plane (betterproto2)",
)


def test_bench_codecs_times_every_codec_on_the_same_bytes() -> None:
    command = [sys.executable, "-m", "bench.codecs", "--endpoints", "40", "--repetitions", "3"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout
    assert "ClusterLoadAssignment of 40 endpoints" in done.stdout, done.stdout
    rows = {}
    for line in done.stdout.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if cells and cells[0] in CODECS:
            rows[cells[0]] = cells[1:]
    assert list(rows) == list(CODECS), done.stdout
    for codec, (serialize, _, parse, _, parse_read, _, same) in rows.items():
        timings = [serialize] if "hand encoder" in codec else [serialize, parse, parse_read]
        for cell in timings:
            value = float(cell.removesuffix(" ms"))
            assert math.isfinite(value) and value > 0, f"{codec}: {cell}"
        assert same == "yes", f"{codec} wrote other bytes than protobuf"


def test_bench_inject_gets_every_review_answered() -> None:
    command = [sys.executable, "-m", "bench.inject", "--reviews", "60", "--concurrency", "20"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("| 60 ")]
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[1] == "20", row
    figures = [float(cell.removesuffix(" ms").replace(",", "")) for cell in cells[2:]]
    assert all(math.isfinite(value) and value > 0 for value in figures), row
