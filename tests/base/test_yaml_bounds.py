"""Operators' YAML is bounded: a rule file, the metric catalog, a faults file and the
inventory are refused past a size limit unread, and past an alias count, an alias expansion or a
nesting depth while they are composed, with file and line; a refused rule file costs that file only
where the loader already keeps per-file failures (watch, serve)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stethoscope.catalog import Catalog, CatalogError
from stethoscope.diagnosis.ruleset import RuleSet
from stethoscope.store.fault_file import parse
from stethoscope.telemetry.metric_set import MetricSetError, load_sets

from conftest import TOP

MIB = 1024 * 1024
RSS_LIMIT_KIB = 400 * 1024  # what reading a refused bomb may cost at most (one grew past 3.4 GB)
SECONDS_LIMIT = 10

GOOD_RULE = (
    "rule_id: gpu_hot_test\ndescription: hot\nseverity: warning\n"
    "trigger: [{metric: gpu_temperature_celsius, operator: '>', threshold: 80, window: 5m}]\n"
)


def bomb_rule(rule_id: str = "gpu_hot_test") -> str:
    """A valid rule but for its device pattern, the bomb (it ran out of 2 GiB after 43 s)."""
    return billion_laughs() + GOOD_RULE.replace("gpu_hot_test", rule_id).replace("5m}", "5m, device: *l9}")


def billion_laughs(indent: str = "") -> str:
    """Nine levels of nine aliases each: 9**9 (387 million) strings once expanded."""
    lines = [f'{indent}l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        lines.append(f"{indent}l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2048 * MIB, 2048 * MIB))


def run_capped(*command: str) -> tuple[subprocess.CompletedProcess, float]:
    """`command` in a child held to 2 GiB of address space and 60 s, so that the bug, were it back,
    fails the test rather than the machine; its result and how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        list(command), cwd=TOP, capture_output=True, text=True, timeout=60, preexec_fn=_cap_memory
    )
    return result, time.monotonic() - started


