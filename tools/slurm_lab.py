#!/usr/bin/env python3
"""A real Slurm controller for the lab: munged and slurmctld (Debian's packages) under one folder,
with the lab's node names. Without slurmd the nodes never respond, and are never marked DOWN for it
(SlurmdTimeout=0; DRAIN flags, DOWN set by hand and reasons still work); `start_slurmd(name)` runs
Debian's slurmd for one of them, so jobs (`sbatch --wrap 'sleep 300'`) give it real ALLOCATED and
DRAINING states. The tests import it; molecule's slurm_drain scenario runs it:

    tools/slurm_lab.py start DIR    # writes DIR/slurm.conf, starts munged and slurmctld, waits
    tools/slurm_lab.py stop DIR
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REQUIRED = ("munged", "mungekey", "slurmctld", "scontrol")
WITH_SLURMD = ("slurmd", "sbatch")


def missing_tools(required: tuple[str, ...] = REQUIRED) -> list[str]:
    return [
        tool for tool in required if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()
    ]


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """ClusterName=stethoscope-lab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmctldPidFile={dir}/slurmctld.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdSpoolDir={dir}/slurmd
SlurmdPidFile={dir}/slurmd.pid
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
ReturnToService=2
SlurmdTimeout=0
{node_lines}PartitionName=lab Nodes=ALL Default=YES State=UP
"""


class SlurmCluster:
    def __init__(self, root: Path, nodes: str = "node[01-08]", with_slurmd: str | None = None):
        """`with_slurmd`: one node (not in `nodes`) whose slurmd start_slurmd runs, on a port of its
        own, so the slurmd-less nodes still never respond."""
        self.root = root
        self.conf = root / "slurm.conf"
        self.nodes = nodes
        self.with_slurmd = with_slurmd
        self.munged: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        key, sock = self.root / "munge.key", self.root / "munge.sock"
        subprocess.run([_tool("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o400)
        subprocess.run(
            [
                _tool("munged"),
                "--force",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={self.root / 'munged.pid'}",
                f"--log-file={self.root / 'munged.log'}",
                f"--seed-file={self.root / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
        )
        self.conf.write_text(
            CONFIG.format(
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                user=os.environ.get("USER") or "root",
                socket=sock,
                dir=self.root,
                node_lines=self._node_lines(),
            )
        )
        subprocess.run([_tool("slurmctld"), "-f", str(self.conf), "-i"], check=True, capture_output=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.scontrol("ping").returncode == 0:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"slurmctld did not answer: {(self.root / 'slurmctld.log').read_text()[-2000:]}")

    def _node_lines(self) -> str:
        lines = [f"NodeName={self.nodes} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN"]
        if self.with_slurmd:
            lines.append(
                f"NodeName={self.with_slurmd} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 State=UNKNOWN"
            )
        return "\n".join(lines) + "\n"

    def start_slurmd(self, name: str) -> None:
        """Debian's slurmd for node `name` (on 127.0.0.1), waiting until slurmctld sees it IDLE."""
        (self.root / "slurmd").mkdir(exist_ok=True)
        subprocess.run(
            [_tool("slurmd"), "-f", str(self.conf), "-N", name],
            check=True,
            capture_output=True,
            env={**os.environ, **self.env},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = self.node(name)["state"]
            if state.startswith(("IDLE", "ALLOCATED", "MIXED")) and "NOT_RESPONDING" not in state:
                return
            time.sleep(0.5)
        log = (self.root / "slurmd.log").read_text()[-2000:] if (self.root / "slurmd.log").exists() else ""
        raise RuntimeError(f"slurmd for {name} did not register: {self.node(name)} {log}")

    def sbatch(self, name: str, command: str) -> str:
        """Submit `command` to node `name`; its job id."""
        proc = subprocess.run(
            [
                shutil.which("sbatch") or "sbatch",
                "--parsable",
                "-w",
                name,
                "-o",
                "/dev/null",
                "--wrap",
                command,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            check=True,
        )
        return proc.stdout.strip().split(";")[0]

    def wait_state(self, name: str, prefix: str, seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            state = self.node(name)["state"]
            if state.startswith(prefix):
                return state
            time.sleep(0.3)
        raise RuntimeError(f"{name} never reached {prefix}: {self.node(name)}")

    def scontrol(self, *argv: str, timeout: float | None = None) -> subprocess.CompletedProcess:
        """scontrol's run; one that outlasts `timeout` seconds reads as failed (exit 124)."""
        command = [_tool("scontrol"), *argv]
        try:
            environment = {**os.environ, **self.env}
            return subprocess.run(
                command, capture_output=True, text=True, env=environment, check=False, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(command, 124, "", f"scontrol timed out after {timeout:.0f} s")

    def node(self, name: str) -> dict[str, str]:
        """State and Reason of one node, as `scontrol -o show node` prints them."""
        fields = _fields(self.scontrol("-o", "show", "node", name).stdout.strip())
        return {"state": fields.get("State", ""), "reason": fields.get("Reason", "")}

    def undrain_all(self, seconds: float = 60) -> None:
        """Every node back without DRAIN or DOWN: each test starts from a cluster nobody has drained.
        Checked, not assumed: a slurmctld busy past scontrol's MessageTimeout (a loaded 2-core
        machine) fails the node listing or a RESUME, which left a node drained for the next test."""

        def out_of_service(fields: dict[str, str]) -> bool:
            return any(flag in fields.get("State", "") for flag in ("DRAIN", "DOWN"))

        self._settle(
            "node", out_of_service, lambda name: ("update", f"NodeName={name}", "State=RESUME"), seconds
        )

    def clear_reservations(self, seconds: float = 60) -> None:
        """No reservation left by a test before (a maintenance window silences its nodes' findings),
        checked as undrain_all checks its nodes."""
        self._settle(
            "reservation", lambda _fields: True, lambda name: ("delete", f"reservationname={name}"), seconds
        )

    def _settle(self, kind: str, pending, fix, seconds: float) -> None:
        """Until `scontrol -o show KIND` answers and lists no entry `pending` holds for, `fix` each
        (an scontrol command for its name); past `seconds`, RuntimeError naming what is left."""
        deadline = time.monotonic() + seconds
        while True:
            shown = self.scontrol("-o", "show", kind, timeout=max(1.0, deadline - time.monotonic()))
            entries = [_fields(line) for line in shown.stdout.splitlines()] if shown.returncode == 0 else []
            left = [fields[_NAME[kind]] for fields in entries if _NAME[kind] in fields and pending(fields)]
            if shown.returncode == 0 and not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm kept {kind}s: {left or shown.stderr.strip()}")
            for name in left:
                self.scontrol(*fix(name), timeout=10)
            time.sleep(0.3)

    def stop(self) -> None:
        for pid_file in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            path = self.root / pid_file
            if path.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(path.read_text().strip()), signal.SIGTERM)


_NAME = {"node": "NodeName", "reservation": "ReservationName"}


def _fields(line: str) -> dict[str, str]:
    """The KEY=VALUE fields of one `scontrol -o show` line; Reason, free text, runs to the end."""
    head, _sep, reason = line.partition(" Reason=")
    fields = dict(token.split("=", 1) for token in head.split() if "=" in token)
    return {**fields, "Reason": reason} if reason else fields


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: slurm_lab.py start|stop DIR", file=sys.stderr)
        return 2
    cluster = SlurmCluster(Path(argv[1]))
    if argv[0] == "start":
        cluster.start()
        print(f"slurmctld answers; SLURM_CONF={cluster.conf}")
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
