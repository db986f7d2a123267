"""One rule -> layer function (diagnosis/layers.py `rule_layer`): the audit, the board, the model's
pairing and `fault confirm` give a rule's findings the same layer."""

from __future__ import annotations

from stethoscope.catalog import Catalog
from stethoscope.diagnosis import audit
from stethoscope.diagnosis.layers import rule_layer
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import rules_dir

CATALOG = Catalog.load()
RULES = load_rules(rules_dir(), CATALOG).rules
NVLINK = next(r for r in RULES if r.rule_id == "nvlink_physical_error")


def test_a_rule_is_of_the_layer_of_the_metric_it_judges_not_of_those_that_qualify_it():
    # NVLink errors while the GPU is below 70 C: a link fault, not heat
    assert [m for m in NVLINK.metrics if m.startswith("gpu_")] == ["gpu_temperature_celsius"]
    assert rule_layer(NVLINK, CATALOG) == "communication"


def test_every_rule_has_one_layer_of_the_catalog():
    from stethoscope.catalog import LAYERS

    assert {rule_layer(r, CATALOG) for r in RULES} <= set(LAYERS)


def test_the_audit_replays_a_fault_with_the_rules_of_its_layer_only():
    reported = {m for r in RULES for m in r.metrics}
    compute = {r.rule_id for r in audit.rules_of_layer(RULES, "compute", reported, CATALOG)}
    communication = {r.rule_id for r in audit.rules_of_layer(RULES, "communication", reported, CATALOG)}
    assert "nvlink_physical_error" not in compute and "nvlink_physical_error" in communication
    assert all(rule_layer(r, CATALOG) == "compute" for r in RULES if r.rule_id in compute)
    # a rule none of whose metrics the node reported cannot match: not replayed
    assert audit.rules_of_layer(RULES, "communication", set(), CATALOG) == []


def test_the_board_the_model_pairing_and_fault_confirm_read_the_one_function():
    from stethoscope.cli import fault
    from stethoscope.diagnosis import model_findings
    from stethoscope.report import board

    assert board.rule_layer is model_findings.rule_layer is fault.rule_layer is audit.rule_layer is rule_layer
