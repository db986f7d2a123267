#!/usr/bin/env python3
"""The lab: a simulated GPU cluster built from real tool captures (tests/fixtures).

Each node gets a root prefix (sysfs/procfs files, read by the fact modules through their `root`
option) and a tool folder put first on PATH, whose nvidia-smi, smartctl, dmesg, ibv_devinfo, rdma,
nvme and lspci replay recorded output chosen by their arguments (the process boundary). nccl-tests'
all_reduce_perf replays a real 8-GPU run, its mpirun and srun stand-ins a real 2-node, 16-rank one
(by the rank count their argv asks for); perftest's stand-ins listen and connect on loopback for real
(a client finding no server is refused, as perftest is) and log each step in the lab's perftest.log.

Faulted variants are derived here, from the real outputs, by the functions named in FAULTS: anyone
can read what was changed and regenerate it. Two nodes have 8 GPUs (node02: the H200 capture's
<gpu> element once per GPU of the real 8 x H100 `nvidia-smi -q` capture, with that GPU's bus id,
serial, UUID, VBIOS and temperature; node05: the A100 capture's, once per GPU of the real 8 x A100
NVLink capture), and node02 gets a newer driver at step 2 (a hardware-change event).

Outputs no real sample exists for (`nvidia-smi nvlink
-e`, `-gt d`, `rdma -j res show qp`, `nvme get-feature`) are constructed in the tools' documented
formats and carry SYNTHETIC in their file names.

The replay advances one step per sweep (`advance`, run by playbooks/collect.yml on an inventory with
the lab's empty `stethoscope_lab` group, which `build --inventory` writes): counters on faulted
nodes grow, so rates and trends are real across several sweeps.

    python tools/lab.py build [--nodes N] [--inventory PATH]   # (re)build .lab at step 0
    python tools/lab.py advance                                # next step (builds first if needed)
    python tools/lab.py inject NODE FAULT                      # a fault that starts now (xid_79)
    python tools/lab.py episodes --out DIR [--seed 7] [--per-family N] [--hw-class h200|shifted]
                                   # the learned diagnosis's training data (stethoscope_training.episodes)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
FIXTURES = TOP / "tests" / "fixtures"
REAL = FIXTURES / "real" / "h200-vm"
PUBLIC = FIXTURES / "public"
LAB = Path(os.environ.get("STETHOSCOPE_LAB_DIR") or TOP / ".lab").resolve()
DEFAULT_NODES = 8


@dataclass
class Profile:
    """What a node is made of: a GPU capture, optional IB/NVLink/disks, and its faults."""

    gpu: str  # h200 | a100 | t4
    disks: dict[str, str] = field(default_factory=dict)  # block name -> smartctl fixture
    ib: str | None = None  # gpud (H100 ConnectX-7 tree) | procfs (mlx5_0 EDR)
    nvlink: bool = False
    aer: bool = False
    faults: tuple[str, ...] = ()
    eight_gpus: bool = False  # an 8-GPU node, derived from the real 8-GPU captures (eight_gpu_xml)


PROFILES = [
    Profile("h200", {"nvme0n1": "nvme_samsung_pm9a3_healthy.json"}),
    Profile(
        "h200",
        {"nvme0n1": "nvme_corsair_mp510_healthy.json"},
        ib="gpud",
        aer=True,
        faults=("driver_upgrade",),
        eight_gpus=True,
    ),
    Profile(
        "h200", {"nvme0n1": "nvme_samsung_pm9a3_healthy.json"}, faults=("thermal_throttle", "slow_bench")
    ),
    Profile("h200", {"nvme0n1": "nvme_samsung_pm9a3_healthy.json"}, faults=("row_remap_pending",)),
    Profile(
        "a100",
        {"nvme0n1": "nvme_samsung_pm9a3_healthy.json"},
        ib="procfs",
        nvlink=True,
        aer=True,
        eight_gpus=True,
    ),
    Profile(
        "a100",
        {"sda": "sata_ssd_samsung_pm883_healthy.json"},
        ib="procfs",
        nvlink=True,
        aer=True,
        faults=("nvlink_crc", "aer_storm"),
    ),
    Profile(
        "t4",
        {"sda": "sata_ssd_intel_s4500_realloc4_wear55.json", "sdb": "sata_hdd_seagate_realloc304.json"},
        faults=("worn_ssd",),
    ),
    Profile(
        "h200",
        {"nvme0n1": "nvme_intel_p4500_worn_pctused75.json"},
        ib="gpud",
        aer=True,
        faults=("ib_port_down", "ib_symbol_errors", "qp_error", "mtu_mismatch"),
    ),
]
GPU_XML = {
    "h200": REAL / "commands" / "nvidia-smi_-q_-x.xml",
    "a100": PUBLIC / "nvidia-smi" / "q_xml_a100-sxm4-80gb_mig_535.54.03.xml",
    "t4": PUBLIC / "nvidia-smi" / "q_xml_tesla-t4_515.105.01.xml",
}
DMON = REAL / "commands" / "nvidia-smi_dmon_-c5_-s_pucvmet.txt"
NCCL = PUBLIC / "nccl-tests" / "all_reduce_perf_8xA100-SXM4-80GB_nccl2.16.2_gcm.txt"
NCCL_2X8 = PUBLIC / "nccl-tests" / "all_reduce_perf_2node_16xA100-SXM4-80GB_nccl2.12.12_gcm.txt"
FIO = PUBLIC / "fio" / "fio-3.1_randread_4k_qd32_samsung_pm883_sata.json"
FIO_WRITE = PUBLIC / "fio" / "fio-3.1_randwrite_4k_qd32_samsung_pm883_sata.json"
FIO_WRITE_LAT_LOG = PUBLIC / "fio" / "fio-3.1_randwrite_4k_qd32_samsung_pm883_sata_clat.1.log"
RDMA_LAT = PUBLIC / "perftest" / "ib_read_lat_roce_cx5_mlx5_0_spiderpool.txt"
RDMA_BW = PUBLIC / "perftest" / "ib_write_bw_8M_loopback_superbench.txt"
DMESG = REAL / "commands" / "dmesg_nvrm_lines.txt"
# The real XID line (gcm's dmesg sample) whose shape the injected events keep.
XID_TEMPLATE = (PUBLIC / "dmesg" / "xid_31_48_dmesg-T_gcm.txt").read_text().splitlines()[0]


def node_name(index: int) -> str:
    return f"node{index + 1:02d}"


# Slow variants of a fault, built only when named (`--only-faults climbing_ssd`): each takes the place of
# the fault it varies, on the same node and capture.
VARIANTS = {"climbing_ssd": "worn_ssd"}
# Faults that can start on any node of a built lab, at the step it has reached (`inject`): what a
# node that was healthy a sweep ago shows.
INJECTABLE = ("xid_79",)


def profile_of(index: int, only_faults: list[str] | None = None) -> Profile:
    """The node's profile; with `only_faults`, the faults not listed are left out (healthy nodes)."""
    profile = PROFILES[index % len(PROFILES)]
    if only_faults is None:
        return profile
    faults = [f for f in profile.faults if f in only_faults]
    faults += [v for v, base in VARIANTS.items() if v in only_faults and base in profile.faults]
    return replace(profile, faults=tuple(faults))


