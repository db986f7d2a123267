"""JSON Schemas of a rule file and of rules/metrics.yml (docs/rules.md), shipped as package data
for editors and pre-commit. Their enums and field lists are the loaders' own constants, every shipped
file passes them, and what they refuse `stethoscope rules check` (the authority) refuses too."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from stethoscope import catalog, names, paths
from stethoscope.catalog import Catalog, CatalogError, MetricSpec
from stethoscope.diagnosis import rules
from stethoscope.diagnosis.rules import load_rules, rule_files

TOP = Path(__file__).resolve().parents[2]
RULE_SCHEMA = TOP / "stethoscope/schemas/rule-file.schema.json"
METRICS_SCHEMA = TOP / "stethoscope/schemas/metrics.schema.json"


def _schema(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _validator(path: Path) -> Draft202012Validator:
    return Draft202012Validator(_schema(path))


def _defs(path: Path) -> dict:
    return _schema(path)["$defs"]


def _problems(path: Path, document: object) -> list[str]:
    """Each schema error as `where: message` (where: the path into the document)."""
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in _validator(path).iter_errors(document)
    ]


# --- the schemas themselves -----------------------------------------------------------------------


@pytest.mark.parametrize("path", [RULE_SCHEMA, METRICS_SCHEMA], ids=lambda p: p.name)
def test_each_schema_is_valid_draft_2020_12_and_names_rules_check_the_authority(path):
    schema = _schema(path)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert "stethoscope rules check" in schema["description"]
    assert schema["$id"].endswith(f"stethoscope/schemas/{path.name}")


def test_the_paths_module_and_the_wheel_ship_the_schemas():
    assert paths.schema_path("rules") == RULE_SCHEMA.resolve()
    assert paths.schema_path("metrics") == METRICS_SCHEMA.resolve()
    declared = tomllib.loads((TOP / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in declared["stethoscope"] for p in (TOP / "stethoscope").glob(pattern)}
    assert {RULE_SCHEMA, METRICS_SCHEMA} <= shipped


def test_rules_schema_command_prints_each_schemas_path():
    printed = {}
    for which in ("rules", "metrics"):
        result = subprocess.run(
            [sys.executable, "-m", "stethoscope.cli", "rules", "schema", which],
            capture_output=True,
            text=True,
            cwd=TOP,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        printed[which] = Path(result.stdout.strip())
    assert printed == {"rules": RULE_SCHEMA.resolve(), "metrics": METRICS_SCHEMA.resolve()}


# --- no drift from the loaders' constants ---------------------------------------------------------


def test_rule_schema_enums_are_the_loaders_constants():
    defs = _defs(RULE_SCHEMA)
    rule, condition = defs["rule"]["properties"], defs["condition"]["properties"]
    assert tuple(rule["severity"]["enum"]) == rules.SEVERITIES
    assert tuple(rule["level"]["enum"]) == rules.LEVELS
    assert tuple(condition["operator"]["enum"]) == rules.OPERATORS
    assert tuple(condition["aggregate"]["enum"]) == rules.AGGREGATES
    assert tuple(condition["baseline"]["enum"]) == rules.BASELINES
    assert tuple(condition["deviation"]["enum"]) == rules.DEVIATIONS
    assert tuple(defs["correlate"]["properties"]["by"]["enum"]) == rules.CORRELATE_BY
    assert condition["metric"]["pattern"] == names.METRIC_NAME.pattern
    # every aggregate a kind of metric allows is one the rule schema offers
    assert {a for allowed in catalog.AGGREGATES.values() for a in allowed} <= set(rules.AGGREGATES)


def test_rule_schema_fields_are_the_loaders_fields():
    defs = _defs(RULE_SCHEMA)
    assert set(defs["rule"]["properties"]) == rules.RULE_FIELDS
    assert set(defs["condition"]["properties"]) == rules.CONDITION_FIELDS
    assert defs["rule"]["additionalProperties"] is False
    assert defs["condition"]["additionalProperties"] is False
    actions = defs["action"]
    assert tuple(actions["properties"]["type"]["enum"]) == tuple(rules.ACTION_FIELDS)
    for branch in actions["allOf"]:
        kind = branch["if"]["properties"]["type"]["const"]
        required, allowed = rules.ACTION_FIELDS[kind]
        assert set(branch["then"]["required"]) == required | {"type"}, kind
        assert set(branch["then"]["properties"]) == allowed | {"type"}, kind
        assert branch["then"]["additionalProperties"] is False, kind
    assert {b["if"]["properties"]["type"]["const"] for b in actions["allOf"]} == set(rules.ACTION_FIELDS)
    method = next(b for b in actions["allOf"] if b["then"]["properties"].get("method"))
    # the loader upper-cases the method before it compares
    assert {m.upper() for m in method["then"]["properties"]["method"]["enum"]} == set(rules.HTTP_METHODS)


def test_metrics_schema_enums_and_fields_are_the_catalogs():
    defs = _defs(METRICS_SCHEMA)
    metric = defs["metric"]["properties"]
    assert tuple(metric["kind"]["enum"]) == catalog.KINDS
    assert tuple(metric["better"]["enum"]) == catalog.DIRECTIONS
    assert tuple(metric["layer"]["enum"]) == catalog.LAYERS
    derived = {"name", "authored"}  # the entry's key, and what an inventory's interval overrides keep
    assert set(metric) == {f.name for f in dataclasses.fields(MetricSpec)} - derived
    device_kind = defs["device_kind"]["properties"]
    assert set(device_kind) == {"pattern", "metrics", "parent"}
    top = _schema(METRICS_SCHEMA)["properties"]
    assert top["metrics"]["propertyNames"]["pattern"] == names.METRIC_NAME.pattern


# --- every shipped file passes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", rule_files(paths.rules_dir()), ids=lambda p: str(p.relative_to(paths.rules_dir()))
)
def test_every_shipped_rule_file_passes_the_schema(path):
    assert _problems(RULE_SCHEMA, yaml.safe_load(path.read_text(encoding="utf-8"))) == []


def test_the_shipped_metric_catalog_passes_the_schema():
    document = yaml.safe_load((paths.rules_dir() / "metrics.yml").read_text(encoding="utf-8"))
    assert _problems(METRICS_SCHEMA, document) == []


# --- what the schema refuses, rules check refuses -------------------------------------------------

HOT = """\
- rule_id: hot
  description: hot GPU (test)
  severity: critical
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m}
"""
# name -> (the rule file, the field rules check names, what the schema says: where, or its words)
BROKEN = {
    "unknown_rule_key": (
        HOT + "  owner: gpu-team\n",
        "owner",
        "0: Additional properties are not allowed ('owner'",
    ),
    "unknown_condition_key": (
        HOT.replace("window: 5m", "window: 5m, windows: 10m"),
        "windows",
        "0/trigger/0: Additional properties are not allowed ('windows'",
    ),
    "bad_aggregate": (
        HOT.replace("window: 5m", "window: 5m, aggregate: mean"),
        "aggregate",
        "0/trigger/0/aggregate: 'mean' is not one of",
    ),
    "threshold_as_text": (
        HOT.replace("threshold: 80", 'threshold: "80"'),
        "threshold",
        "0/trigger/0/threshold: '80' is not of type 'number'",
    ),
    "window_in_words": (HOT.replace("window: 5m", "window: 5 minutes"), "window", "0/trigger/0/window: "),
    "bad_severity": (HOT.replace("severity: critical", "severity: major"), "severity", "0/severity: "),
    "bad_action_type": (HOT + "  action:\n    - {type: email, message: hot}\n", "type", "0/action/0/type: "),
    "min_matches_without_any": (
        HOT.replace("window: 5m", "window: 5m, min_matches: 2"),
        "min_matches",
        "0/trigger/0: 'aggregate' is a required property",
    ),
    "no_trigger_nor_when": (
        "\n".join(HOT.splitlines()[:3]) + "\n",
        "trigger",
        "is not valid under any of the given schemas",
    ),
    "has_bits_fraction": (
        HOT.replace('operator: ">", threshold: 80', "operator: has_bits, threshold: 0.5"),
        "threshold",
        "0/trigger/0/threshold: 0.5 is not of type 'integer'",
    ),
    "history_without_baseline": (
        HOT.replace("window: 5m", "window: 5m, history: 7d"),
        "baseline",
        "0/trigger/0: 'baseline' is a required property",
    ),
    "playbook_outside_playbooks": (
        HOT + "  action:\n    - {type: playbook, playbook: ../x.yml}\n",
        "playbook",
        "0/action/0/playbook: ",
    ),
}


@pytest.fixture(scope="module")
def rules_check_on_broken(tmp_path_factory) -> tuple[Path, int, str]:
    """`stethoscope rules check` over a folder of every broken rule file: the folder, exit code, stderr."""
    folder = tmp_path_factory.mktemp("broken")
    for name, (text, _field, _said) in BROKEN.items():
        (folder / f"{name}.yml").write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "rules", "check", str(folder)],
        capture_output=True,
        text=True,
        cwd=TOP,
        check=False,
    )
    return folder, result.returncode, result.stderr


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_rule_is_refused_by_the_schema_and_by_rules_check(name, rules_check_on_broken):
    text, field, schema_says = BROKEN[name]
    problems = _problems(RULE_SCHEMA, yaml.safe_load(text))
    assert any(schema_says in problem for problem in problems), problems
    folder, code, stderr = rules_check_on_broken
    assert code == 2 and "Traceback" not in stderr
    said = [line for line in stderr.splitlines() if line.startswith(f"{folder / name}.yml:")]
    assert any(f": {field}: " in line for line in said), said


@pytest.mark.parametrize(
    "entry",
    [
        {"unit": "celsius", "kind": "gague", "better": "lower", "interval": 60},
        {"unit": "celsius", "kind": "gauge", "better": "colder", "interval": 60},
        {"unit": "celsius", "kind": "gauge", "better": "lower", "interval": "1m"},
        {"unit": "celsius", "kind": "gauge", "better": "lower", "interval": 60, "layer": "gpu"},
    ],
    ids=["kind", "better", "interval", "layer"],
)
def test_a_broken_catalog_entry_is_refused_by_the_schema_and_by_the_catalog(entry, tmp_path):
    document = {"metrics": {"gpu_temperature_celsius": entry}}
    assert _problems(METRICS_SCHEMA, document)
    path = tmp_path / "metrics.yml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(CatalogError, match="gpu_temperature_celsius"):
        Catalog.load(path)


# --- where both accept, and where both refuse, agree ----------------------------------------------


@pytest.fixture(scope="module")
def shipped_catalog() -> Catalog:
    return Catalog.load()


def _loads(text: str, tmp_path: Path, shipped_catalog: Catalog) -> bool:
    path = tmp_path / "rule.yml"
    path.write_text(text)
    result = load_rules(path, shipped_catalog)
    return not result.errors and bool(result.rules)


def _passes(text: str) -> bool:
    return not _problems(RULE_SCHEMA, yaml.safe_load(text))


VALUES = {
    "rule_id": ["hot", "gpu.hot-1_a", "hot gpu", "hot/gpu", "", "hôt"],
    "family": ["gpu_thermal", "gpu thermal", "a/b"],
    # as YAML reads them: quoted, text; bare, a number where it looks like one
    "window": [
        *("5m", "30s", "2h", "7d", "1w", "1.5h", "5 m", "' 5m '", "300", "'300'", "90.0"),
        *("true", "5min", "-5m", "m", "1.5", "5m5s", "5M"),
    ],
    "cooldown": ["30m", "1d", "2w", "soon", "'1h '"],
    "confidence": ["1", "0.5", "0", "1.5", "true", "'0.5'"],
    "level": ["L1", "L4", "L5", "l1"],
}


@pytest.mark.parametrize(
    ("key", "value"), [(key, value) for key, values in VALUES.items() for value in values]
)
def test_the_schema_and_the_loader_agree_on_ids_durations_and_ranges(key, value, tmp_path, shipped_catalog):
    if key == "window":
        rule = HOT.replace("window: 5m", f"window: {value}")
    elif key == "rule_id":
        rule = HOT.replace("rule_id: hot", f"rule_id: '{value}'")
    elif key in ("confidence", "cooldown"):
        rule = HOT + f"  {key}: {value}\n"
    else:
        rule = HOT + f"  {key}: '{value}'\n"
    assert _passes(rule) == _loads(rule, tmp_path, shipped_catalog), rule


EVERY_FEATURE = """\
rules:
  - rule_id: every_feature
    description: every key the loader knows (test)
    severity: warning
    level: L3
    confidence: 0.5
    cooldown: 2h
    family: gpu_test
    message: "{{ node_id }} {{ device }}: {{ value }}"
    correlate: {by: rack, min_nodes: 3}
    when:
      all:
        - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m, aggregate: max,
           labels: {source: ""}, device: "gpu*", min_samples: 2}
        - any:
            - {metric: gpu_throttle_reasons_active, operator: has_bits, threshold: 8, without_bits: 96,
               window: 10m, aggregate: any, min_matches: 2}
            - {metric: gpu_sm_clock_mhz, operator: ">", threshold: 10, window: 1h, baseline: node,
               deviation: sigma, history: 7d}
            - all:
                - {metric: gpu_xid_errors_total, operator: ">", threshold: 0, window: 1d, aggregate: delta}
    action:
      - {type: log, message: "{{ node_id }}", level: info}
      - {type: alert, message: "{{ node_id }}", endpoint: "http://alerts.example/hook", channel: gpu}
      - {type: api_call, endpoint: "http://x.example/{{ node_id }}", method: put, payload: {a: 1},
         headers: {X-Token: t}, timeout: 5, retries: 2}
      - {type: playbook, playbook: remediate/drain.yml, extra_vars: {reason: hot}}
