"""env_lock on a node root in a temp dir (sysfs, procfs, GRUB), the MTU on a real veth pair inside a
network namespace, the NVMe write cache through a stateful nvme-cli stand-in at the process boundary."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PUBLIC, REAL, fake_tools, run_module


def node_root(tmp_path: Path) -> Path:
    """The real H200 VM root, plus what a bare-metal node has: cpufreq, cpuidle, GRUB, PM QoS."""
    root = tmp_path / "root"
    shutil.copytree(REAL / "root", root)
    cpu = root / "sys/devices/system/cpu"
    for n in range(2):
        (cpu / f"cpu{n}/cpufreq").mkdir(parents=True)
        (cpu / f"cpu{n}/cpufreq/scaling_governor").write_text("powersave\n")
        for state in range(4):
            (cpu / f"cpu{n}/cpuidle/state{state}").mkdir(parents=True)
            (cpu / f"cpu{n}/cpuidle/state{state}/disable").write_text("0\n")
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/grub").write_text('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
    (root / "dev").mkdir()
    (root / "dev/cpu_dma_latency").write_bytes(b"")
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file's content; the PM QoS file is a character device on a node (what the holder writes
    there is a request, not state), a plain file here, so it is left out."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "cpu_dma_latency")
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in files}


def test_lock_is_checked_recorded_idempotent_and_restored_exactly(tmp_path):
    root, state = node_root(tmp_path), tmp_path / "state"
    empty = tmp_path / "bin"
    empty.mkdir()
    before = snapshot(root)
    args = {"root": str(root), "state_dir": str(state), "persistent_cstates": True}
    checked = run_module(tmp_path, "env_lock", args, empty, check=True)
    assert checked["changed"] is True and snapshot(root) == before and not state.exists()
    knobs = sorted({c["knob"] for c in checked["changes"]})
    assert knobs == ["cpu_dma_latency", "cstates", "governor", "grub", "numa_balancing"]
    governor = [c for c in checked["changes"] if c["target"].endswith("cpu0/cpufreq/scaling_governor")]
    assert [(c["before"], c["after"]) for c in governor] == [("powersave", "performance")]

    locked = run_module(tmp_path, "env_lock", args, empty)
    assert locked["changed"] is True and locked["reboot_required"] is True
    assert (
        root / "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor"
    ).read_text().strip() == "performance"
    assert (root / "sys/devices/system/cpu/cpu0/cpuidle/state2/disable").read_text().strip() == "1"
    assert (
        root / "sys/devices/system/cpu/cpu0/cpuidle/state1/disable"
    ).read_text().strip() == "0"  # C1 stays
    assert (root / "proc/sys/kernel/numa_balancing").read_text().strip() == "0"
    assert "intel_idle.max_cstate=1 processor.max_cstate=1" in (root / "etc/default/grub").read_text()
    recorded = (state / "env_lock.json").read_text()
    assert '"before": "powersave"' in recorded
    pid = __import__("json").loads(recorded)["holder_pid"]
    assert b"stethoscope-cpu-dma-latency" in Path(f"/proc/{pid}/cmdline").read_bytes()

    again = run_module(tmp_path, "env_lock", args, empty)
    assert again["changed"] is False and again["changes"] == []

    restored = run_module(tmp_path, "env_lock", {**args, "state": "restored"}, empty)
    assert restored["changed"] is True
    assert snapshot(root) == before  # exactly the previous state, GRUB file included
    assert (
        not Path(f"/proc/{pid}").exists() or b"stethoscope" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    assert run_module(tmp_path, "env_lock", {**args, "state": "restored"}, empty)["changed"] is False


def test_a_vm_without_the_knobs_skips_them_with_reasons(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_module(
        tmp_path,
        "env_lock",
        {"root": str(REAL / "root"), "state_dir": str(tmp_path / "s")},
        empty,
        check=True,
    )
    reasons = {s["knob"]: s["skipped"] for s in result["skipped_knobs"]}
    assert "no cpufreq" in reasons["governor"] and "driver none" in reasons["cstates"]
    assert result["changed"] is False and not result.get("failed")  # NUMA balancing is already 0 there


def test_nvme_volatile_write_cache_off_then_back_on(tmp_path):
    root, bindir, log = node_root(tmp_path), tmp_path / "bin", tmp_path / "argv.log"
    (root / "sys/class/nvme/nvme0").mkdir(parents=True)
    value = tmp_path / "vwc"
    value.write_text("1")
    fake_tools(
        bindir,
        log,
        {
            "nvme": {
                "get-feature /dev/nvme0 --feature-id=0x06": (
                    "printf 'get-feature:0x06 (Volatile Write Cache), Current value:0x%08x\\n' "
                    + f"$(cat {value})"
                ),
                "set-feature /dev/nvme0 --feature-id=0x06 --value=0": f"echo 0 > {value}; echo ok",
                "set-feature /dev/nvme0 --feature-id=0x06 --value=1": f"echo 1 > {value}; echo ok",
            }
        },
    )
    args = {"root": str(root), "state_dir": str(tmp_path / "s"), "hold_cpu_dma_latency": False}
    run_module(tmp_path, "env_lock", args, bindir)
    assert value.read_text().strip() == "0"
    calls = log.read_text().splitlines()
    assert "nvme set-feature /dev/nvme0 --feature-id=0x06 --value=0" in calls  # never 0x08, never -v
    run_module(tmp_path, "env_lock", {**args, "state": "restored"}, bindir)
    assert value.read_text().strip() == "1"


@pytest.fixture
def netns():
    name = "stethoscope-test"
    setup = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if setup.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {setup.stderr.strip()}")
    subprocess.run(
        ["ip", "netns", "exec", name, "ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
        check=True,
    )
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False)


def test_mtu_on_a_real_veth_pair_in_a_namespace(tmp_path, netns):
    """The module itself runs inside the namespace (root=/), so `ip link set` changes a real link."""
    state = tmp_path / "state"
    script = (
        "import json, sys; sys.argv = ['env_lock', sys.argv[1]];"
        "from ansible_collections.aicluster.stethoscope.plugins.modules import env_lock; env_lock.main()"
    )

    def run(state_name):
        args = {
            "ANSIBLE_MODULE_ARGS": {
                "state": state_name,
                "state_dir": str(state),
                "mtu": {"veth0": 4092},
                "hold_cpu_dma_latency": False,
                "nvme_write_cache_off": False,
                "numa_balancing": False,
            }
        }
        path = tmp_path / "args.json"
        path.write_text(__import__("json").dumps(args))
        proc = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            check=False,
            env={
                "PYTHONPATH": str(Path(__file__).resolve().parents[3] / ".collections"),
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            },
        )
        return __import__("json").loads(proc.stdout)

    def mtu():
        out = subprocess.run(
            ["ip", "netns", "exec", netns, "cat", "/sys/class/net/veth0/mtu"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    assert mtu() == "1500"
    locked = run("locked")
    assert locked["changed"] is True and mtu() == "4092"
    assert run("locked")["changed"] is False
    assert run("restored")["changed"] is True and mtu() == "1500"


def argv_recorder(bindir: Path, log: Path, names: list[str]) -> None:
    """Bootloader tools at the process boundary: each call's argv, one bracketed argument at a time,
    so `--args=a b` (one argument) and `--args=a b` split in two read differently."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name in names:
        script = bindir / name
        record = f'{{ printf "{name}"; for a in "$@"; do printf " [%s]" "$a"; done; echo; }} >> "{log}"'
        script.write_text(f"#!/bin/sh\n{record}\n")
        script.chmod(0o755)