# ---------------------------------------------------------------------------------------------
# faults: each takes the real text and the step, and returns the derived text
# ---------------------------------------------------------------------------------------------
def xml_set(text: str, tag: str, value: str) -> str:
    derived, count = re.subn(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", text, count=1)
    if not count:
        raise SystemExit(f"lab: <{tag}> not in the capture; cannot derive the fault")
    return derived


def thermal_throttle(xml: str, step: int) -> str:
    xml = xml_set(xml, "gpu_temp", f"{88 + min(step, 6)} C")
    xml = xml_set(xml, "clocks_event_reason_hw_thermal_slowdown", "Active")
    xml = xml_set(xml, "clocks_event_reason_sw_thermal_slowdown", "Active")
    xml = xml_set(xml, "clocks_event_reason_gpu_idle", "Not Active")
    return xml_set(xml, "sm_clock", "1095 MHz")


UPGRADED_DRIVER = "580.172.08"


H100_TEXT = PUBLIC / "nvidia-smi" / "q_text_8xH100-80GB-HBM3_535.161.08.txt"
A100_NVLINK = PUBLIC / "nvidia-smi" / "nvlink_status_8xA100_gpud.txt"
_TEXT_FIELDS = {
    "Product Name": "product_name",
    "Serial Number": "serial",
    "GPU UUID": "uuid",
    "Minor Number": "minor_number",
    "VBIOS Version": "vbios_version",
    "Bus Id": "pci_bus_id",
    "GPU Current Temp": "gpu_temp",
}


def h100_identities() -> list[dict[str, str]]:
    """Per GPU of the real 8 x H100 `nvidia-smi -q` capture: its identity and temperature."""
    gpus: list[dict[str, str]] = []
    for line in H100_TEXT.read_text().splitlines():
        if line.startswith("GPU 0000"):
            gpus.append({})
        elif gpus and " : " in line:
            name, _sep, value = line.partition(" : ")
            tag = _TEXT_FIELDS.get(name.strip())
            if tag and tag not in gpus[-1]:
                gpus[-1][tag] = value.strip()
    return gpus


def a100_identities() -> list[dict[str, str]]:
    """Per GPU of the real 8 x A100 `nvidia-smi nvlink --status` capture: index and UUID; bus ids
    (the HGX A100 board's order) and serials are constructed: the capture names none."""
    buses = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]
    gpus = []
    for line in A100_NVLINK.read_text().splitlines():
        match = re.match(r"GPU (\d+): .*\(UUID: (GPU-[0-9a-f-]+)\)", line)
        if match:
            index = int(match.group(1))
            gpus.append(
                {
                    "minor_number": str(index),
                    "uuid": match.group(2),
                    "pci_bus_id": f"00000000:{buses[index]}:00.0",
                    "serial": str(1650522003820 + index),  # the capture's serial, one per GPU
                }
            )
    return gpus


