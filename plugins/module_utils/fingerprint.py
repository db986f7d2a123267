# Copyright: stethoscope developers
# Apache License 2.0
"""Class and node fingerprints (docs/design.md): what identical nodes share, and that plus serial numbers."""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import parse_query_xml
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.vpd import (
    parse_pci_vpd,
    parse_scsi_unit_serial,
)

VPD_MAX_BYTES = 32768  # the PCI VPD address space
ARPHRD_ETHER = "1"
NET_ADDR_PERM = "0"  # addr_assign_type: the address burned into the card
ZERO_GUID = "0000:0000:0000:0000"
# in a disk's sysfs device path: USB, iSCSI and Fibre Channel disks are not parts of the node
NOT_LOCAL = ("/usb", "/session", "/rport-")


def digest(data):
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _gpus(ctx):
    if not ctx.which("nvidia-smi"):
        return None, []
    argv = ["nvidia-smi", "-q", "-x"]
    rc, out, err = ctx.run_once(argv)
    if rc != 0:
        return {"error": "nvidia-smi exit code %s" % rc}, []
    try:
        query = parse_query_xml(out)
    except ParseError as exc:
        raise CollectorError(str(exc), argv, rc, out, err) from None
    gpus = query["gpus"]
    detail = {
        "models": sorted({g["name"] for g in gpus}),
        "count": len(gpus),
        "driver": query["driver_version"],
        "vbios": sorted({g["vbios_version"] for g in gpus if g["vbios_version"]}),
    }
    return detail, sorted(g["serial"] for g in gpus if g.get("serial") not in (None, "N/A"))


def _read_bytes(ctx, absolute, limit):
    """Binary sysfs attribute (VPD), or None if missing, unreadable (VPD is root-only on most kernels;
    a device whose VPD does not answer fails the read) or empty."""
    try:
        with open(ctx.path(absolute), "rb") as handle:
            return handle.read(limit) or None
    except OSError:
        return None


def _by_json(items):
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


def _nics(ctx):
    nics = {}
    for hca in ctx.listdir("/sys/class/infiniband"):
        base = "/sys/class/infiniband/%s/" % hca
        if _is_virtual_function(ctx, base):
            continue
        nics[hca] = {
            "model": ctx.read(base + "hca_type"),
            "firmware": ctx.read(base + "fw_ver"),
            "board": ctx.read(base + "board_id"),
        }
    return nics


def _port_guids(ctx, base):
    """GUIDs of the InfiniBand ports: the interface half of GID 0. A RoCE port's GID 0 comes from its
    netdev's current MAC (counted with the Ethernet addresses), so it is not read here."""
    guids = []
    for port in ctx.listdir(base + "ports"):
        if ctx.read("%sports/%s/link_layer" % (base, port)) != "InfiniBand":
            continue
        gid = ctx.read("%sports/%s/gids/0" % (base, port)) or ""
        guid = ":".join(gid.split(":")[4:])
        if guid and guid != ZERO_GUID:
            guids.append(guid)
    return sorted(guids)


def _board(ctx, hca, warnings):
    """{"serial", "part"} from the HCA's PCI VPD (None each where it cannot be read or decoded)."""
    data = _read_bytes(ctx, "/sys/class/infiniband/%s/device/vpd" % hca, VPD_MAX_BYTES)
    fields = {}
    if data is not None:
        try:
            fields = parse_pci_vpd(data)["fields"]
        except ParseError as exc:
            warnings.append("%s: %s" % (hca, exc))
    return {"serial": fields.get("SN") or None, "part": fields.get("PN") or None}


def _hca_identities(ctx, warnings):
    """-> (identities, boards). An HCA's identity is what tells it from another of the same model: its
    node, system-image and InfiniBand port GUIDs. Its board (serial and part number from the PCI VPD)
    is recorded for people to read, and is part of the identity only of an HCA without GUIDs: VPD is
    read from the card on every read, root-only on most kernels, and a run that cannot read it must
    not look like a swap. Device names (mlx5_N) are left out: they follow probe order."""
    identities, boards = [], []
    for hca in ctx.listdir("/sys/class/infiniband"):
        base = "/sys/class/infiniband/%s/" % hca
        if _is_virtual_function(ctx, base):
            continue
        identity = {
            "node_guid": ctx.read(base + "node_guid"),
            "sys_image_guid": ctx.read(base + "sys_image_guid"),
            "port_guids": _port_guids(ctx, base),
        }
        board = _board(ctx, hca, warnings)
        if not _has_guid(identity):
            identity["serial"] = board.get("serial")
        identities.append(identity)
        boards.append(dict(board, node_guid=identity["node_guid"]))
    return _by_json(identities), _by_json(boards)


