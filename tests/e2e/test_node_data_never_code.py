"""Node data never becomes code. A node whose smartctl names its disk
`/dev/{{ lookup('pipe', 'id > $STETHOSCOPE_PWNED; echo sda') }}` once had that command run on the
controller by `diagnose --execute`: the finding reached the evidence playbook as an extra var, which
Ansible renders. Now a name that is no device name is refused where it enters (the callback, here
through a real sweep of the real smart_facts module), and what a store holds from before reaches
Ansible as `!unsafe` data: the shipped evidence playbook, run by ansible-runner, keeps it as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

from test_execute import NODES, others_report

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import FIXTURES, TOP, ansible_env, fake_tools

ATTACK = "{{ lookup('pipe', 'id > $STETHOSCOPE_PWNED; echo sda') }}"
DISK = FIXTURES / "public/smartctl/sata_hdd_seagate_realloc304.json"  # 304 reallocated sectors


def hostile_smartctl(tmp_path: Path) -> Path:
    """A smartctl that answers with a real capture whose device name is the attack."""
    capture = json.loads(DISK.read_text(encoding="utf-8"))
    capture["device"]["name"] = f"/dev/{ATTACK}"
    answer = tmp_path / "smartctl.json"
    answer.write_text(json.dumps(capture), encoding="utf-8")
    bindir = tmp_path / "bin"
    fake_tools(bindir, tmp_path / "tools.log", {"smartctl": f"cat '{answer}'; exit 0"})
    return bindir


def inventory(tmp_path: Path) -> Path:
    """The eight nodes, run locally by this Python (the evidence playbook's modules run on them)."""
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir(exist_ok=True)
    hosts = {node: {"slurm_name": node} for node in NODES}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path.write_text(json.dumps({"all": {"vars": local, "children": {"gpu_nodes": {"hosts": hosts}}}}))
    return path


def rule_dir(tmp_path: Path, actions: list[dict]) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "reallocated.yml").write_text(
        textwrap.dedent("""
        - rule_id: reallocated_evidence
          description: reallocated sectors (test)
          severity: critical
          level: L2
          message: "{{ node_id }} {{ device }}: {{ value | int }} reallocated sectors"
          trigger:
            - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 10m,
               aggregate: last}
        """)
        + f"  action: {json.dumps(actions)}\n"
    )
    return folder


def execute(tmp_path: Path, dsn: str, rules: Path, pwned: Path) -> subprocess.CompletedProcess:
    evidence = tmp_path / "evidence"
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "diagnose", "--json", "--execute",
        "--rules", str(rules), "--inventory", str(inventory(tmp_path)),
        "-e", f"stethoscope_evidence_dir={evidence}", "-e", f"stethoscope_diagnose_log={tmp_path / 'log'}",
    ]  # fmt: skip
    env = {**ansible_env(tmp_path, dsn), "STETHOSCOPE_PWNED": str(pwned)}
    return subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, check=False)


EVIDENCE = [{"type": "playbook", "playbook": "remediate/evidence.yml"}]


def test_a_template_in_a_swept_device_name_is_refused_at_the_callback_and_never_runs(tmp_path, tmp_dsn):
    bindir = hostile_smartctl(tmp_path)
    playbook = tmp_path / "sweep.yml"
    playbook.write_text(
        textwrap.dedent(f"""
        - name: Sweep one node's disks
          hosts: node03
          gather_facts: false
          tasks:
            - name: Read SMART
              aicluster.stethoscope.smart_facts:
                devices: [sda]
              environment:
                PATH: "{bindir}:{os.environ["PATH"]}"
        """)
    )
    subprocess.run([sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "db", "init"], check=True)
    env = ansible_env(tmp_path, tmp_dsn, ANSIBLE_INVENTORY=str(inventory(tmp_path)))
    sweep = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            str(playbook),
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:]
    assert "device not a device name" in " ".join((sweep.stdout + sweep.stderr).split())
    refused = [
        json.loads(line)
        for path in sorted((tmp_path / "spool/rejected").glob("*.ndjson"))
        for line in path.read_text().splitlines()
    ]
    assert refused and {r["reason"] for r in refused} == {"device not a device name"}
    assert {r["row"]["device"] for r in refused} == {ATTACK}
    with Store(tmp_dsn) as store:
        stored = store.query("SELECT DISTINCT device FROM stethoscope.metrics WHERE node_id = 'node03'")
        others_report(store, now_ms(), besides="node03")
    assert ATTACK not in {device for (device,) in stored}

    pwned = tmp_path / "pwned"
    run = execute(tmp_path, tmp_dsn, rule_dir(tmp_path, EVIDENCE), pwned)
    assert run.returncode in (0, 1), run.stderr
    assert not pwned.exists(), pwned.read_text()


def held_from_before(dsn: str, device: str) -> None:
    """A store that holds a hostile device name from before names were checked where rows enter
    (`insert_metrics` writes as given: the store's own rows are not checked again)."""
    at = now_ms() - 5_000
    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        batch.append("node03", "smart_reallocated_sector_ct", device, {}, 304.0, at)
        store.insert_metrics(batch)
        others_report(store, at, besides="node03")


def test_node_text_a_store_held_reaches_the_evidence_playbook_as_data_never_code(tmp_path, tmp_dsn):
    held_from_before(tmp_dsn, ATTACK)
    pwned = tmp_path / "pwned"
    run = execute(tmp_path, tmp_dsn, rule_dir(tmp_path, EVIDENCE), pwned)
    assert run.returncode == 1, run.stderr
    (finding,) = [f for f in json.loads(run.stdout) if f["rule_id"] == "reallocated_evidence"]
    assert finding["outcome"] == "playbook:remediate/evidence.yml ok"
    assert not pwned.exists(), pwned.read_text()
    with tarfile.open(tmp_path / "evidence" / finding["txn_id"] / "node03.tar.gz") as bundle:
        manifest = json.load(bundle.extractfile("./manifest.json"))
    # the bundle's manifest holds the text the node sent, as text: in the device, and in the message
    # that quotes it
    assert manifest["finding"]["device"] == ATTACK
    assert manifest["finding"]["message"] == f"node03 {ATTACK}: 304 reallocated sectors"