def eight_gpu_xml(xml: str, identities: list[dict[str, str]]) -> str:
    """The capture's <gpu> element once per GPU of an 8-GPU capture, each with that GPU's identity
    (and temperature where the capture has one); everything else as the real element reports it."""
    match = re.search(r"(\s*<gpu id=\"[^\"]*\">.*?</gpu>)", xml, re.S)
    if not match:
        raise SystemExit("lab: no <gpu> element in the capture; cannot derive an 8-GPU node")
    block, derived = match.group(1), []
    for identity in identities:
        gpu = re.sub(r'<gpu id="[^"]*">', f'<gpu id="{identity["pci_bus_id"]}">', block, count=1)
        for tag, value in identity.items():
            if f"<{tag}>" in gpu:
                gpu = xml_set(gpu, tag, value)
        derived.append(gpu)
    xml = xml.replace(block, "".join(derived))
    return xml_set(xml, "attached_gpus", str(len(identities)))


def driver_upgrade(xml: str, step: int) -> str:
    """From step 2 on (the second collect.yml sweep), the node runs a newer driver: its
    fingerprint changes once, which is a hardware-change event."""
    return xml_set(xml, "driver_version", UPGRADED_DRIVER) if step >= 2 else xml


def row_remap_pending(xml: str, step: int) -> str:
    xml = xml_set(xml, "remapped_row_unc", str(1 + step // 2))
    xml = xml_set(xml, "remapped_row_pending", "Yes")
    return xml_set(xml, "dram_uncorrectable", str(1 + step))


def xid_lines(bus: str, codes: list[int], step: int) -> str:
    """One XID line per code per step so far, timestamps rising; same shape as the real line."""
    lines = []
    for s in range(step + 1):
        for offset, code in enumerate(codes):
            seconds = 1000.0 + s * 60 + offset
            body = XID_TEMPLATE.split("] ", 1)[1]
            body = re.sub(r"PCI:[0-9a-f:]+\)", f"PCI:{bus})", body)
            body = re.sub(r"\): \d+,", f"): {code},", body)
            lines.append(f"[{seconds:12.6f}] {body}")
    return "\n".join(lines) + "\n"


def first_gpu_bus(xml: str) -> str:
    """The kernel's name of GPU 0's bus (`0000:3b:00`) from nvidia-smi's `00000000:3B:00.0`."""
    match = re.search(r"<pci_bus_id>[0-9A-Fa-f]{4}([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})", xml)
    return match[1].lower() if match else "0000:00:06"


def worn_ssd(data: dict, step: int) -> dict:
    for attribute in data["ata_smart_attributes"]["table"]:
        if attribute["name"] == "Reallocated_Sector_Ct":
            raw = 4 + 60 * step  # from the real 4, growing each sweep past the 100 threshold
            attribute["raw"] = {"string": str(raw), "value": raw}
        if attribute["name"] == "Media_Wearout_Indicator":
            attribute["value"] = max(8, 55 - 16 * step)  # real 55 % life left, wearing out to 8
    return data


def climbing_ssd(data: dict, step: int) -> dict:
    """The worn SSD's slow variant: reallocated sectors climb steadily, 2 a sweep from the real 4
    (past the 100 limit at step 49), and the wear-out indicator falls 1 a sweep from the real 55
    (under 10 from step 46): the seed's drive (0 to 217 in three months), in lab time."""
    for attribute in data["ata_smart_attributes"]["table"]:
        if attribute["name"] == "Reallocated_Sector_Ct":
            raw = attribute["raw"]["value"] + 2 * step
            attribute["raw"] = {"string": str(raw), "value": raw}
        if attribute["name"] == "Media_Wearout_Indicator":
            attribute["value"] = max(8, attribute["value"] - step)
    return data


def slow_nccl(text: str, factor: float) -> str:
    """Every result line's bandwidths times `factor` and times divided by it (a congested ring)."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 13 and fields[0].isdigit():
            for i in (5, 9):  # times
                fields[i] = f"{float(fields[i]) / factor:.1f}"
            for i in (6, 7, 10, 11):  # algbw, busbw
                fields[i] = f"{float(fields[i]) * factor:.2f}"
            line = "  " + "  ".join(f"{f:>10}" for f in fields)
        elif line.startswith("# Avg bus bandwidth"):
            line = f"# Avg bus bandwidth    : {float(line.split(':')[1]) * factor:.2f}"
        out.append(line)
    return "\n".join(out) + "\n"


def slow_fio(data: dict, iops_factor: float, latency_factor: float) -> dict:
    """The real PM883 run with fewer IOPS and longer completion latencies (a drive off its cliff)."""
    read = data["jobs"][0]["read"]
    read["iops"] *= iops_factor
    read["bw"] = int(read["bw"] * iops_factor)
    read["clat_ns"]["mean"] *= latency_factor
    read["clat_ns"]["percentile"] = {
        k: int(v * latency_factor) for k, v in read["clat_ns"]["percentile"].items()
    }
    return data


# ---------------------------------------------------------------------------------------------
# node materialisation
# ---------------------------------------------------------------------------------------------
def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def load_ttar(path: Path, dest: Path, strip_prefix: str) -> None:
    """Unpack the records of a ttar text archive (prometheus' fixture format) under dest."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Path: "):
            rel = line[6:].strip()
            kind = lines[i + 1] if i + 1 < len(lines) else ""
            if kind.startswith("Lines: "):
                count = int(kind[7:])
                content = "\n".join(lines[i + 2 : i + 2 + count]) + "\n"
                content = content.replace("EOF\n", "") if content.endswith("EOF\n") else content
                target = dest / rel.removeprefix(strip_prefix).lstrip("/")
                write(target, content)
                i += 2 + count
                continue
            if kind.startswith("SymlinkTo: "):
                i += 2
                continue
        i += 1


def static_root(node: Path, profile: Profile, index: int) -> None:
    root = node / "root"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(REAL / "root", root)
    write(root / "proc/sys/kernel/random/boot_id", f"6f1c2c1e-0000-4000-8000-{index:012d}\n")
    for iface, mtu in (("eth0", 1500), ("ib0", 4096 if "mtu_mismatch" in profile.faults else 2044)):
        write(root / f"sys/class/net/{iface}/mtu", f"{mtu}\n")
    for disk in profile.disks:
        (root / "sys/block" / disk).mkdir(parents=True, exist_ok=True)
        if disk.startswith("nvme"):
            (root / "sys/class/nvme" / disk[:5]).mkdir(parents=True, exist_ok=True)
    if profile.ib == "gpud":
        shutil.copytree(PUBLIC / "sysfs/sys-class-infiniband-h100_gpud", root / "sys/class/infiniband")
    elif profile.ib == "procfs":
        load_ttar(PUBLIC / "sysfs/infiniband_mlx5_0_hw_counters_procfs.ttar", root, "fixtures")
    if profile.aer:
        gpu_dev = root / "sys/bus/pci/devices/0000:00:06.0"
        for kind in ("correctable", "nonfatal", "fatal"):
            shutil.copy(PUBLIC / f"sysfs/aer/aer_dev_{kind}_zero.txt", gpu_dev / f"aer_dev_{kind}")


def dynamic_files(node: Path, profile: Profile, step: int) -> None:
    """Everything that changes with the replay step."""
    out, root = node / "outputs", node / "root"
    xml = GPU_XML[profile.gpu].read_text()
    if profile.eight_gpus:
        xml = eight_gpu_xml(xml, h100_identities() if profile.gpu == "h200" else a100_identities())
    if "thermal_throttle" in profile.faults:
        xml = thermal_throttle(xml, step)
    if "row_remap_pending" in profile.faults:
        xml = row_remap_pending(xml, step)
    if "driver_upgrade" in profile.faults:
        xml = driver_upgrade(xml, step)
    write(out / "nvidia-smi_-q_-x.xml", xml)
    write(out / "nvidia-smi_dmon.txt", DMON.read_text())
    dmesg = DMESG.read_text()
    if "row_remap_pending" in profile.faults:
        dmesg += xid_lines("0000:00:06", [63, 48] if step % 2 else [63], step)
    if "xid_79" in profile.faults:  # GPU 0 fell off the bus: the kernel logs it once
        line = xid_lines(first_gpu_bus(xml), [79], 0)
        dmesg += line.split(": 79, ", 1)[0] + ": 79, pid=0, GPU has fallen off the bus.\n"  # NVIDIA's text
    write(out / "dmesg.txt", dmesg)
    write(out / "nvidia-smi_nvlink_-s.txt", nvlink_status(profile))
    write(out / "SYNTHETIC_nvidia-smi_nvlink_-e.txt", nvlink_errors(profile, step))
    write(out / "SYNTHETIC_nvidia-smi_nvlink_-gt_d.txt", nvlink_data(profile, step))
    for disk, fixture in profile.disks.items():
        data = json.loads((PUBLIC / "smartctl" / fixture).read_text())
        if "Media_Wearout_Indicator" in json.dumps(data):
            if "climbing_ssd" in profile.faults:
                data = climbing_ssd(data, step)
            elif "worn_ssd" in profile.faults:
                data = worn_ssd(data, step)
        data.setdefault("device", {})["name"] = f"/dev/{disk}"
        write(out / f"smartctl_{disk}.json", json.dumps(data, indent=1))
    write(out / "SYNTHETIC_rdma_res_show_qp.json", rdma_qps(profile, step))
    slow = "slow_bench" in profile.faults
    nccl = NCCL.read_text()
    write(out / "all_reduce_perf_tree.txt", nccl)
    write(out / "all_reduce_perf_ring.txt", slow_nccl(nccl, 0.7) if slow else nccl)
    write(out / "all_reduce_perf_16ranks.txt", NCCL_2X8.read_text())
    fio = json.loads(FIO.read_text())
    write(out / "fio_randread.json", json.dumps(slow_fio(fio, 0.6, 3.0) if slow else fio, indent=1))
    write(out / "fio_randwrite.json", FIO_WRITE.read_text())
    write(out / "fio_randwrite_clat.log", FIO_WRITE_LAT_LOG.read_text())
    write(out / "ib_lat.txt", RDMA_LAT.read_text())
    write(out / "ib_write_bw.txt", RDMA_BW.read_text())
    if profile.ib == "gpud":
        write(out / "ibv_devinfo.txt", ibv_devinfo(profile))
        port = root / "sys/class/infiniband/mlx5_0/ports/1"
        if "ib_port_down" in profile.faults:
            write(port / "state", "1: DOWN\n")
            write(port / "phys_state", "3: Disabled\n")
        if "ib_symbol_errors" in profile.faults:
            write(root / "sys/class/infiniband/mlx5_1/ports/1/counters/symbol_error", f"{150 * step}\n")
        if "qp_error" in profile.faults:
            # 9000 a sweep: 150 drops/s at the lab's 60 s spacing, past the seed's > 100 drops/s
            write(root / "sys/class/infiniband/mlx5_1/ports/1/hw_counters/out_of_buffer", f"{9000 * step}\n")
    if profile.aer and "aer_storm" in profile.faults:
        base = (PUBLIC / "sysfs/aer/aer_dev_correctable_zero.txt").read_text()
        count = 250 * step
        derived = re.sub(r"^RxErr \d+", f"RxErr {count}", base, flags=re.M)
        derived = re.sub(r"^TOTAL_ERR_COR \d+", f"TOTAL_ERR_COR {count}", derived, flags=re.M)
        write(root / "sys/bus/pci/devices/0000:00:06.0/aer_dev_correctable", derived)


def nvlink_status(profile: Profile) -> str:
    if not profile.nvlink:
        return ""  # as the H200 VM prints: no NVLink
    return (PUBLIC / "nvidia-smi/nvlink_status_8xA100_gpud.txt").read_text()


def _links() -> list[tuple[int, int]]:
    text = (PUBLIC / "nvidia-smi/nvlink_status_8xA100_gpud.txt").read_text()
    pairs, gpu = [], -1
    for line in text.splitlines():
        if line.startswith("GPU "):
            gpu = int(line.split()[1].rstrip(":"))
        elif "Link " in line:
            pairs.append((gpu, int(line.split("Link ")[1].split(":")[0])))
    return pairs


def _per_link(profile: Profile, render) -> str:
    if not profile.nvlink:
        return ""
    out, current = [], None
    for gpu, link in _links():
        if gpu != current:
            out.append(
                f"GPU {gpu}: NVIDIA A100-SXM4-80GB (UUID: GPU-00000000-0000-0000-0000-00000000000{gpu})"
            )
            current = gpu
        out.extend("\t " + line for line in render(gpu, link))
    return "\n".join(out) + "\n"


def nvlink_errors(profile: Profile, step: int) -> str:
    def render(gpu: int, link: int) -> list[str]:
        # gpu0: the one GPU of the A100 capture, whose temperature the NVLink rule reads beside its links
        crc = 40 * step if "nvlink_crc" in profile.faults and gpu == 0 and link == 3 else 0
        return [
            f"Link {link}: Replay Errors: 0",
            f"Link {link}: Recovery Errors: 0",
            f"Link {link}: CRC Errors: {crc}",
        ]

    return _per_link(profile, render)


def nvlink_data(profile: Profile, step: int) -> str:
    def render(gpu: int, link: int) -> list[str]:
        kib = 1_000_000 * (step + 1)
        return [f"Link {link}: Data Tx: {kib} KiB", f"Link {link}: Data Rx: {kib} KiB"]

    return _per_link(profile, render)


def rdma_qps(profile: Profile, step: int) -> str:
    if profile.ib is None:
        return "[]\n"
    hcas = ["mlx5_0", "mlx5_1"] if profile.ib == "gpud" else ["mlx5_0"]
    qps = []
    for hca in hcas:
        for lqpn in range(4):
            error = "qp_error" in profile.faults and hca == "mlx5_1" and lqpn < 1 + min(step, 2)
            qps.append(
                {
                    "ifindex": 1,
                    "ifname": hca,
                    "port": 1,
                    "lqpn": 100 + lqpn,
                    "type": "RC",
                    "state": "ERR" if error else "RTS",
                    "sq-psn": 0,
                    "pid": 4242,
                    "comm": "all_reduce_perf",
                }
            )
    return json.dumps(qps) + "\n"


def ibv_devinfo(profile: Profile) -> str:
    """The real ConnectX-7 ibv_devinfo capture, one block per HCA of the node's sysfs tree."""
    real = (PUBLIC / "infiniband/ibv_devinfo_cx7_mt4129_ethernet_stelline.txt").read_text()
    blocks = []
    for hca in ("mlx5_0", "mlx5_1"):
        block = real.replace("hca_id: mlx5_1", f"hca_id: {hca}").replace("Ethernet", "InfiniBand")
        if hca == "mlx5_1" and "mtu_mismatch" in profile.faults:
            block = re.sub(r"active_mtu:(\s+)4096 \(5\)", r"active_mtu:\g<1>2048 (4)", block)
        blocks.append(block.rstrip("\n"))
    return "\n".join(blocks) + "\n"


TOOLS = {
    "nvidia-smi": {
        "-q -x": "nvidia-smi_-q_-x.xml",
        "dmon -c * -s pucvmet": "nvidia-smi_dmon.txt",
        "nvlink -s": "nvidia-smi_nvlink_-s.txt",
        "nvlink -e": "SYNTHETIC_nvidia-smi_nvlink_-e.txt",
        "nvlink -gt d": "SYNTHETIC_nvidia-smi_nvlink_-gt_d.txt",
    },
    "dmesg": {"": "dmesg.txt"},
    "rdma": {"-j res show qp": "SYNTHETIC_rdma_res_show_qp.json"},
}
IB_TOOLS = {"ib_write_lat": "ib_lat.txt", "ib_read_lat": "ib_lat.txt", "ib_write_bw": "ib_write_bw.txt"}


def tool_scripts(node: Path, profile: Profile) -> None:
    """sh scripts that cat the recorded output matching their arguments (no Python start per call)."""
    bindir, out = node / "bin", node / "outputs"
    if bindir.exists():
        shutil.rmtree(bindir)
    bindir.mkdir(parents=True)
    tools = {name: dict(cases) for name, cases in TOOLS.items()}
    tools["smartctl"] = {f"-j -a /dev/{disk}": f"smartctl_{disk}.json" for disk in profile.disks}
    controllers = sorted({d[:5] for d in profile.disks if d.startswith("nvme")})
    tools["smartctl"]["--scan"] = "smartctl_scan.txt"
    (out / "smartctl_scan.txt").write_text(smartctl_scan(profile.disks, controllers))
    if profile.ib == "gpud":
        tools["ibv_devinfo"] = {"": "ibv_devinfo.txt"}
    if profile.ib is None:
        tools.pop("rdma")
    else:
        for name, file_name in IB_TOOLS.items():
            perftest_script(bindir / name, out / file_name, node.name, node.parent.parent / "perftest.log")
    for name, cases in tools.items():
        lines = [
            "#!/bin/sh",
            f"# lab replay of {name}: recorded output chosen by the arguments",
            f'd="{out}"',
            'case "$*" in',
        ]
        for args, file_name in cases.items():
            status = "4" if name == "smartctl" and "failed" in file_name else "0"
            pattern = "*" if args == "*" else '"' + args.replace("*", '"*"') + '"'
            lines.append(f'  {pattern}) cat "$d/{file_name}"; exit {status};;')
        lines += [f'  *) echo "lab: no recording of {name} $*" >&2; exit 2;;', "esac", ""]
        script = bindir / name
        script.write_text("\n".join(lines))
        script.chmod(0o755)
    if controllers:
        nvme_script(bindir / "nvme", out, controllers)
    fio_script(bindir / "fio", out)
    nccl = bindir / "all_reduce_perf"
    nccl.write_text(
        "\n".join(
            [
                "#!/bin/sh",
                "# lab replay of nccl-tests: the recording for the algorithm NCCL_ALGO asks for",
                f'd="{out}"',
                'case "$NCCL_ALGO" in',
                '  Ring|ring) cat "$d/all_reduce_perf_ring.txt";;',
                '  *) cat "$d/all_reduce_perf_tree.txt";;',
                "esac",
                "",
            ]
        )
    )
    nccl.chmod(0o755)
    launcher_scripts(bindir, out)


# The launchers' stand-ins replay the recording of the rank count their argv asks for (-np N, or
# --nodes x --ntasks-per-node): the lab holds recordings of 8 ranks (one node) and 16 (two nodes).
RANK_COUNT = {
    "mpirun": ['  -np) ranks="$2"; shift;;'],
    "srun": ['  --nodes) nodes="$2"; shift;;', '  --ntasks-per-node) per_node="$2"; shift;;'],
}


def launcher_scripts(bindir: Path, out: Path) -> None:
    for name, cases in RANK_COUNT.items():
        lines = [
            "#!/bin/sh",
            f"# lab replay of {name} starting nccl-tests: the recording of the rank count asked for",
            f'd="{out}"; ranks=0; nodes=1; per_node=1',
            'while [ "$#" -gt 0 ]; do',
            '  case "$1" in',
            *cases,
            "  esac",
            "  shift",
            "done",
            '[ "$ranks" -gt 0 ] || ranks=$((nodes * per_node))',
            'case "$ranks" in',
            '  8) exec "$(dirname "$0")/all_reduce_perf";;',
            '  16) cat "$d/all_reduce_perf_16ranks.txt";;',
            f'  *) echo "lab: no recording of {name} with $ranks ranks" >&2; exit 2;;',
            "esac",
            "",
        ]
        script = bindir / name
        script.write_text("\n".join(lines))
        script.chmod(0o755)


PERFTEST_STANDIN = """#!{python}
# lab replay of perftest on loopback: a server (no peer address) listens on its -p port and takes one
# client; a client connects to the -p port first, as perftest does, and fails as perftest does
# when nothing listens there. Each step goes to the lab's perftest log: "<event> <port> <node>".
import socket, sys, time
args = sys.argv[1:]
port = int(args[args.index("-p") + 1]) if "-p" in args else 18515
client = bool(args) and not args[-1].startswith("-") and (len(args) < 2 or args[-2] not in {value_options!r})
def log(event):
    with open({log!r}, "a") as handle:
        handle.write("%s %d %s %.6f\\n" % (event, port, {node!r}, time.time()))
if client:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        sys.stdout.write(open({refused!r}).read())
        sys.exit(1)
    log("connect")
else:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(1)
    log("listen")
    server.settimeout({timeout})
    try:
        server.accept()[0].close()
    except OSError:
        sys.exit("lab: no client within {timeout} s")
    log("served")
sys.stdout.write(open({recording!r}).read())
"""


def perftest_script(path: Path, recording: Path, node: str, log: Path) -> None:
    path.write_text(
        PERFTEST_STANDIN.format(
            python=sys.executable,
            value_options={"-d", "-s", "-n", "-p"},
            log=str(log),
            node=node,
            refused=str(PUBLIC / "perftest" / "ib_write_bw_couldnt_connect_roce_pr228.txt"),
            recording=str(recording),
            timeout=120,
        )
    )
    path.chmod(0o755)


def smartctl_scan(disks: Iterable[str], controllers: list[str]) -> str:
    """What `smartctl --scan` prints for the node's disks: SCSI/SATA disks and NVMe controllers, in the
    lines of glouton's real capture, tests/fixtures/public/smartctl/scan_home_sata2_nvme1_glouton.txt."""
    lines = [f"/dev/{d} -d scsi # /dev/{d}, SCSI device" for d in sorted(disks) if not d.startswith("nvme")]
    lines += [f"/dev/{c} -d nvme # /dev/{c}, NVMe device" for c in controllers]
    return "".join(line + "\n" for line in lines)


def fio_script(path: Path, out: Path) -> None:
    """fio's recordings by job (ssd_preheat's write, the storage suite's read and its sustained write),
    the sustained write's latency log copied where `--write_lat_log` asks, as fio writes it."""
    lines = [
        "#!/bin/sh",
        "# lab replay of fio: the recording for the job its arguments ask for",
        f'd="{out}"',
        'case "$*" in',
        '  *"--rw=randread"*) cat "$d/fio_randread.json";;',
        '  *"--write_lat_log="*)',
        '    for arg in "$@"; do',
        '      case "$arg" in --write_lat_log=*) prefix="${arg#--write_lat_log=}";; esac',
        "    done",
        '    cp "$d/fio_randwrite_clat.log" "${prefix}_clat.1.log" && cat "$d/fio_randwrite.json";;',
        '  *"--rw=randwrite"*) cat "$d/fio_randwrite.json";;',
        '  *) echo "lab: no recording of fio $*" >&2; exit 2;;',
        "esac",
        "",
    ]
    path.write_text("\n".join(lines))
    path.chmod(0o755)


def nvme_script(path: Path, out: Path, controllers: list[str]) -> None:
    """nvme-cli's get/set-feature 0x06 in its documented output format (SYNTHETIC: no real capture
    exists), keeping the value a set-feature wrote, as the drive does until its next reset."""
    lines = [
        "#!/bin/sh",
        "# lab nvme-cli: volatile write cache feature 0x06, value kept in outputs/",
        f'd="{out}"',
        'case "$*" in',
    ]
    for ctrl in controllers:
        state = f'"$d/SYNTHETIC_{ctrl}_vwc"'
        lines += [
            f'  "get-feature /dev/{ctrl} --feature-id=0x06")',
            f"    v=$(cat {state} 2>/dev/null || echo 1)",
            "    printf 'get-feature:0x06 (Volatile Write Cache), Current value:0x%08x\\n' \"$v\";;",
            f'  "set-feature /dev/{ctrl} --feature-id=0x06 --value="*)',
            '    v="${*##*--value=}"',
            f'    echo "$v" > {state}',
            "    printf 'set-feature:0x06 (Volatile Write Cache), value:0x%08x, cdw12:0x00000000, "
            'save:0\\n\' "$v";;',
        ]
    lines += ['  *) echo "lab: no recording of nvme $*" >&2; exit 2;;', "esac", ""]
    path.write_text("\n".join(lines))
    path.chmod(0o755)


def build(count: int, inventory: Path | None, only_faults: list[str] | None = None) -> None:
    if LAB.exists():
        shutil.rmtree(LAB)
    nodes = LAB / "nodes"
    for index in range(count):
        node, profile = nodes / node_name(index), profile_of(index, only_faults)
        static_root(node, profile, index)
        dynamic_files(node, profile, 0)
        tool_scripts(node, profile)
        (node / "state").mkdir(parents=True, exist_ok=True)
    write(LAB / "step", "0\n")
    write(LAB / "nodes.json", json.dumps({"count": count, "only_faults": only_faults}))
    if inventory:
        write_inventory(count, inventory)
    print(f"lab: {count} nodes at step 0 in {LAB}")


def write_inventory(count: int, path: Path) -> None:
    """An inventory like inventories/lab/hosts.yml, for N nodes (benchmarks)."""
    racks: dict[str, dict] = {}
    for index in range(count):
        rack = f"rack{index // 4 + 1}"
        racks.setdefault(rack, {"hosts": {}, "vars": {"rack": rack, "switch": f"leaf{index // 4 + 1}"}})
        racks[rack]["hosts"][node_name(index)] = {"slurm_name": node_name(index)}
    lines = ["---", "all:", "  children:", "    gpu_nodes:", "      children:"]
    for rack, group in racks.items():
        lines.append(f"        {rack}:")
        lines.append("          hosts:")
        lines.extend(
            f"            {host}: {{slurm_name: {v['slurm_name']}}}" for host, v in group["hosts"].items()
        )
        lines.append(f"          vars: {{rack: {group['vars']['rack']}, switch: {group['vars']['switch']}}}")
    rdma = [node_name(i) for i in range(count) if profile_of(i).ib is not None]
    if rdma:
        lines += ["    rdma_nodes:", "      hosts:"] + [f"        {host}:" for host in rdma]
    lines.append("    stethoscope_lab: {}  # no hosts: collect.yml advances the replay where it exists")
    write(path, "\n".join(lines) + "\n")
    group_vars = path.parent / "group_vars"
    if group_vars.resolve() != (TOP / "inventories/lab/group_vars").resolve():
        # The lab's group vars, with the paths that were relative to inventories/lab made absolute.
        text = (TOP / "inventories/lab/group_vars/all.yml").read_text()
        text = text.replace("(inventory_dir ~ '/../../.lab')", f"'{LAB}'")
        text = text.replace("{{ inventory_dir }}/../../tools/lab.py", str(TOP / "tools/lab.py"))
        write(group_vars / "all.yml", text)


def advance() -> int:
    if not (LAB / "step").exists():
        build(DEFAULT_NODES, None)
        return 0
    step = int((LAB / "step").read_text()) + 1
    recorded = json.loads((LAB / "nodes.json").read_text())
    for index in range(recorded["count"]):
        profile = with_injected(profile_of(index, recorded.get("only_faults")), index, recorded)
        dynamic_files(LAB / "nodes" / node_name(index), profile, step)
    write(LAB / "step", f"{step}\n")
    return step


def with_injected(profile: Profile, index: int, recorded: dict) -> Profile:
    injected = recorded.get("injected", {}).get(node_name(index), [])
    return replace(profile, faults=(*profile.faults, *injected)) if injected else profile


def inject(node: str, fault: str) -> None:
    """Start `fault` on `node` now: its outputs change at once, and every later step keeps it."""
    recorded = json.loads((LAB / "nodes.json").read_text())
    names = [node_name(i) for i in range(recorded["count"])]
    if node not in names:
        raise SystemExit(f"lab inject: no node {node} in the lab at {LAB} ({names[0]}..{names[-1]})")
    injected = recorded.setdefault("injected", {}).setdefault(node, [])
    if fault not in injected:
        injected.append(fault)
    write(LAB / "nodes.json", json.dumps(recorded))
    index, step = names.index(node), int((LAB / "step").read_text())
    profile = with_injected(profile_of(index, recorded.get("only_faults")), index, recorded)
    dynamic_files(LAB / "nodes" / node, profile, step)


def write_episodes(out: Path, seed: int, per_family: int, hw_class: str) -> int:
    sys.path.insert(0, str(TOP))
    from stethoscope_training import episodes

    try:
        data = episodes.generate(seed, per_family, hw_class)
        episodes.save(data, out)
    except episodes.EpisodesError as exc:
        print(f"lab episodes: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"lab episodes: {out}: {exc}", file=sys.stderr)
        return 3
    splits = {s: int((data.split == s).sum()) for s in ("train", "validation", "test")}
    print(f"lab episodes: {len(data)} episodes ({splits}) in {out}, data hash {data.info['data_hash'][:16]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="rebuild .lab at step 0")
    build_cmd.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    build_cmd.add_argument("--inventory", type=Path, help="also write an inventory for these nodes")
    build_cmd.add_argument(
        "--only-faults",
        help="comma-separated faults to keep (e.g. worn_ssd, or its slow variant climbing_ssd); "
        "the other nodes are built healthy",
    )
    commands.add_parser("advance", help="advance the replay one step")
    inject_cmd = commands.add_parser("inject", help="start a fault on a node of the built lab")
    inject_cmd.add_argument("node")
    inject_cmd.add_argument("fault", choices=INJECTABLE)
    episodes_cmd = commands.add_parser("episodes", help="write labelled episodes for the learned diagnosis")
    episodes_cmd.add_argument("--out", type=Path, required=True)
    episodes_cmd.add_argument("--seed", type=int, default=7)
    episodes_cmd.add_argument("--per-family", type=int, default=200)
    episodes_cmd.add_argument("--hw-class", choices=("h200", "shifted"), default="h200")
    args = parser.parse_args(argv)
    if args.command == "episodes":
        if args.per_family < 1:
            parser.error("--per-family must be at least 1")
        return write_episodes(args.out, args.seed, args.per_family, args.hw_class)
    if args.command == "build":
        if args.nodes < 1:
            parser.error("--nodes must be at least 1")
        only = [f for f in args.only_faults.split(",") if f] if args.only_faults is not None else None
        build(args.nodes, args.inventory, only)
    elif args.command == "inject":
        inject(args.node, args.fault)
        print(f"lab: {args.fault} on {args.node}")
    else:
        print(f"lab: step {advance()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
