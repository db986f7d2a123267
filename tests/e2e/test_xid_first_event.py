"""The first XID on a GPU, end to end: the real gpu_facts module in real ansible-playbook runs on the
real H200 capture, through the ClickHouse callback into embedded ClickHouse, judged by the shipped
rules. The kernel log is the real one with real XID lines (gcm's capture) appended at the process
boundary, as tools/lab.py derives faults."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import PUBLIC, REAL, TOP, ansible_env, fake_tools

NODE = "gpu-node01"
PLAYBOOK = """\
- name: One sweep of the GPU facts
  hosts: all
  gather_facts: false
  tasks:
    - name: Collect gpu facts
      aicluster.stethoscope.gpu_facts:
        root: "{{ node_root }}"
        state_dir: "{{ node_state }}"
"""
# gcm's real `dmesg -T` capture: XID 31 and XID 48 of one GPU
GCM = (PUBLIC / "dmesg/xid_31_48_dmesg-T_gcm.txt").read_text().splitlines()


H200_QUERY = "real/h200-vm/commands/nvidia-smi_-q_-x.xml"


def at_boot_time(line: str, seconds: float) -> str:
    """The real line as plain `dmesg` prints it on the H200 (its bus, a boot-relative stamp)."""
    line = re.sub(r"^\[[^\]]+\]", f"[{seconds:12.6f}]", line)
    return re.sub(r"PCI:[0-9a-f:]+\)", "PCI:0000:00:06)", line) + "\n"


def sweep(
    tmp_path: Path, dsn: str, kernel_log: str, query: str = H200_QUERY, check: bool = True
) -> subprocess.CompletedProcess:
    """One real ansible-playbook run of gpu_facts with the ClickHouse callback; dmesg prints `kernel_log`,
    `nvidia-smi -q -x` answers `query` (a capture, or a shell line); `check`: the run must succeed."""
    log_file, bindir = tmp_path / "dmesg.txt", tmp_path / "bin"
    log_file.write_text(kernel_log)
    fake_tools(
        bindir,
        tmp_path / "argv.log",
        {
            "nvidia-smi": {
                "-q -x": query,
                "dmon -c 1 -s pucvmet": "real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt",
            },
            "dmesg": str(log_file),
        },
    )
    root = tmp_path / "root"
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("6f1c7a52-boot\n")
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.ini").write_text(
        f"{NODE} ansible_connection=local ansible_python_interpreter={sys.executable} "
        f"node_root={root} node_state={tmp_path / 'state'}\n"
    )
    env = ansible_env(
        tmp_path,
        dsn,
        PATH=f"{bindir}:{ansible_env(tmp_path)['PATH']}",
        ANSIBLE_CALLBACKS_ENABLED="aicluster.stethoscope.clickhouse",
    )
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.ini"),
            str(tmp_path / "play.yml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0 or not check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def findings(dsn: str) -> list[tuple[str, str, str, str]]:
    rules = load_rules(TOP / "rules", Catalog.load())
    assert rules.errors == []
    with Store(dsn) as store:
        found = diagnose(store, rules.rules, now_ms())
    return [(f["rule_id"], f["node_id"], f["device"], f["severity"]) for f in found]


def xid_series(dsn: str) -> dict[str, list[float]]:
    with Store(dsn) as store:
        rows = store.query(
            "SELECT labels['xid'], groupArray(value) FROM "
            "(SELECT * FROM stethoscope.metrics FINAL WHERE metric_name = 'gpu_xid_errors_total' "
            "ORDER BY timestamp) GROUP BY labels['xid']"
        )
    return {xid: list(values) for xid, values in rows}


def test_first_xid_on_a_gpu_fires_its_rule_end_to_end(tmp_path, tmp_dsn):
    real_log = (REAL / "commands/dmesg_nvrm_lines.txt").read_text()
    installed = real_log + at_boot_time(GCM[0], 5012.114211)  # an old XID 31, before stethoscope came
    sweep(tmp_path, tmp_dsn, installed)
    # installing stethoscope is no event: the old XID is one info finding and no critical one
    assert findings(tmp_dsn) == [("gpu_xid_preexisting", NODE, "gpu0", "info")]
    sweep(tmp_path, tmp_dsn, installed + at_boot_time(GCM[1], 6000.5))  # the GPU's first XID 48
    assert xid_series(tmp_dsn) == {"31": [0.0, 0.0], "48": [1.0]}  # the collector's shape
    critical = [f for f in findings(tmp_dsn) if f[3] == "critical"]
    assert critical == [("gpu_xid_48", NODE, "gpu0", "critical")]
