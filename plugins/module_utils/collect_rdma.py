# Copyright: stethoscope developers
# Apache License 2.0
"""RDMA/InfiniBand ports from /sys/class/infiniband, active MTU from ibv_devinfo, QP states from rdma."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    rate,
    result,
    run_checked,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.infiniband import (
    HW_COUNTER_METRICS,
    LEGACY_COUNTER_MAX,
    PORT_COUNTER_METRICS,
    parse_counter,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_numbered_state,
    parse_rate,
    parse_rdma_qp_json,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add, metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

NAME = "rdma"
CLASS = "/sys/class/infiniband"
# Receive-side drops: out_of_buffer (no receive WQE posted) plus the port's physical rx discards.
DROP_COUNTERS = ("out_of_buffer", "rx_discards_phy")


def _parse(ctx, parser, *args):
    try:
        return parser(*args)
    except ParseError as exc:
        raise CollectorError(str(exc)) from None


def _port(ctx, hca, port):
    base = "%s/%s/ports/%s/" % (CLASS, hca, port)
    tool = "sysfs " + ctx.path(base)
    entry, rows = {"link_layer": ctx.read(base + "link_layer")}, []
    device = "%s/%s" % (hca, port)
    state_text = ctx.read(base + "state")
    if state_text is not None:
        entry["state"], entry["state_name"] = _parse(ctx, parse_numbered_state, tool + "state", state_text)
        rows.append(metric("ib_port_state", device, entry["state"]))
    phys_text = ctx.read(base + "phys_state")
    if phys_text is not None:
        entry["phys_state"], entry["phys_state_name"] = _parse(
            ctx, parse_numbered_state, tool + "phys_state", phys_text
        )
        rows.append(metric("ib_port_phys_state", device, entry["phys_state"]))
    rate_text = ctx.read(base + "rate")
    if rate_text is not None:
        entry["rate_gbit_per_s"] = _parse(ctx, parse_rate, tool + "rate", rate_text)
        rows.append(metric("ib_port_rate_gbit_per_s", device, entry["rate_gbit_per_s"]))
    counters, saturated = {}, []
    for name, metric_name in PORT_COUNTER_METRICS.items():
        wide = ctx.read(base + "counters_ext/%s_64" % name)
        raw = wide if wide is not None else ctx.read(base + "counters/" + name)
        value = None if raw is None else _parse(ctx, parse_counter, tool + "counters/" + name, raw)
        if value is None:
            continue
        counters[name] = value
        labels = {}
        if wide is None and value >= LEGACY_COUNTER_MAX.get(name, float("inf")):
            labels["saturated"] = "1"
            saturated.append(name)
        rows.append(metric(metric_name, device, value, labels))
    hw = {}
    for name in ctx.listdir(base + "hw_counters"):
        value = ctx.read(base + "hw_counters/" + name)
        try:
            hw[name] = int(value)
        except (TypeError, ValueError):
            continue
    for name, metric_name in HW_COUNTER_METRICS.items():
        add(rows, metric_name, device, hw.get(name))
    entry.update(counters=counters, hw_counters=hw, saturated_counters=saturated)
    return entry, rows


def collect(ctx):
    hcas = ctx.listdir(CLASS)
    if not hcas:
        return _ibstat_fallback(ctx)
    ports, rows = {}, []
    for hca in hcas:
        for port in ctx.listdir("%s/%s/ports" % (CLASS, hca)):
            entry, port_rows = _port(ctx, hca, port)
            ports["%s/%s" % (hca, port)] = entry
            rows += port_rows
    warnings = []
    _active_mtu(ctx, ports, rows, warnings)
    _queue_pairs(ctx, ports, rows, warnings)
    rows += _drop_rates(ctx, ports)
    return result(True, {"ports": ports, "source": "sysfs"}, rows, warnings)


def _active_mtu(ctx, ports, rows, warnings):
    if not ctx.which("ibv_devinfo"):
        warnings.append("ibv_devinfo not found: ib_port_active_mtu skipped (sysfs lacks it)")
        return
    argv = ["ibv_devinfo"]
    out = run_checked(ctx, argv, "ibv_devinfo")
    for (hca, port), info in sorted(_parse(ctx, parse_ibv_devinfo, out).items()):
        key = "%s/%s" % (hca, port)
        if "active_mtu" in info:
            ports.setdefault(key, {})["active_mtu"] = info["active_mtu"]
            rows.append(metric("ib_port_active_mtu", key, info["active_mtu"]))


def _queue_pairs(ctx, ports, rows, warnings):
    if not ctx.which("rdma"):
        warnings.append("rdma (iproute2) not found: rdma_qp_error_count skipped")
        return
    argv = ["rdma", "-j", "res", "show", "qp"]
    out = run_checked(ctx, argv, "rdma -j res show qp")
    counts = _parse(ctx, parse_rdma_qp_json, out)
    for key in sorted(set(ports) | set(counts)):
        entry = counts.get(key, {"total": 0, "error": 0})
        ports.setdefault(key, {})["qps"] = entry
        rows.append(metric("rdma_qp_error_count", key, entry["error"]))


def _drop_rates(ctx, ports):
    previous = ctx.load_state("rdma")
    now, rows, snapshot = ctx.now(), [], {}
    for key, entry in sorted(ports.items()):
        hw = entry.get("hw_counters") or {}
        known = [hw[name] for name in DROP_COUNTERS if name in hw]
        if not known:
            continue
        snapshot[key] = sum(known)
        if "at" in previous:
            add(
                rows,
                "rdma_qps_dropped_per_second",
                key,
                rate(previous.get("drops", {}).get(key), snapshot[key], now - previous["at"]),
            )
    ctx.save_state("rdma", {"at": now, "drops": snapshot})
    return rows


def _ibstat_fallback(ctx):
    if not ctx.which("ibstat"):
        return result(
            False, {"reason": "no %s and no ibstat: no InfiniBand/RDMA on this node" % ctx.path(CLASS)}
        )
    argv = ["ibstat"]
    rc, out, err = ctx.run(argv)
    try:
        ports = parse_ibstat(out)
    except ParseError as exc:
        raise CollectorError(str(exc), argv, rc, out, err) from None
    if rc != 0:
        run_checked(ctx, argv, "ibstat")
    if not ports:
        return result(False, {"reason": "ibstat lists no port"})
    rows = []
    for (ca, port), info in sorted(ports.items()):
        device = "%s/%s" % (ca, port)
        add(rows, "ib_port_state", device, info.get("state"))
        add(rows, "ib_port_rate_gbit_per_s", device, info.get("rate"))
    return result(True, {"ports": {"%s/%s" % k: v for k, v in ports.items()}, "source": "ibstat"}, rows)
