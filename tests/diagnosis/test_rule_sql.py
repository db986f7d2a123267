"""The SQL a rule runs can be read: `stethoscope rules sql RULE` prints it formatted by ClickHouse, with
its parameters, and a handful of rules' compiled SQL is kept as golden files (tests/golden_sql/), so a
change to the compiler shows as a diff a reviewer reads. Regenerate them after a deliberate change:
STETHOSCOPE_REGOLDEN=1 pytest tests/diagnosis/test_rule_sql.py (then read the diff)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import rule_query
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import rules_dir
from stethoscope.store.client import Store

from conftest import TOP

GOLDEN = Path(__file__).parents[1] / "golden_sql"
AT_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: a fixed instant, so the parameters are too
TTL_SECONDS = 30 * 86400
# a threshold, an increase (its samples as a named CTE), a fleet baseline, any-sample bits, a correlation,
# conditions that read the same rows (written once, as a named CTE: ClickHouse may still read them twice)
RULES = (
    "gpu_hbm_temperature_high",
    "ib_symbol_errors_rising",
    "ib_mtu_mismatch",
    "gpu_hw_slowdown",
    "ib_switch_congestion",
    "gpu_temperature_rising",
)


def compiled(rule_id: str, dsn: str) -> tuple[str, dict]:
    """The rule's query as ClickHouse formats it, and its parameters."""
    catalog = Catalog.load()
    (rule,) = [r for r in load_rules(rules_dir(), catalog).rules if r.rule_id == rule_id]
    sql, parameters = rule_query(rule, "stethoscope", AT_MS, TTL_SECONDS, catalog)
    with Store(dsn) as store:
        return str(store.query("SELECT formatQuery({sql:String})", {"sql": sql})[0][0]), parameters


@pytest.mark.parametrize("rule_id", RULES)
def test_a_rules_compiled_sql_is_its_golden_file(rule_id, tmp_dsn):
    sql, parameters = compiled(rule_id, tmp_dsn)
    text = sql + "\n-- parameters\n" + json.dumps(parameters, indent=1, sort_keys=True, default=str) + "\n"
    golden = GOLDEN / f"{rule_id}.sql"
    if os.environ.get("STETHOSCOPE_REGOLDEN"):
        golden.write_text(text)
    assert golden.read_text() == text, f"{rule_id}: compiled SQL differs from {golden} (see the module doc)"


def test_an_increase_reads_its_samples_once_as_a_named_cte(tmp_dsn):
    sql, parameters = compiled("ib_symbol_errors_rising", tmp_dsn)
    # two conditions, each an increase: each builds its samples once (the series without a sample
    # before the window are read from the named CTE, not by repeating it)
    assert sql.count("groupArrayIf((timestamp, value)") == 2 and sql.count("FROM samples AS s") == 2
    assert list(parameters.values()).count("ib_symbol_errors_total") == 1  # one parameter per value


def subqueries(sql: str) -> list[str]:
    """The text inside each pair of parentheses that opens with a SELECT (or WITH): the subqueries."""
    opened: list[int] = []
    found = []
    for place, char in enumerate(sql):
        if char == "(":
            opened.append(place)
        elif char == ")":
            inside = sql[opened.pop() + 1 : place]
            if inside.startswith(("SELECT", "WITH")):
                found.append(inside)
    return found


def every_rules_query():
    """(rule_id, sql, parameters) of every shipped rule, read through the rollups and without, for a
    store that keeps its raw rows 30 days and one that keeps them 3 (past it, the daily rollup)."""
    catalog = Catalog.load()
    for rule in load_rules(rules_dir(), catalog).rules:
        for via in ("rollup", "raw"):
            for days in (30, 3):
                yield (rule.rule_id, *rule_query(rule, "stethoscope", AT_MS, days * 86400, catalog, via=via))


def test_a_rules_parameters_are_those_its_sql_references():
    for rule_id, sql, parameters in every_rules_query():
        assert set(parameters) == set(re.findall(r"\{(\w+):", sql)), rule_id


def test_a_rule_writes_the_same_read_once():
    for rule_id, sql, _ in every_rules_query():
        reads = [query for query in subqueries(sql) if "FROM stethoscope." in query]
        repeated = {query[:120] for query in reads if reads.count(query) > 1}
        assert not repeated, f"{rule_id}: the same read twice (name it once, WITH ... AS): {repeated}"
        # an increase picks the series without a sample before its window once, for both of its looks back
        assert sql.count("WHERE NOT has_before") <= sql.count("FROM samples AS s"), rule_id


def test_rules_sql_prints_the_formatted_query_and_its_parameters(tmp_path, tmp_dsn):
    with Store(tmp_dsn) as store:
        store.init_schema()
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "rules", "sql"]
    shown = subprocess.run([*command, "gpu_hbm_temperature_high", "--at", "1767225600"], capture_output=True,
                           text=True, cwd=TOP, timeout=120, check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("-- gpu_hbm_temperature_high (") and "2026-01-01T00:00:00" in lines[0]
    assert lines[1] == "SELECT" and "-- parameters" in lines and len(lines) > 20
    assert any(line.startswith("--   at = 1767225600000") for line in lines)
    unknown = subprocess.run([*command, "no_such_rule"], capture_output=True, text=True, cwd=TOP, timeout=120)
    assert unknown.returncode == 2 and "no rule 'no_such_rule'" in unknown.stderr
    as_json = subprocess.run([*command, "gpu_hbm_temperature_high", "--json"], capture_output=True, text=True,
                             cwd=TOP, timeout=120, check=False)  # fmt: skip
    assert json.loads(as_json.stdout)["parameters"]["at"] > 0


def test_rules_sql_without_a_store_prints_the_same_and_creates_nothing(tmp_path, tmp_dsn):
    missing, scratch = tmp_path / "nowhere" / "db", tmp_path / "scratch"
    scratch.mkdir()

    def shown(dsn: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "rules", "sql"]
        command += ["ib_symbol_errors_rising", "--at", "1767225600"]
        env = {**os.environ, "TMPDIR": str(scratch)}
        return subprocess.run(
            command, capture_output=True, text=True, cwd=TOP, timeout=120, env=env, check=False
        )

    without = shown(f"chdb://{missing}")
    assert without.returncode == 0 and "no store read" in without.stderr, without.stderr
    assert not missing.exists() and not any(scratch.iterdir())  # nor is the session that formatted it left
    with Store(tmp_dsn) as store:
        store.init_schema()
    assert shown(tmp_dsn).stdout == without.stdout  # formatted by ClickHouse, store or none
    sql, listed = without.stdout.split("-- parameters\n")
    assert sql.splitlines()[1] == "SELECT"
    names = {line.split()[1] for line in listed.splitlines()}
    assert names == set(re.findall(r"\{(\w+):", sql)) and "at" not in names  # only those the SQL reads