BOOTLOADER_ARGV = {
    "grubby": (
        ["grubby [--update-kernel=ALL] [--args=intel_idle.max_cstate=1]"],
        ["grubby [--update-kernel=ALL] [--remove-args=intel_idle.max_cstate=1]"],
    ),
    "update-grub": (["update-grub"], ["update-grub"]),
    "grub2-mkconfig": (
        ["grub2-mkconfig [-o] [/boot/grub2/grub.cfg]"],
        ["grub2-mkconfig [-o] [/boot/grub2/grub.cfg]"],
    ),
}


@pytest.mark.parametrize("tool", sorted(BOOTLOADER_ARGV))
def test_bootloader_restore_removes_exactly_what_lock_added(tmp_path, tool):
    # the admin already had processor.max_cstate=1: lock adds only intel_idle's, restore removes only it
    root, bindir, log = node_root(tmp_path), tmp_path / "bin", tmp_path / "argv.log"
    grub = root / "etc/default/grub"
    grub.write_text('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=1"\n')
    (root / "boot/loader/entries").mkdir(parents=True)
    before = grub.read_text()
    argv_recorder(bindir, log, ["grubby", "update-grub", "grub2-mkconfig"])
    args = {
        "root": str(root),
        "state_dir": str(tmp_path / "s"),
        "persistent_cstates": True,
        "hold_cpu_dma_latency": False,
        "bootloader": tool,
    }
    lock_argv, restore_argv = BOOTLOADER_ARGV[tool]

    locked = run_module(tmp_path, "env_lock", args, bindir)
    assert not locked["failed"] and locked["reboot_required"]
    assert (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet processor.max_cstate=1 intel_idle.max_cstate=1"'
        in grub.read_text()
    )
    assert log.read_text().splitlines() == lock_argv
    again = run_module(tmp_path, "env_lock", args, bindir)
    assert again["changed"] is False and log.read_text().splitlines() == lock_argv  # idempotent: no call

    restored = run_module(tmp_path, "env_lock", {**args, "state": "restored"}, bindir)
    assert restored["changed"] and restored["reboot_required"]
    assert grub.read_text() == before
    assert log.read_text().splitlines() == lock_argv + restore_argv
    twice = run_module(tmp_path, "env_lock", {**args, "state": "restored"}, bindir)
    assert twice["changed"] is False and log.read_text().splitlines() == lock_argv + restore_argv


