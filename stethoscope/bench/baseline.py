"""`stethoscope baseline`: fleet baselines per (class, suite, metric, labels), each node's deviation
graded in the catalog's worse direction, its own history (3σ), and the ring-vs-tree hint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from stethoscope import stats
from stethoscope.catalog import Catalog
from stethoscope.store.client import Store

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


def build(store: Store, catalog: Catalog, max_rsd_percent: float = 3.0) -> list[Row]:
    raw = store.query(
        f"SELECT run_id, node_id, class_fingerprint, node_fingerprint, suite, metric_name, device, "
        f"mapKeys(mapSort(labels)), mapValues(mapSort(labels)), value, repetition, unstable, timestamp "
        f"FROM {store.database}.bench_results FINAL ORDER BY timestamp"
    )
    runs: dict[tuple, dict[str, list[float]]] = {}
    meta: dict[tuple, dict] = {}
    for (
        run_id,
        node,
        class_fp,
        node_fp,
        suite,
        name,
        device,
        keys,
        values_,
        value,
        _rep,
        unstable,
        _ts,
    ) in raw:
        labels = json.dumps(dict(zip(keys, values_, strict=True)), sort_keys=True)
        key = (node, suite, name, device, labels)
        runs.setdefault(key, {}).setdefault(run_id, []).append(value)
        entry = meta.setdefault(key, {"order": [], "class": class_fp, "node_fp": {}, "unstable": {}})
        if run_id not in entry["order"]:
            entry["order"].append(run_id)
        entry["class"] = class_fp
        entry["node_fp"][run_id] = node_fp
        entry["unstable"][run_id] = entry["unstable"].get(run_id, False) or bool(unstable)
    rows: list[Row] = []
    for key, by_run in runs.items():
        node, suite, name, device, labels = key
        entry = meta[key]
        latest = entry["order"][-1]
        values = by_run[latest]
        rsd = stats.rsd_percent(values)
        row = Row(
            node,
            entry["class"],
            suite,
            name,
            device,
            json.loads(labels),
            stats.median(values),
            len(values),
            round(rsd, 3),
            entry["unstable"][latest] or rsd > max_rsd_percent,
        )
        # own history: earlier runs under the same node fingerprint (a swapped part starts anew)
        same_parts = [r for r in entry["order"][:-1] if entry["node_fp"][r] == entry["node_fp"][latest]]
        earlier = [stats.median(by_run[r]) for r in same_parts]
        if len(earlier) >= 2:
            row.history_mean, row.history_sigma = stats.mean(earlier), stats.stdev(earlier)
            row.history_runs = len(earlier)
            spec = catalog.get(name)
            better = spec.better if spec else "none"
            delta = row.value - row.history_mean
            worse = -delta if better == "higher" else delta if better == "lower" else abs(delta)
            row.beyond_3_sigma = row.history_sigma > 0 and worse > 3 * row.history_sigma
        rows.append(row)
    _fleet(rows, catalog)
    _ring_vs_tree(rows)
    return sorted(rows, key=lambda r: (-r.deviation_percent, r.node_id, r.suite, r.metric_name, r.label_text))


def _fleet(rows: list[Row], catalog: Catalog) -> None:
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        groups.setdefault((row.class_fingerprint, row.suite, row.metric_name, row.label_text), []).append(row)
    for members in groups.values():
        values = [m.value for m in members]
        median, mad = stats.median(values), stats.mad(values)
        for row in members:
            spec = catalog.get(row.metric_name)
            row.fleet_median, row.fleet_mad, row.fleet_nodes = median, mad, len(members)
            row.deviation_percent = round(
                worse_deviation(row.value, median, spec.better if spec else "none"), 2
            )
            row.grade = grade(row.deviation_percent)


def _ring_vs_tree(rows: list[Row]) -> None:
    """Ring degraded while tree is normal: the ring crosses a congested switch port. Both: the NIC."""
    average = {
        (r.node_id, r.labels.get("algo")): r
        for r in rows
        if r.metric_name == "bench_allreduce_busbw_gb_per_s" and r.labels.get("size") == "avg"
    }
    for (node, algo), ring in average.items():
        if algo != "ring" or (node, "tree") not in average:
            continue
        tree = average[(node, "tree")]
        if ring.grade != "green" and tree.grade == "green":
            ring.hints.append("ring degraded while tree is normal: suspect switch port congestion")
        elif ring.grade != "green" and tree.grade != "green":
            ring.hints.append("ring and tree both degraded: suspect the node's NIC")
            tree.hints.append("ring and tree both degraded: suspect the node's NIC")


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
    header = (
        f"{'grade':<7}{'node':<10}{'suite':<9}{'metric':<38}{'labels':<34}"
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
            f"{r.grade.upper():<7}{r.node_id:<10}{r.suite:<9}{r.metric_name:<38}{r.label_text[:33]:<34}"
            f"{r.value:>11.4g}{(r.fleet_median or 0):>11.4g}{r.deviation_percent:>7.1f}  {'; '.join(notes)}"
        )
    return "\n".join(lines)
