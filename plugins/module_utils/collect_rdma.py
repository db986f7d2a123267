# Copyright: stethoscope developers
# Apache License 2.0
"""RDMA/InfiniBand ports from /sys/class/infiniband, active MTU from ibv_devinfo, QP states from rdma."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collector_failure
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


SEEN_STATE = "rdma_devices"  # the HCAs sweeps saw: one gone since is hca_missing, until it is back
# (an HCA removed or renamed on purpose: delete this state file on the node, see rdma_facts' notes)


def collect(ctx):
    hcas = ctx.listdir(CLASS)
    seen = ctx.load_state(SEEN_STATE).get("hcas", [])
    gone = sorted(set(seen) - set(hcas))
    failures = []
    if gone:  # said, and the HCAs still there are read: one dead HCA never hides the others' rows
        failures.append(
            collector_failure.from_error(
                NAME,
                CollectorError(
                    "sysfs: %s gone from %s (seen by an earlier sweep)" % (", ".join(gone), ctx.path(CLASS)),
                    tool="sysfs",
                    cause=collector_failure.HCA_MISSING,
                    device=gone[0],
                ),
            )
        )
    if not hcas:
        if failures:
            return result(True, {"ports": {}, "source": "sysfs"}, [], [], failures=failures)
        return _ibstat_fallback(ctx, had_hardware=bool(seen))
    known = sorted(set(seen) | set(hcas))
    if known != seen:
        ctx.save_state(SEEN_STATE, {"hcas": known})
    ports, rows = {}, []
    for hca in hcas:
        for port in ctx.listdir("%s/%s/ports" % (CLASS, hca)):
            entry, port_rows = _port(ctx, hca, port)
            ports["%s/%s" % (hca, port)] = entry
            rows += port_rows
    warnings = []
    try:
        _active_mtu(ctx, ports, rows, warnings)
    except CollectorError as exc:  # verbs that find no HCA: said, and sysfs's rows kept
        failures.append(collector_failure.from_error(NAME, exc))
    rows += _ipoib_mtu_excess(ctx, ports)
    _queue_pairs(ctx, ports, rows, warnings)
    rows += _drop_rates(ctx, ports)
    return result(True, {"ports": ports, "source": "sysfs"}, rows, warnings, failures=failures)


def _active_mtu(ctx, ports, rows, warnings):
    if not ctx.which("ibv_devinfo"):
        warnings.append("ibv_devinfo not found: ib_port_active_mtu skipped (sysfs lacks it)")
        return
    argv = ["ibv_devinfo"]
    rc, out, err = ctx.run(argv)
    found = _parse(ctx, parse_ibv_devinfo, out) if rc == 0 else {}
    if not found:  # sysfs lists HCAs (ports): verbs that find none, or fail, are a dead HCA or stack
        said = "%s\n%s" % (err, out)
        raise CollectorError(
            "ibv_devinfo: exit code %s: %s" % (rc, collector_failure.first_line(err, out) or "no output"),
            argv,
            rc,
            out,
            err,
            cause=collector_failure.classify("ibv_devinfo", rc, said, had_hardware=bool(ports)),
        )
    for (hca, port), info in sorted(found.items()):
        key = "%s/%s" % (hca, port)
        if "active_mtu" in info:
            ports.setdefault(key, {})["active_mtu"] = info["active_mtu"]
            rows.append(metric("ib_port_active_mtu", key, info["active_mtu"]))


IPOIB_HEADER = 4  # IPoIB's MTU is the IB MTU less its 4-byte header: 4092 on a 4096 port
ARPHRD_INFINIBAND = "32"  # /sys/class/net/<interface>/type of an IPoIB interface


def _ipoib_interfaces(ctx):
    """{interface: MTU} of the node's IPoIB interfaces in datagram mode (by link type; by the ib* name
    where sysfs gives no type, as a node root prefix may not). Connected mode carries up to 65520
    bytes over reliable connections whatever the port's MTU: it is left out."""
    found = {}
    for interface in ctx.listdir("/sys/class/net"):
        kind = ctx.read("/sys/class/net/%s/type" % interface)
        mtu = ctx.read("/sys/class/net/%s/mtu" % interface)
        ipoib = kind == ARPHRD_INFINIBAND or (kind is None and interface.startswith("ib"))
        connected = ctx.read("/sys/class/net/%s/mode" % interface) == "connected"
        if ipoib and not connected and mtu and mtu.isdigit():
            found[interface] = int(mtu)
    return found


def _ports_of(ctx, interface, ib_ports):
    """The IB ports an IPoIB interface sends through: its HCA's (<hca>/device/net/<interface>) port
    dev_port + 1. Where no HCA lists its interfaces, every IB port (env_lock's reading)."""
    listed = {
        hca: ctx.listdir("%s/%s/device/net" % (CLASS, hca)) for hca in {k.split("/")[0] for k in ib_ports}
    }
    if not any(listed.values()):
        return sorted(ib_ports)
    dev_port = ctx.read("/sys/class/net/%s/dev_port" % interface)
    port = int(dev_port) + 1 if dev_port and dev_port.isdigit() else 1
    return [
        key
        for key in sorted(ib_ports)
        if interface in listed[key.split("/")[0]] and key.endswith("/%d" % port)
    ]


def _ipoib_mtu_excess(ctx, ports):
    """Per IB port and IPoIB interface on it: how far the interface's MTU (+ its header) exceeds the
    port's active MTU (the seed's server 4096 / switch 2048 case: > 0, large frames dropped)."""
    ib_ports = {
        key: entry["active_mtu"]
        for key, entry in ports.items()
        if entry.get("link_layer") == "InfiniBand" and isinstance(entry.get("active_mtu"), int)
    }
    rows = []
    if not ib_ports:
        return rows
    for interface, mtu in sorted(_ipoib_interfaces(ctx).items()):
        for key in _ports_of(ctx, interface, ib_ports):
            excess = mtu + IPOIB_HEADER - ib_ports[key]
            ports[key].setdefault("ipoib_mtu", {})[interface] = mtu
            rows.append(metric("ib_port_ipoib_mtu_excess_bytes", key, excess, {"interface": interface}))
    return rows


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


def _ibstat_fallback(ctx, had_hardware=False):
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
    if rc != 0 or (had_hardware and not ports):
        raise CollectorError(
            "ibstat: exit code %s: %s" % (rc, collector_failure.first_line(err, out) or "no output"),
            argv,
            rc,
            out,
            err,
            cause=collector_failure.classify("ibstat", rc, "%s\n%s" % (err, out), had_hardware),
        )
    if not ports:
        return result(False, {"reason": "ibstat lists no port"})
    rows = []
    for (ca, port), info in sorted(ports.items()):
        device = "%s/%s" % (ca, port)
        add(rows, "ib_port_state", device, info.get("state"))
        add(rows, "ib_port_rate_gbit_per_s", device, info.get("rate"))
    return result(True, {"ports": {"%s/%s" % k: v for k, v in ports.items()}, "source": "ibstat"}, rows)
