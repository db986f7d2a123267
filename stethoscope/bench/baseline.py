"""`stethoscope baseline`: fleet baselines per (class, suite, metric, labels), each node's deviation
graded in the catalog's worse direction, its own history (3σ), and the ring-vs-tree hint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from stethoscope.catalog import Catalog
from stethoscope.store.client import Store
from stethoscope.terminal import terminal_safe

RED, YELLOW = 20.0, 10.0


@dataclass
class Row:
    node_id: str
    class_fingerprint: str
    suite: str
    metric_name: str
    device: str
    labels: dict[str, str]
    value: float  # the node's latest run: median over its repetitions
    repetitions: int
    rsd_percent: float
    unstable: bool
    fleet_median: float | None = None
    fleet_mad: float | None = None
    fleet_nodes: int = 0
    deviation_percent: float = 0.0
    grade: str = "green"
    history_mean: float | None = None
    history_sigma: float | None = None
    history_runs: int = 0
    beyond_3_sigma: bool = False
    hints: list[str] = field(default_factory=list)

    @property
    def label_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))


def worse_deviation(value: float, reference: float, better: str) -> float:
    """Percent away from the reference in the direction the catalog calls worse (never negative)."""
    if not reference:
        return 0.0
    if better == "higher":
        return max(0.0, (reference - value) / abs(reference) * 100.0)
    if better == "lower":
        return max(0.0, (value - reference) / abs(reference) * 100.0)
    return abs(value - reference) / abs(reference) * 100.0


def grade(deviation: float) -> str:
    return "red" if deviation > RED else "yellow" if deviation >= YELLOW else "green"


# bench_compute's verdicts (flags, checksums) and its node-internal comparison with sibling GPUs, and
# the storage suite's cliff flag, are read by rules, not graded against the fleet's median.
NOT_GRADED = (
    "bench_gemm_mismatch",
    "bench_gemm_quorum_suspect",
    "bench_gemm_checksum",
    "bench_gemm_below_siblings_percent",
    "bench_fio_latency_jumped",
)


def _median_sql(x: str) -> str:
    """The exact median (the mean of the two middle values for an even count, as statistics.median)."""
    return f"(quantileExactLow(0.5)({x}) + quantileExactHigh(0.5)({x})) / 2"


def _array_median_sql(arr: str) -> str:
    return f"(arrayReduce('quantileExactLow(0.5)', {arr}) + arrayReduce('quantileExactHigh(0.5)', {arr})) / 2"


def _worse_sql(value: str, reference: str) -> str:
    """Percent away from the reference in the catalog's worse direction (`better` is a column)."""
    return (
        f"if({reference} = 0, 0, multiIf("
        f"better = 'higher', greatest(0, ({reference} - {value}) / abs({reference}) * 100), "
        f"better = 'lower', greatest(0, ({value} - {reference}) / abs({reference}) * 100), "
        f"abs({value} - {reference}) / abs({reference}) * 100))"
    )


def _better_map(catalog: Catalog) -> dict[str, str]:
    return {name: spec.better for name, spec in catalog.metrics.items() if name.startswith("bench_")}


def runs_sql(db: str, where: str) -> str:
    """Per (node, suite, metric, device, labels, run): the median over its repetitions and their RSD."""
    return (
        "SELECT node_id, suite, metric_name, device, labels_key, any(labels) AS labels, run_id, "
        "any(class_fingerprint) AS cls, any(node_fingerprint) AS nfp, max(timestamp) AS ts, "
        f"{_median_sql('value')} AS v, count() AS reps, "
        "if(count() < 2 OR avg(value) = 0, 0, stddevSamp(value) / abs(avg(value)) * 100) AS rsd, "
        f"max(unstable) AS unst FROM {db}.bench_results FINAL "
        f"WHERE metric_name NOT IN {{not_graded:Array(String)}} AND {where} "
        "GROUP BY node_id, suite, metric_name, device, labels_key, run_id"
    )


# build's named tuples: a graded run of a series, and a series' latest run among its class's members
_GRADED_RUN = "Tuple(ts Int64, v Float64, nfp String, cls String, reps UInt64, rsd Float64, unst UInt8)"
_FLEET_MEMBER = (
    "Tuple(node String, device String, value Float64, reps UInt64, rsd Float64, unst UInt8, hn UInt64, "
    "hmean Float64, hsigma Float64, better String)"
)


