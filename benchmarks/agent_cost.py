"""The push agent's cost on this machine: resident memory and CPU of one agent process at its period,
reading a lab node's root (IB counters, AER) and replaying the recorded H200 capture as its GPU,
run the way a node runs it (`python3 agent.py --config agent.json`, copied files, no stethoscope).

    python benchmarks/agent_cost.py [--minutes 10] [--period 5] [--node node02]

Target: RSS <= 20 MB and CPU <= 0.5 % of one core averaged over 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.telemetry.keyring import Keyring  # noqa: E402
from stethoscope.telemetry.lab import agent_config  # noqa: E402
from stethoscope.telemetry.metric_set import load_sets  # noqa: E402


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--period", type=float, default=5.0)
    parser.add_argument("--node", default="node02")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agent-cost-"))
    lab = work / "lab"
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(lab)}
    subprocess.run([sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "2"], env=env, check=True)
    node_dir = work / "opt"
    node_dir.mkdir()
    for name in ("agent.py", "wire.py", "sysfs_devices.py"):  # as the push_agent role copies them
        shutil.copy(TOP / "roles/push_agent/files" / name, node_dir / name)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    received = [0]

    def drain() -> None:
        while True:
            receiver.recv(2048)
            received[0] += 1

    threading.Thread(target=drain, daemon=True).start()
    keyring = Keyring({2: args.node}, [b"agent-cost-benchmark-secret"])
    config = agent_config(
        args.node,
        keyring,
        load_sets()["gpu_node"],
        "127.0.0.1:%d" % receiver.getsockname()[1],
        lab / "nodes" / args.node / "root",
        args.period,
    )
    (work / "agent.json").write_text(json.dumps(config))
    duration = args.minutes * 60
    agent = subprocess.Popen(
        [sys.executable, str(node_dir / "agent.py"), "--config", str(work / "agent.json")],
        cwd=work,
        env={"PATH": os.environ.get("PATH", "/usr/bin")},  # no PYTHONPATH: the node has no stethoscope
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)  # start-up (interpreter, imports) is not the steady state
    cpu0, t0, rss_max = _cpu_seconds(agent.pid), time.time(), 0
    while time.time() - t0 < duration:
        time.sleep(min(5.0, duration - (time.time() - t0)) if duration > 0 else 0)
        rss_max = max(rss_max, _rss_kb(agent.pid))
    cpu, wall = _cpu_seconds(agent.pid) - cpu0, time.time() - t0
    agent.terminate()
    _out, err = agent.communicate(timeout=30)
    figures = {
        "node": args.node,
        "period_s": args.period,
        "wall_s": round(wall, 1),
        "rss_max_mb": round(rss_max / 1024, 2),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
        "datagrams_received": received[0],
        "agent": err.strip().splitlines()[-1] if err.strip() else "",
        "python": sys.version.split()[0],
    }
    print(json.dumps(figures, indent=1))
    if args.out:
        write_results(args.out, figures)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
