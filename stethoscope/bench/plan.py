"""The re-baseline plan after hardware changes: nodes whose fingerprint changed in the window
(`node_fingerprint_changes_total` rose, the `hardware_changed_rebaseline` rule), grouped per their
new class into one baseline.yml run each, under its batch and Slurm rules. A fleet-wide driver
upgrade is one plan of one class, not one benchmark per node.

    python -m stethoscope.bench.plan [--since 1d] [--json]     (--since: 90s, 15m, 1.5h, 2d, 1w or seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

from stethoscope.store.client import Store, StoreError
from stethoscope.timeutil import duration_option, now_ms

METRIC = "node_fingerprint_changes_total"


@dataclass
class Plan:
    class_fingerprint: str
    nodes: list[str]
    inventory: str = "INVENTORY"  # ansible.cfg names none: the command says which

    @property
    def command(self) -> str:
        return f"ansible-playbook -i {self.inventory} playbooks/baseline.yml --limit {','.join(self.nodes)}"


def changed_nodes_by_class(store: Store, since_ms: int) -> list[Plan]:
    """One query: the nodes whose counter rose since `since_ms` (first sample in the window counts
    from the last one before it), with the class their newest fingerprint fact names."""
    since = "fromUnixTimestamp64Milli({since:Int64}, 'UTC')"
    rows = store.query(
        "SELECT cls, groupArray(node_id) FROM ("
        "  SELECT c.node_id AS node_id, f.cls AS cls FROM ("
        "    SELECT node_id, argMax(value, timestamp) - if(countIf(timestamp <= " + since + ") > 0, "
        "      argMaxIf(value, timestamp, timestamp <= " + since + "), argMin(value, timestamp)) AS rose"
        f"    FROM {store.database}.metrics WHERE metric_name = {{m:String}}"
        "    AND timestamp > " + since + " - INTERVAL 2 DAY"
        "    GROUP BY node_id HAVING rose > 0) AS c"
        "  LEFT JOIN ("
        "    SELECT node_id, argMax(JSONExtractString(facts, 'class_fingerprint'), collected_at) AS cls"
        f"    FROM {store.database}.facts WHERE collector = 'fingerprint' GROUP BY node_id) AS f"
        "  USING (node_id) ORDER BY node_id) GROUP BY cls ORDER BY cls",
        {"m": METRIC, "since": since_ms},
    )
    return [Plan(cls, sorted(nodes)) for cls, nodes in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stethoscope.bench.plan", description=__doc__)
    parser.add_argument(
        "--since", type=duration_option, default=86400, metavar="DURATION", help="changed within (default 1d)"
    )
    parser.add_argument("--dsn")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--inventory", default=os.environ.get("STETHOSCOPE_INVENTORY") or "INVENTORY", help="for the commands"
    )
    args = parser.parse_args(argv)
    if args.since <= 0:
        print(f"plan: --since {args.since:g} s: must be positive", file=sys.stderr)
        return 2
    try:
        with Store(args.dsn) as store:
            plans = changed_nodes_by_class(store, now_ms() - round(args.since * 1000))
        for plan in plans:
            plan.inventory = args.inventory
    except StoreError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps([dict(asdict(p), command=p.command) for p in plans], sort_keys=True))
    elif not plans:
        print("no fingerprint changed: nothing to re-baseline")
    for plan in [] if args.json else plans:
        print(f"class {plan.class_fingerprint}: {len(plan.nodes)} node(s) changed -> {plan.command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