def build(store: Store, catalog: Catalog, max_rsd_percent: float = 3.0, node: str | None = None) -> list[Row]:
    """Every node's latest run graded against its class's median (and MAD) and its own history, all
    computed by one ClickHouse query; with `node`, only that node's rows come back (its classes are
    still read whole: the fleet median needs them)."""
    where = "1"
    better = _better_map(catalog)
    params: dict = {
        "not_graded": list(NOT_GRADED),
        "names": list(better),
        "directions": list(better.values()),
        "rsd": max_rsd_percent,
    }
    if node is not None:
        where = (
            "class_fingerprint IN (SELECT DISTINCT class_fingerprint FROM "
            f"{store.database}.bench_results WHERE node_id = {{node:String}})"
        )
        params["node"] = node
    key = "node_id, suite, metric_name, device, labels_key"
    # per series: its runs in time order; the latest, and the earlier ones under its node fingerprint
    per_series = (
        f"SELECT {key}, arraySort(x -> x.ts, groupArray(CAST((toUnixTimestamp64Milli(ts), v, nfp, cls, reps, "
        f"rsd, unst), '{_GRADED_RUN}'))) AS rs, rs[-1] AS last, last.v AS value, last.cls AS klass, "
        "any(labels) AS lbl, "
        "arrayMap(x -> x.v, arrayFilter(x -> x.nfp = last.nfp, arrayPopBack(rs))) AS hv, length(hv) AS hn, "
        "arrayAvg(hv) AS hmean, if(hn >= 2, sqrt(arraySum(arrayMap(x -> (x - hmean) * (x - hmean), hv)) "
        "/ (hn - 1)), 0) AS hsigma, "
        "transform(toString(metric_name), {names:Array(String)}, {directions:Array(String)}, 'none') "
        f"AS better FROM ({runs_sql(store.database, where)}) GROUP BY {key}"
    )
    # the fleet per (class, suite, metric, labels): its members in one array, median and MAD of it,
    # then each member back on its own row (one pass; no join, no window)
    fleet = (
        "SELECT klass, suite, metric_name, labels_key, any(lbl) AS labels, groupArray(CAST((node_id, device, "
        f"value, last.reps, last.rsd, last.unst, hn, hmean, hsigma, better), '{_FLEET_MEMBER}')) AS members, "
        "arrayMap(m -> m.value, members) AS vals, "
        f"{_array_median_sql('vals')} AS med, length(vals) AS fn, "
        f"{_array_median_sql('arrayMap(x -> abs(x - med), vals)')} AS mad "
        f"FROM ({per_series}) GROUP BY klass, suite, metric_name, labels_key"
    )
    member = (
        "SELECT m.node AS node_id, klass, suite, metric_name, m.device AS device, m.value AS value, "
        "labels AS lbl, m.reps AS reps, m.rsd AS rsd, m.unst AS unst, m.hn AS hn, m.hmean AS hmean, "
        f"m.hsigma AS hsigma, m.better AS better, med, fn, mad FROM ({fleet}) ARRAY JOIN members AS m"
    )
    delta = "value - hmean"
    worse = f"multiIf(better = 'higher', -({delta}), better = 'lower', {delta}, abs({delta}))"
    # each column under its Row field's name (the labels as their keys and values)
    columns = {
        "node_id": "node_id",
        "class_fingerprint": "klass",
        "suite": "suite",
        "metric_name": "metric_name",
        "device": "device",
        "label_keys": "mapKeys(mapSort(lbl))",
        "label_values": "mapValues(mapSort(lbl))",
        "value": "value",
        "repetitions": "reps",
        "rsd_percent": "round(rsd, 3)",
        "unstable": "unst OR rsd > {rsd:Float64}",
        "fleet_median": "med",
        "fleet_mad": "mad",
        "fleet_nodes": "fn",
        "deviation_percent": f"round({_worse_sql('value', 'med')}, 2)",
        "grade": "multiIf(deviation_percent > 20, 'red', deviation_percent >= 10, 'yellow', 'green')",
        "history_mean": "if(hn >= 2, hmean, NULL)",
        "history_sigma": "if(hn >= 2, hsigma, NULL)",
        "history_runs": "if(hn >= 2, hn, 0)",
        "beyond_3_sigma": f"hn >= 2 AND hsigma > 0 AND {worse} > 3 * hsigma",
    }
    sql = (
        f"SELECT {', '.join(f'{expression} AS {name}' for name, expression in columns.items())} "
        f"FROM ({member})" + (" WHERE node_id = {node:String}" if node is not None else "")
    )
    rows = [_row(dict(zip(columns, values, strict=True))) for values in store.query(sql, params)]
    _ring_vs_tree(rows)
    _quorum_hints(rows, quorum_suspects(store, node))
    return sorted(rows, key=lambda r: (-r.deviation_percent, r.node_id, r.suite, r.metric_name, r.label_text))