"""


ONE_RULE = """\
rule_id: hot
description: one rule, not a list (test)
severity: info
trigger: [{metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m}]
"""


@pytest.mark.parametrize(
    "text", [EVERY_FEATURE, ONE_RULE], ids=["rules_mapping_with_every_key", "one_rule_not_a_list"]
)
def test_every_form_the_loader_accepts_passes_the_schema(text, tmp_path, shipped_catalog):
    assert _loads(text, tmp_path, shipped_catalog)
    assert _problems(RULE_SCHEMA, yaml.safe_load(text)) == []


def test_an_editor_reads_the_schema_from_the_comment_the_docs_give():
    """docs/rules.md names the modeline a rule file may carry; its path from rules/<layer>/ resolves."""
    design = (TOP / "docs/rules.md").read_text(encoding="utf-8")
    line = "# yaml-language-server: $schema=../../stethoscope/schemas/rule-file.schema.json"
    assert line in design
    assert (TOP / "rules/gpu" / line.split("=", 1)[1]).resolve() == RULE_SCHEMA.resolve()


def _documented_hooks() -> list[dict]:
    """The pre-commit configuration docs/rules.md gives, its hooks in order."""
    design = (TOP / "docs/rules.md").read_text(encoding="utf-8")
    after = design.split("pre-commit, in a repository holding rules:\n", 1)[1]
    block = after.split("```yaml\n", 1)[1].split("```", 1)[0]
    return [hook for repo in yaml.safe_load(textwrap.dedent(block)) for hook in repo["hooks"]]


def test_the_documented_pre_commit_hooks_check_what_rules_check_reads():
    rule_hook, catalog_hook, authority = _documented_hooks()
    candidates = [p.relative_to(TOP).as_posix() for p in (TOP / "rules").rglob("*") if p.is_file()]

    def selected(hook: dict) -> set[str]:
        exclude = hook.get("exclude", "(?!)")
        return {p for p in candidates if re.search(hook["files"], p) and not re.search(exclude, p)}

    assert selected(rule_hook) == {p.relative_to(TOP).as_posix() for p in rule_files(TOP / "rules")}
    assert selected(catalog_hook) == {"rules/metrics.yml"}
    schemas = [hook["args"][hook["args"].index("--schemafile") + 1] for hook in (rule_hook, catalog_hook)]
    assert [(TOP / s).resolve() for s in schemas] == [RULE_SCHEMA.resolve(), METRICS_SCHEMA.resolve()]
    assert authority["entry"].startswith("stethoscope rules check")
