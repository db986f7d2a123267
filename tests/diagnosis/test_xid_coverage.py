"""Every XID the reference catalog (docs/reference/xid.md, main table) lists is handled by a shipped
rule or declared application-level or informational there, with its reason; and the declaration
matches the rules under rules/gpu/."""

from __future__ import annotations

import re

import yaml

from conftest import TOP

DOC = (TOP / "docs/reference/xid.md").read_text()
ROW = re.compile(r"^\|\s*(\d+)\s*\|(.*)$", re.MULTILINE)


def section(title: str) -> str:
    start = DOC.index("\n## " + title)
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else len(DOC)]


def catalog_xids() -> set[int]:
    return {int(code) for code, _ in ROW.findall(section("Main table"))}


def declared() -> dict[int, tuple[str, str]]:
    """XID -> (handling, reason) from the coverage table."""
    table = {}
    for code, rest in ROW.findall(section("What stethoscope does with each XID")):
        handling, reason = [cell.strip().strip("`") for cell in rest.strip().strip("|").split("|")][:2]
        table[int(code)] = (handling, reason)
    return table


def xid_conditions(node):
    """Every condition of a rule (trigger list or nested when: any/all) that reads gpu_xid_errors_total."""
    if isinstance(node, dict):
        if node.get("metric") == "gpu_xid_errors_total":
            yield node
        for value in node.values():
            yield from xid_conditions(value)
    elif isinstance(node, list):
        for item in node:
            yield from xid_conditions(item)


def ruled() -> dict[int, set[str]]:
    """XID -> the shipped rules that fire on it."""
    found: dict[int, set[str]] = {}
    for path in sorted((TOP / "rules/gpu").glob("*.yml")):
        for rule in yaml.safe_load(path.read_text()) or []:
            for condition in xid_conditions({k: rule.get(k) for k in ("trigger", "when")}):
                code = (condition.get("labels") or {}).get("xid")
                if code is not None:
                    found.setdefault(int(code), set()).add(rule["rule_id"])
    return found


def test_each_catalog_xid_is_declared_once_with_a_reason():
    table = declared()
    assert set(table) == catalog_xids()
    for code, (handling, reason) in table.items():
        assert handling == f"rule gpu_xid_{code}" or handling in ("application-level", "informational"), code
        assert len(reason) > 10, f"XID {code}: say why"


def test_the_declaration_matches_the_shipped_rules():
    table, rules = declared(), ruled()
    for code, (handling, _reason) in table.items():
        if handling.startswith("rule "):
            assert rules.get(code) == {handling.split()[1]}, code
        else:
            assert code not in rules, f"XID {code} is declared {handling} but a rule reads it"
    assert set(rules) <= set(table), "a shipped XID rule whose XID the catalog does not list"


def test_the_nvlink5_xids_are_all_declared():
    assert set(range(144, 151)) <= set(declared())