def _row(fields: dict) -> Row:
    """A Row from build's columns, by name."""
    labels = dict(zip(fields.pop("label_keys"), fields.pop("label_values"), strict=True))
    counts = {name: int(fields[name]) for name in ("repetitions", "fleet_nodes", "history_runs")}
    flags = {name: bool(fields[name]) for name in ("unstable", "beyond_3_sigma")}
    numbers = {name: float(fields[name]) for name in ("rsd_percent", "deviation_percent")}
    return Row(**{**fields, **counts, **flags, **numbers}, labels=labels)


FRESH_MS = 7 * 86_400_000  # peers' results count as fresh for this long
MIN_PEERS = 3  # other nodes of the class, the node itself excluded
MIN_OWN_RUNS = 3  # the node's own runs before the drain


@dataclass
class Check:
    suite: str
    metric_name: str
    device: str
    labels: dict[str, str]
    value: float
    reference: str  # class | own history | none
    reference_value: float | None
    deviation_percent: float
    grade: str
    note: str = ""


# verify's named tuples: a run (its time, median value and class) and a node's series in its class
_RUN = "Tuple(ts Int64, v Float64, cls String)"
_MEMBER = f"Tuple(node String, device String, labels Map(String, String), last {_RUN}, runs Array({_RUN}))"


class _Verified(NamedTuple):
    """One row of verify's query: the node's latest result of a series and its references."""

    better: str
    suite: str
    metric_name: str
    device: str
    label_keys: list[str]
    label_values: list[str]
    value: float
    at_ms: int
    peers: int  # other nodes of its class with fresh results
    class_median: float
    deviation: float  # from the class median, in the worse direction
    class_drop: float  # the class median against its own history
    own_runs: int
    own_mean: float
    own_deviation: float