GRUB_LAYOUTS = {
    # Debian layout, single-quoted: the edit lands inside the quotes
    "single-quoted Debian": (
        b"GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT='quiet splash'\nGRUB_CMDLINE_LINUX=\"\"\n",
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash intel_idle.max_cstate=1 processor.max_cstate=1'",
    ),
    # RHEL layout (only GRUB_CMDLINE_LINUX): edited there, no _DEFAULT line left behind by restore
    "RHEL, only GRUB_CMDLINE_LINUX": (
        (PUBLIC / "grub/rhel7_cloud_image").read_bytes(),
        'GRUB_CMDLINE_LINUX="console=tty0 crashkernel=auto console=ttyS0,115200n8 no_timer_check '
        'net.ifnames=0 intel_idle.max_cstate=1 processor.max_cstate=1"',
    ),
}


@pytest.mark.parametrize("layout", sorted(GRUB_LAYOUTS))
def test_grub_layouts_locked_once_and_restored_byte_exact(tmp_path, layout):
    original, edited_line = GRUB_LAYOUTS[layout]
    root, bindir = node_root(tmp_path), tmp_path / "bin"
    bindir.mkdir()
    grub = root / "etc/default/grub"
    grub.write_bytes(original)
    args = {
        "root": str(root),
        "state_dir": str(tmp_path / "s"),
        "persistent_cstates": True,
        "hold_cpu_dma_latency": False,
    }
    locked = run_module(tmp_path, "env_lock", args, bindir)
    assert not locked["failed"] and locked["reboot_required"]
    assert edited_line in grub.read_text().splitlines()
    if b"GRUB_CMDLINE_LINUX_DEFAULT" not in original:
        assert "GRUB_CMDLINE_LINUX_DEFAULT" not in grub.read_text()
    again = run_module(tmp_path, "env_lock", args, bindir)
    assert again["changed"] is False and again["reboot_required"] is False
    restored = run_module(tmp_path, "env_lock", {**args, "state": "restored"}, bindir)
    assert restored["changed"] and restored["reboot_required"]
    assert grub.read_bytes() == original


def test_a_grub_file_it_cannot_edit_safely_fails_naming_the_line(tmp_path):
    root, bindir = node_root(tmp_path), tmp_path / "bin"
    bindir.mkdir()
    grub = root / "etc/default/grub"
    grub.write_text('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="$(cat /etc/kernel/cmdline)"\n')
    args = {"root": str(root), "state_dir": str(tmp_path / "s"), "persistent_cstates": True}
    result = run_module(tmp_path, "env_lock", args, bindir)
    assert result["failed"] and not result.get("changed")
    assert f"{grub}: a command substitution at line 2" in result["msg"]
    assert grub.read_text().endswith('"$(cat /etc/kernel/cmdline)"\n')