def _is_virtual_function(ctx, base):
    """An SR-IOV virtual function (its own GUIDs and addresses, set by the host, created and moved into
    containers at will) is no part of the node's hardware."""
    return ctx.exists(base + "device/physfn")


def _has_guid(identity):
    guids = [identity["node_guid"], identity["sys_image_guid"], *identity["port_guids"]]
    return any(guid and guid != ZERO_GUID for guid in guids)


def _permanent_address(ctx, base):
    if ctx.read(base + "addr_assign_type") == NET_ADDR_PERM:
        return ctx.read(base + "address")
    # a bond gives its members its own address and keeps theirs here
    return ctx.read(base + "bonding_slave/perm_hwaddr")


def _ethernet_addresses(ctx):
    """Permanent addresses of the physical Ethernet ports (a `device` behind them). IPoIB addresses
    carry a queue pair number and change by themselves; set or random addresses are not the card's."""
    addresses = set()
    for name in ctx.listdir("/sys/class/net"):
        base = "/sys/class/net/%s/" % name
        if ctx.read(base + "type") != ARPHRD_ETHER or not ctx.exists(base + "device"):
            continue
        if _is_virtual_function(ctx, base) or "/usb" in os.path.realpath(ctx.path(base + "device")):
            continue  # a VF, or a USB link to the BMC, comes and goes with no swap
        address = _permanent_address(ctx, base)
        if address:
            addresses.add(address.lower())
    return sorted(addresses)


def _is_local_disk(ctx, name):
    if ctx.read("/sys/block/%s/removable" % name) == "1":
        return False
    device_path = os.path.realpath(ctx.path("/sys/block/" + name))
    return not any(marker in device_path for marker in NOT_LOCAL)


def _unit_serial(ctx, name, warnings):
    base = "/sys/block/%s/device/" % name
    data = _read_bytes(ctx, base + "vpd_pg80", 4 + 0xFFFF)
    if data is not None:
        try:
            serial = parse_scsi_unit_serial(data)
        except ParseError as exc:
            warnings.append("%s: %s" % (name, exc))
        else:
            if serial:
                return serial
    # the device identifier (VPD page 0x83 as the kernel renders it) is unique to the disk as well
    return ctx.read(base + "wwid")


def _scsi_disks(ctx, warnings):
    """SATA/SAS disks (sd*; removable, USB and network ones left out) -> (model and firmware of each,
    serials). Behind a RAID controller these are its logical volumes, with the serials it assigns."""
    disks, serials = [], []
    for name in ctx.listdir("/sys/block"):
        if not name.startswith("sd") or not _is_local_disk(ctx, name):
            continue
        base = "/sys/block/%s/device/" % name
        model = {"vendor": ctx.read(base + "vendor"), "model": ctx.read(base + "model")}
        if model["model"] is None:
            continue  # no SCSI device behind the name: nothing to tell it by
        serial = _unit_serial(ctx, name, warnings)
        if serial in serials:
            continue  # the same disk on a second path (dual-ported SAS, multipath): losing one is no swap
        disks.append(dict(model, firmware=ctx.read(base + "rev")))
        if serial:
            serials.append(serial)
    return _by_json(disks), sorted(serials)


def _nvmes(ctx):
    drives, serials = {}, []
    for controller in ctx.listdir("/sys/class/nvme"):
        base = "/sys/class/nvme/%s/" % controller
        drives[controller] = {"model": ctx.read(base + "model"), "firmware": ctx.read(base + "firmware_rev")}
        serial = ctx.read(base + "serial")
        if serial:
            serials.append(serial)
    return drives, sorted(serials)


