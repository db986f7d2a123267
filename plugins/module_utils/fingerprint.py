# Copyright: stethoscope developers
# Apache License 2.0
"""Class and node fingerprints (docs/design.md): what identical nodes share, and that plus serial numbers."""

from __future__ import annotations

import hashlib
import json

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import parse_query_xml
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError


def digest(data):
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _gpus(ctx):
    if not ctx.which("nvidia-smi"):
        return None, []
    argv = ["nvidia-smi", "-q", "-x"]
    rc, out, err = ctx.run(argv)
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


def _nics(ctx):
    nics = {}
    for hca in ctx.listdir("/sys/class/infiniband"):
        base = "/sys/class/infiniband/%s/" % hca
        nics[hca] = {
            "model": ctx.read(base + "hca_type"),
            "firmware": ctx.read(base + "fw_ver"),
            "board": ctx.read(base + "board_id"),
        }
    return nics


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
    """-> {"class_fingerprint", "node_fingerprint", "detail": {...}}."""
    gpus, gpu_serials = _gpus(ctx)
    nvmes, nvme_serials = _nvmes(ctx)
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
    serials = {
        "gpu": gpu_serials,
        "nvme": nvme_serials,
        "board": ctx.read("/sys/class/dmi/id/board_serial"),
        "product": ctx.read("/sys/class/dmi/id/product_serial"),
    }
    class_fp = digest(detail)
    return {
        "class_fingerprint": class_fp,
        "node_fingerprint": digest({"class": class_fp, "serials": serials}),
        "detail": dict(detail, serials=serials),
    }


CHANGES_METRIC = "node_fingerprint_changes_total"
STATE = "fingerprint"


def count_change(ctx, result):
    """Counts changes of the node fingerprint across sweeps (state in the collector's state file) ->
    (metric row, change or None). The first reading on a node is not a change: the counter starts at
    0 there, as the catalog's `events` kind expects. In check mode nothing is saved."""
    state = ctx.load_state(STATE) or {}
    previous = state.get("node_fingerprint")
    count = int(state.get("changes", 0))
    change = None
    if previous and previous != result["node_fingerprint"]:
        count += 1
        change = {
            "from": previous,
            "to": result["node_fingerprint"],
            "class_from": state.get("class_fingerprint"),
            "class_to": result["class_fingerprint"],
            "fields": sorted(
                k for k in result["detail"] if state.get("detail", {}).get(k) != result["detail"][k]
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
            },
        )
    row = {"name": CHANGES_METRIC, "device": "node", "value": float(count), "labels": {}}
    return row, change
