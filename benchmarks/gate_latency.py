"""How fast the Slurm gate answers on a node: the copied gate.py run by the node's python3 as slurmd runs
its HealthCheckProgram (a new process each time, its start included), against a real `serve` on
loopback, in four states: serve up (a clear node, a node with a critical finding), serve stopped (the
cached verdict), and serve hung (it accepts and never answers: the 0.5 s fetch timeout, then the cache).

    python benchmarks/gate_latency.py [--runs 50] [--out FILE]

Target: the gate answers in under 1 s, p99 included, whatever state serve is in. Draining
(scontrol) is left out: it is Slurm's time, not the gate's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.store.batch import MetricColumns  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.telemetry import wire  # noqa: E402
from stethoscope.timeutil import now_ms  # noqa: E402

SECRET = b"gate-latency-benchmark-secret-0123"
RULE = """
- rule_id: gpu_too_hot
  description: hot GPU (benchmark)
  severity: critical
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m}
"""
SERVE_LOG: list[str] = []  # serve's cycle lines (read, so that its pipe never fills)
INVENTORY = "all:\n  hosts:\n    node01: {stethoscope_node_key: 1}\n    node02: {stethoscope_node_key: 2}\n"


def start_serve(top: Path) -> tuple[subprocess.Popen, str]:
    dsn = f"chdb://{top / 'db'}"
    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for ago in (120_000, 60_000, 1_000):
            batch.append("node01", "gpu_temperature_celsius", "gpu0", {}, 85.0, now_ms() - ago)
        store.insert_metrics(batch)
    (top / "rules").mkdir()
    (top / "rules/hot.yml").write_text(textwrap.dedent(RULE))
    (top / "hosts.yml").write_text(INVENTORY)
    (top / "cluster.secret").write_bytes(SECRET + b"\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(top / "spool"),
        "serve", "--inventory", str(top / "hosts.yml"), "--secret-file", str(top / "cluster.secret"),
        "--rules", str(top / "rules"), "--no-model", "--no-sweep", "--listen", "127.0.0.1:0",
        "--http", "127.0.0.1:0", "--gate-listen", "127.0.0.1:0", "--interval", "5",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=TOP)
    assert proc.stdout is not None
    # the gate address the nodes reach (serve --gate-listen)
    match = re.search(r"gate (http://[\d.]+:\d+)/gate/NODE", proc.stdout.readline())
    if not match:
        raise SystemExit("serve did not start")
    url = match[1]
    threading.Thread(target=lambda: SERVE_LOG.extend(proc.stdout or ()), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/gate/node01", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.2)
    raise SystemExit("serve published no verdict in 60 s")


def node(top: Path, url: str, name: str) -> Path:
    home = top / name
    home.mkdir()
    shutil.copy(TOP / "stethoscope/telemetry/gate.py", home / "gate.py")
    (home / "gate.key").write_text(wire.node_secret(SECRET, name).hex() + "\n")
    config: dict[str, object] = {"serve": url, "node_id": name, "key_file": str(home / "gate.key")}
    # an hour's grace: the cached verdict stays fresh however long the runs take on a loaded machine
    config.update(state_dir=str(home / "state"), drain=False, grace=3600)
    (home / "gate.json").write_text(json.dumps(config))
    return home


def timed(python: str, home: Path | None, runs: int, expect: int) -> dict[str, float]:
    """Seconds of `runs` gate runs on `home` (None: the interpreter starting and doing nothing, the
    floor every run pays; on a loaded machine it is most of the figure)."""
    seconds = []
    argv = (
        [python, "-c", "pass"]
        if home is None
        else [python, str(home / "gate.py"), "--config", str(home / "gate.json")]
    )
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if done.returncode != expect:
            now = time.strftime("%H:%M:%S", time.gmtime())
            raise SystemExit(
                f"{home} at {now}: exit {done.returncode}, not {expect}: {done.stderr}"
                + "".join(SERVE_LOG[-5:])
            )
    seconds.sort()
    return {
        "p50_s": round(statistics.median(seconds), 4),
        "p99_s": round(seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))], 4),
        "max_s": round(seconds[-1], 4),
    }


def retarget(home: Path, url: str) -> None:
    config = json.loads((home / "gate.json").read_text())
    (home / "gate.json").write_text(json.dumps({**config, "serve": url}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/gate_latency.json")
    args = parser.parse_args()
    python = shutil.which("python3", path="/usr/bin") or sys.executable  # the node's python
    figures: dict[str, object] = {"runs": args.runs, "python": python, "target_s": 1.0}
    with tempfile.TemporaryDirectory(prefix="gate-latency-") as folder:
        top = Path(folder)
        proc, url = start_serve(top)
        try:
            clear, hot = node(top, url, "node02"), node(top, url, "node01")
            figures["serve_up_clear"] = timed(python, clear, args.runs, 0)
            figures["serve_up_failing"] = timed(python, hot, args.runs, 1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        figures["serve_stopped_cached"] = timed(python, clear, args.runs, 0)
        with socket.socket() as hung:  # accepts (the kernel's backlog) and never answers
            hung.bind(("127.0.0.1", 0))
            hung.listen(1024)
            retarget(clear, f"http://127.0.0.1:{hung.getsockname()[1]}")
            figures["serve_hung_cached"] = timed(python, clear, args.runs, 0)
    figures["python_start_only"] = timed(python, None, args.runs, 0)
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    states = [figures[k] for k in figures if k.startswith("serve_")]
    figures["met"] = all(state["p99_s"] < 1.0 for state in states)  # type: ignore[index]
    write_results(args.out, figures)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