def verify(store: Store, catalog: Catalog, node: str, since_ms: int, now: int) -> dict:
    """Is the node, after a repair, as good as a real reference? Per result of its latest run: at
    least MIN_PEERS other nodes of its class with fresh results (a class whose median degraded
    against its own history is reported and not used), else its own MIN_OWN_RUNS runs before the
    drain, else no reference (it stays drained). Every suite it has results for must have run after
    `since_ms`. One query; only this node's rows come back."""
    better = _better_map(catalog)
    where = (
        "class_fingerprint IN (SELECT DISTINCT class_fingerprint FROM "
        f"{store.database}.bench_results WHERE node_id = {{node:String}})"
    )
    # one pass: each series of the node's classes with its runs (ts, v) in time order, the class's
    # series of one (suite, metric, labels) in one array, then the node's own members picked out
    run = f"CAST((toUnixTimestamp64Milli(ts), v, cls), '{_RUN}')"
    series = (
        "SELECT node_id, suite, metric_name, device, labels_key, any(labels) AS lbl, "
        f"arraySort(x -> x.ts, groupArray({run})) AS rs, rs[-1] AS last "
        f"FROM ({runs_sql(store.database, where)}) "
        "GROUP BY node_id, suite, metric_name, device, labels_key"
    )
    others = "arrayFilter(s -> s.node != {node:String}, members)"
    fresh_values = f"arrayMap(s -> s.last.v, arrayFilter(s -> s.last.ts >= {{fresh:Int64}}, {others}))"
    before_fresh = "arrayMap(r -> r.v, arrayFilter(r -> r.ts < {fresh:Int64}, s.runs))"
    past_values = f"arrayFlatten(arrayMap(s -> {before_fresh}, {others}))"
    classes = (
        "SELECT last.cls AS klass, suite, metric_name, labels_key, "
        f"groupArray(CAST((node_id, device, lbl, last, rs), '{_MEMBER}')) AS members, "
        f"{fresh_values} AS fresh_values, length(fresh_values) AS peers, "
        f"{_array_median_sql('fresh_values')} AS med, {past_values} AS past_values, "
        f"{_array_median_sql('past_values')} AS hmed, length(past_values) AS hn "
        f"FROM ({series}) GROUP BY klass, suite, metric_name, labels_key"
    )
    own = "arrayMap(r -> r.v, arrayFilter(r -> r.ts < {since:Int64}, m.runs))"
    sql = (
        "SELECT transform(toString(metric_name), {names:Array(String)}, {directions:Array(String)}, "
        "'none') AS better, suite, metric_name, m.device AS device, "
        "mapKeys(mapSort(m.labels)), mapValues(mapSort(m.labels)), "
        "m.last.v AS value, m.last.ts, peers, med, "
        f"round({_worse_sql('value', 'med')}, 2), "
        f"if(hn > 0, round({_worse_sql('med', 'hmed')}, 2), 0), "
        f"length({own}), arrayAvg({own}) AS omean, "
        f"round({_worse_sql('value', 'omean')}, 2) "
        f"FROM ({classes}) ARRAY JOIN members AS m WHERE m.node = {{node:String}} "
        "ORDER BY suite, metric_name, device, labels_key"
    )
    params = {
        "not_graded": list(NOT_GRADED),
        "names": list(better),
        "directions": list(better.values()),
        "node": node,
        "since": since_ms,
        "fresh": now - FRESH_MS,
    }
    checks: list[Check] = []
    reasons: list[str] = []
    latest_per_suite: dict[str, int] = {}
    for row in map(_Verified._make, store.query(sql, params)):
        suite, name, device, value, at = row.suite, row.metric_name, row.device, row.value, row.at_ms
        peers, med, dev, drop = row.peers, row.class_median, row.deviation, row.class_drop
        own_n, own_mean, own_dev = row.own_runs, row.own_mean, row.own_deviation
        labels = dict(zip(row.label_keys, row.label_values, strict=True))
        latest_per_suite[suite] = max(latest_per_suite.get(suite, 0), int(at))
        where_ = f"{suite} {name} {device} {','.join(f'{k}={v}' for k, v in sorted(labels.items()))}"
        if peers and peers >= MIN_PEERS and drop >= YELLOW:
            reasons.append(
                f"{where_}: the class median itself degraded {drop:.1f} % against its own history: "
                "not used as a reference"
            )
        if peers and peers >= MIN_PEERS and drop < YELLOW:
            checks.append(Check(suite, name, device, labels, value, "class", med, dev, grade(dev)))
        elif own_n and own_n >= MIN_OWN_RUNS:
            note = f"{int(peers or 0)} other node(s) of its class with fresh results: own history used"
            checks.append(
                Check(
                    suite, name, device, labels, value, "own history", own_mean, own_dev, grade(own_dev), note
                )
            )
        else:
            checks.append(Check(suite, name, device, labels, value, "none", None, 0.0, "none"))
            reasons.append(
                f"{where_}: no reference (only {int(peers or 0)} other node(s) of its class with fresh "
                f"results, {int(own_n or 0)} run(s) of its own before the drain; {MIN_PEERS} and "
                f"{MIN_OWN_RUNS} needed)"
            )
    stale = sorted(suite for suite, at in latest_per_suite.items() if at < since_ms)
    reasons.extend(f"suite {suite} has not run since the drain" for suite in stale)
    not_green = [c for c in checks if c.grade not in ("green",)]
    reasons.extend(
        f"{c.suite} {c.metric_name} {c.device}: {c.grade} ({c.deviation_percent:.1f} % against {c.reference})"
        for c in not_green
        if c.grade != "none"
    )
    return {
        "checks": checks,
        "stale_suites": stale,
        "benchmarked_since": bool(latest_per_suite) and not stale,
        "green": bool(checks) and not not_green and not stale,
        "reasons": reasons if checks else ["no benchmark results of this node"],
    }


def _ring_vs_tree(rows: list[Row]) -> None:
    """Ring degraded while tree is normal: the ring crosses a congested switch port. Both: the NIC.
    Ring and tree are paired within one run shape (ranks, topology), never a node's run with its batch's."""
    average = {
        (r.node_id, r.labels.get("algo"), r.labels.get("ranks"), r.labels.get("topology")): r
        for r in rows
        if r.metric_name == "bench_allreduce_busbw_gb_per_s" and r.labels.get("size") == "avg"
    }
    for (node, algo, ranks, topology), ring in average.items():
        tree = average.get((node, "tree", ranks, topology))
        if algo != "ring" or tree is None:
            continue
        if ring.grade != "green" and tree.grade == "green":
            ring.hints.append("ring degraded while tree is normal: suspect switch port congestion")
        elif ring.grade != "green" and tree.grade != "green":
            ring.hints.append("ring and tree both degraded: suspect the node's NIC")
            tree.hints.append("ring and tree both degraded: suspect the node's NIC")