def fingerprint(ctx, env_lock_state=None):
    """-> {"present": True, "class_fingerprint", "node_fingerprint", "detail": {...}, "warnings": [...]}
    (`present` as every collector's fact has it).

    Models and firmware (GPU VBIOS, HCA, NVMe, SATA/SAS) are the class: a firmware update changes the
    class, as a driver update does. Serials, GUIDs and permanent addresses are the node: a part swapped
    for an identical one changes only the node fingerprint."""
    warnings = []
    gpus, gpu_serials = _gpus(ctx)
    nvmes, nvme_serials = _nvmes(ctx)
    disks, disk_serials = _scsi_disks(ctx, warnings)
    cmdline = ctx.read("/proc/cmdline") or ""
    detail = {
        "gpu": gpus,
        # NIC and NVMe models matter, not which slot holds them: the class ignores names
        "nics": sorted(json.dumps(v, sort_keys=True) for v in _nics(ctx).values()),
        "nvme": sorted(json.dumps(v, sort_keys=True) for v in nvmes.values()),
        "bios": ctx.read("/sys/class/dmi/id/bios_version"),
        "kernel": ctx.read("/proc/sys/kernel/osrelease"),
        "cmdline_sha256": hashlib.sha256(cmdline.encode()).hexdigest(),
        "env_lock": env_lock_state or {},
    }
    if disks:
        # only where there are any: nodes without SATA/SAS disks keep the class (and fleet baselines)
        # they had before disks were part of it
        detail["disks"] = disks
    hcas, hca_boards = _hca_identities(ctx, warnings)
    serials = {
        "gpu": gpu_serials,
        "nvme": nvme_serials,
        "nic": hcas,
        "ethernet": _ethernet_addresses(ctx),
        "disk": disk_serials,
        "board": ctx.read("/sys/class/dmi/id/board_serial"),
        "product": ctx.read("/sys/class/dmi/id/product_serial"),
    }
    class_fp = digest(detail)
    return {
        "present": True,
        "class_fingerprint": class_fp,
        "node_fingerprint": digest({"class": class_fp, "serials": serials}),
        "detail": dict(detail, serials=serials, nic_boards=hca_boards),
        "warnings": warnings,
    }


CHANGES_METRIC = "node_fingerprint_changes_total"
STATE = "fingerprint"
# What the fingerprint reads: a release that reads more identities (2: HCA GUIDs, Ethernet and disk
# serials) re-keys every node once, which is not a swap; the state says which scheme it was taken by.
SCHEME = 2


def count_change(ctx, result):
    """Counts changes of the node fingerprint across sweeps (state in the collector's state file) ->
    (metric row, change or None). The first reading on a node is not a change: the counter starts at
    0 there, as the catalog's `events` kind expects; nor is the first reading by a newer SCHEME. In
    check mode nothing is saved."""
    state = ctx.load_state(STATE) or {}
    previous = state.get("node_fingerprint")
    count = int(state.get("changes", 0))
    change = None
    same_scheme = state.get("scheme", 1) == SCHEME
    if previous and previous != result["node_fingerprint"] and same_scheme:
        count += 1
        before = state.get("detail", {})
        change = {
            "from": previous,
            "to": result["node_fingerprint"],
            "class_from": state.get("class_fingerprint"),
            "class_to": result["class_fingerprint"],
            "fields": sorted(
                k for k in set(before) | set(result["detail"]) if before.get(k) != result["detail"].get(k)
            ),
        }
    if not ctx.check_mode:
        ctx.save_state(
            STATE,
            {
                "node_fingerprint": result["node_fingerprint"],
                "class_fingerprint": result["class_fingerprint"],
                "detail": result["detail"],
                "changes": count,
                "scheme": SCHEME,
            },
        )
    row = {"name": CHANGES_METRIC, "device": "node", "value": float(count), "labels": {}}
    return row, change


def collect(ctx, env_lock_state=None):
    """The fingerprint as one step of a sweep (health_facts): its fact as the fingerprint module gives
    it, the change counter's row, and the change this run saw (`fingerprint_change`)."""
    result = fingerprint(ctx, env_lock_state)
    row, change = count_change(ctx, result)
    return {
        "present": True,
        "fact": result,
        "metrics": [row],
        "warnings": result["warnings"],
        "returns": {"fingerprint_change": change},
    }
