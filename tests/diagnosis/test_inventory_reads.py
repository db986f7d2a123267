"""With an inventory (`serve --inventory`, `diagnose --inventory`) the reads keep to its hosts through a
set, `node_id IN {nodes:Array(String)}`, never `has(array, node_id)`: ClickHouse scans the array for
every row read, so at 2,000 nodes x 24 h a cycle's rules took 258 s against 7 s without the
inventory (by hand, on benchmarks/diagnosis_cycle.py's data); a set is one hash lookup a row, and the
primary key can use it."""

from __future__ import annotations

import re

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import rule_query
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import rules_dir

from conftest import TOP

AT_MS = 1_767_225_600_000
NODES = [f"node{i:04d}" for i in range(3)]
SCANNED = re.compile(r"has\(\{+\w+:Array\(String\)\}+,\s*node_id\)")  # in a compiled query
# has() of a query parameter, in the package's source: only these arrays are small (two hours, the
# names of a few tables)
ARRAY_SCAN = re.compile(r"has\(\s*\{+\w+\s*:")
SMALL_ARRAYS = {"stethoscope/report/top.py": 1, "stethoscope/store/client.py": 1}


def test_every_shipped_rule_reads_only_the_inventorys_hosts_through_a_set():
    catalog = Catalog.load()
    for rule in load_rules(rules_dir(), catalog).rules:
        sql, parameters = rule_query(rule, "stethoscope", AT_MS, 30 * 86400, catalog, nodes=NODES)
        assert "node_id IN {nodes:Array(String)}" in sql and not SCANNED.search(sql), rule.rule_id
        assert parameters["nodes"] == NODES


def test_no_read_of_the_package_scans_a_parameters_array_on_every_row_but_the_small_ones():
    sources = {
        str(path.relative_to(TOP)): path.read_text(encoding="utf-8")
        for path in (TOP / "stethoscope").rglob("*.py")
    }
    assert "node_id IN {nodes:Array(String)}" in sources["stethoscope/diagnosis/engine.py"]  # scanned
    scans = {name: len(ARRAY_SCAN.findall(text)) for name, text in sources.items() if ARRAY_SCAN.search(text)}
    assert scans == SMALL_ARRAYS