def quorum_suspects(store: Store, node: str | None = None) -> dict[tuple[str, str], list[str]]:
    """The checksum quorum across nodes: each GPU's latest checksum of the seeded GEMM, compared
    bit-exactly with the same GPU index (device, dtype, size) on the other nodes of its class. The
    odd one out against a strict majority of at least 3 is a suspect; a tie is no verdict.
    -> {(node, device): [dtype, ...]}."""
    where = "1" if node is None else "node_id = {node:String}"
    rows = store.query(
        "SELECT node_id, device, groupArray(dtype) FROM ("
        "  SELECT node_id, device, dtype, sum AS mine, cls,"
        "    count() OVER w AS voters, max(votes) OVER w AS top, "
        "    argMax(sum, votes) OVER w AS majority FROM ("
        "      SELECT node_id, device, labels['dtype'] AS dtype, labels['size'] AS size, "
        "        argMax(value, timestamp) AS sum, argMax(class_fingerprint, timestamp) AS cls, "
        "        count() OVER (PARTITION BY cls, device, dtype, size, sum) AS votes "
        f"      FROM {store.database}.bench_results WHERE metric_name = 'bench_gemm_checksum' "
        "      GROUP BY node_id, device, dtype, size)"
        "    WINDOW w AS (PARTITION BY cls, device, dtype, size))"
        f" WHERE voters >= 3 AND top * 2 > voters AND mine != majority AND {where} "
        "GROUP BY node_id, device ORDER BY node_id, device",
        {"node": node} if node is not None else None,
    )
    return {(n, d): sorted(dtypes) for n, d, dtypes in rows}


def _quorum_hints(rows: list[Row], suspects: dict[tuple[str, str], list[str]]) -> None:
    for row in rows:
        dtypes = suspects.get((row.node_id, row.device))
        if dtypes and row.suite == "compute" and row.metric_name == "bench_gemm_tflops":
            row.hints.append(
                f"GEMM checksum ({', '.join(dtypes)}) differs from the same GPU on the rest of its class: "
                "suspect silent data corruption"
            )


def summary_rows(rows: list[Row]) -> list[Row]:
    """The terminal's rows: per-size NCCL rows only where they are not green (the HTML has all)."""
    return [
        r
        for r in rows
        if "size" not in r.labels or r.labels["size"] == "avg" or r.suite != "nccl" or r.grade != "green"
    ]


def render_table(rows: list[Row]) -> str:
    if not rows:
        return "no benchmark results stored yet: run playbooks/baseline.yml"
    # columns as wide as their longest entry: a label cut short can hide which test a row is
    node_w = max(10, *(len(r.node_id) + 2 for r in rows))
    metric_w = max(38, *(len(r.metric_name) + 2 for r in rows))
    labels_w = max(34, *(len(r.label_text) + 2 for r in rows))
    header = (
        f"{'grade':<7}{'node':<{node_w}}{'suite':<9}{'metric':<{metric_w}}{'labels':<{labels_w}}"
        f"{'value':>11}{'fleet':>11}{'dev%':>7}  notes"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        notes = []
        if r.unstable:
            notes.append(f"unstable (RSD {r.rsd_percent:.1f} %)")
        if r.beyond_3_sigma:
            notes.append(f">3σ from own history ({r.history_mean:.4g}±{r.history_sigma:.2g})")
        if r.fleet_nodes < 2:
            notes.append("only node of its class")
        notes.extend(r.hints)
        lines.append(
            f"{r.grade.upper():<7}{r.node_id:<{node_w}}{r.suite:<9}"
            f"{r.metric_name:<{metric_w}}{r.label_text:<{labels_w}}"
            f"{r.value:>11.4g}{(r.fleet_median or 0):>11.4g}{r.deviation_percent:>7.1f}  {'; '.join(notes)}"
        )
    return "\n".join(map(terminal_safe, lines))