def stethoscope(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    return run_capped(sys.executable, "-m", "stethoscope.cli", *args)


def test_a_billion_laughs_rule_file_is_refused_quickly(tmp_path):
    """Regression: a rule file of nested aliases grew past 3.4 GB."""
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(bomb_rule())
    result, seconds = stethoscope("rules", "check", str(bomb))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert f"{bomb}:" in result.stderr and "alias" in result.stderr
    assert seconds < SECONDS_LIMIT


def test_a_billion_laughs_rule_file_is_refused_at_its_line_in_little_memory(tmp_path):
    """The refusal names the line where the expansion passed the limit; the child that only reads
    the file peaks small."""
    bomb = tmp_path / "bomb.yml"
    bomb.write_text("# a bomb\n" + billion_laughs())
    code = (
        "import sys; from pathlib import Path; from stethoscope.catalog import Catalog; "
        "from stethoscope.diagnosis.rules import load_rules; "
        f"r = load_rules(Path({str(bomb)!r}), Catalog.load()); print(*r.errors, sep='\\n'); "
        # VmHWM, not ru_maxrss: that one carries the peak of the process forked from (a long suite's)
        "print(Path('/proc/self/status').read_text().split('VmHWM:')[1].split()[0], file=sys.stderr)"
    )
    child, seconds = run_capped(sys.executable, "-c", code)
    assert child.returncode == 0, child.stderr[-2000:]
    (error,) = child.stdout.splitlines()
    file, line, field, _ = error.split(":", 3)
    assert (file, field.strip()) == (str(bomb), "yaml") and 2 <= int(line) <= 11, error
    assert "expand" in error
    assert int(child.stderr.split()[-1]) < RSS_LIMIT_KIB and seconds < SECONDS_LIMIT


def test_a_50_mb_rule_file_is_refused_by_its_size_unread(tmp_path):
    """Regression: a 50 MB rule file took 66 s to be read and refused."""
    big = tmp_path / "big.yml"
    with big.open("w") as out:
        out.write(GOOD_RULE)
        out.write(("# " + "x" * 1021 + "\n") * (50 * 1024))
    result, seconds = stethoscope("rules", "check", str(big))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{big}:1: yaml: larger than 4 MiB" in result.stderr
    assert seconds < SECONDS_LIMIT


def test_a_rule_file_of_too_many_aliases_is_refused_at_the_alias(tmp_path):
    many = tmp_path / "many.yml"
    many.write_text(GOOD_RULE + "x: &x 1\nys:\n" + "  - *x\n" * 10_001)
    result, _ = stethoscope("rules", "check", str(many))
    assert result.returncode == 2
    assert f"{many}:10007: yaml: more than 10000 aliases" in result.stderr


def test_a_recursive_alias_is_refused_not_a_crash(tmp_path):
    loop = tmp_path / "loop.yml"
    loop.write_text(GOOD_RULE + "x: &x [1, *x]\n")
    result, _ = stethoscope("rules", "check", str(loop))
    assert result.returncode == 2 and f"{loop}:5: yaml: " in result.stderr
    assert "Traceback" not in result.stderr


def test_a_rule_file_nested_past_the_depth_limit_is_refused_not_a_crash(tmp_path):
    deep = tmp_path / "deep.yml"
    deep.write_text(GOOD_RULE + "x: " + "[" * 5000 + "]" * 5000 + "\n")
    result, _ = stethoscope("rules", "check", str(deep))
    assert result.returncode == 2 and f"{deep}:5: yaml: nested deeper than" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bomb_costs_its_rule_file_only_where_rules_follow_their_files(tmp_path):
    """watch and serve keep per-file rules: the good file's rules load, the bomb is named."""
    (tmp_path / "good.yml").write_text(GOOD_RULE)
    (tmp_path / "bomb.yml").write_text(bomb_rule("other"))
    started = time.monotonic()
    rules = RuleSet(tmp_path, Catalog.load())
    messages = rules.refresh()
    assert time.monotonic() - started < SECONDS_LIMIT
    assert [rule.rule_id for rule in rules.rules] == ["gpu_hot_test"]
    assert any(m.startswith(f"{tmp_path / 'bomb.yml'}:") and "expand" in m for m in messages), messages


def test_an_inventory_alias_bomb_is_refused_before_ansible_reads_it(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "x_anchors:\n  vars:\n"
        + billion_laughs(indent="    ")
        + "all:\n  hosts:\n    node01: {}\n  vars:\n    stethoscope_bomb: *l9\n"
    )
    result, seconds = stethoscope("rules", "check", "--inventory", str(inventory), str(TOP / "rules"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"inventory {inventory}:" in result.stderr and "expand" in result.stderr
    assert "Traceback" not in result.stderr and seconds < SECONDS_LIMIT


def test_an_inventory_group_vars_file_over_its_size_limit_is_refused(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    node01: {}\n")
    (tmp_path / "group_vars").mkdir()
    big = tmp_path / "group_vars" / "all.yml"
    big.write_text("# " + "x" * (17 * MIB) + "\nstethoscope_x: 1\n")
    result, seconds = stethoscope("rules", "check", "--inventory", str(inventory), str(TOP / "rules"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"inventory {big}:1: larger than 16 MiB" in result.stderr
    assert seconds < SECONDS_LIMIT


def test_a_faults_file_alias_bomb_is_a_file_line_error(tmp_path):
    bomb = tmp_path / "faults.yml"
    bomb.write_text(billion_laughs() + "faults: *l9\n")
    started = time.monotonic()
    parsed = parse(bomb, {"node01"}, None)
    assert time.monotonic() - started < SECONDS_LIMIT
    assert parsed.faults == [] and len(parsed.errors) == 1
    assert parsed.errors[0].startswith(f"{bomb}:") and "expand" in parsed.errors[0]


def test_a_metric_catalog_alias_bomb_is_a_catalog_error(tmp_path):
    bomb = tmp_path / "metrics.yml"
    bomb.write_text(billion_laughs() + "metrics: {}\n")
    with pytest.raises(CatalogError, match="expand"):
        Catalog.load(bomb)


def test_a_metric_set_file_alias_bomb_is_a_metric_set_error(tmp_path):
    bomb = tmp_path / "telemetry.yml"
    bomb.write_text(billion_laughs() + "sets: []\n")
    with pytest.raises(MetricSetError, match="expand"):
        load_sets(bomb)


def test_the_shipped_rules_and_catalog_are_within_the_bounds():
    result, _ = stethoscope("rules", "check", str(TOP / "rules"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(p.stat().st_size < MIB for p in Path(TOP / "rules").rglob("*.yml"))
