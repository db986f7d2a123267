"""The test tiers (tests/tiers.py) follow what a test uses, through its helpers and fixtures, so that
`make test-fast` leaves out every test that sweeps the lab, runs a playbook, trains or waits."""

from __future__ import annotations

import ast
import textwrap

from tiers import FAST_EXCLUDES, TESTS, TIERS, tiers_of

MODULE = textwrap.dedent("""
    import subprocess, time
    from conftest import swept_lab

    def _sweep(env):
        subprocess.run(["ansible-playbook", "playbooks/collect.yml"], env=env)

    def _twice(env):
        _sweep(env)
        _sweep(env)

    def test_parses_a_line():
        assert int("1") == 1

    def test_on_the_lab(tmp_path, tmp_dsn):
        swept_lab(tmp_path, tmp_dsn)

    def test_through_a_helper_of_a_helper():
        _twice({})

    def test_waits():
        time.sleep(1)

    class TestGrouped:
        def test_in_a_class(self):
            _sweep({})
""")


def test_a_test_is_marked_by_what_it_calls_through_helpers_and_imported_helpers(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text(MODULE)
    assert tiers_of(module, "test_parses_a_line", []) == set()
    # swept_lab is conftest's: it builds the lab, runs `stethoscope db init` and collect.yml
    assert tiers_of(module, "test_on_the_lab", ["tmp_path", "tmp_dsn"]) == {"lab", "ansible", "cli"}
    assert tiers_of(module, "test_through_a_helper_of_a_helper", []) == {"ansible"}
    assert tiers_of(module, "test_waits", []) == {"realtime"}
    assert tiers_of(module, "TestGrouped", []) == {"ansible"}


def test_a_fixture_marks_the_tests_that_request_it(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text(MODULE)
    # conftest's slurm fixture starts the real slurmctld; lab_sweeps records real sweeps of the lab
    assert tiers_of(module, "test_parses_a_line", ["slurm"]) == {"external"}
    assert tiers_of(module, "test_parses_a_line", ["lab_sweeps"]) == {"lab", "ansible"}


def test_the_suite_has_a_fast_tier_and_every_tier_in_use():
    """Every tier marks some test of this suite, and most tests are in none (the fast tier)."""
    marked = dict.fromkeys(TIERS, 0)
    tests = fast = 0
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                tests += 1
                found = tiers_of(path, node.name, [a.arg for a in node.args.args])
                fast += not found
                for tier in found:
                    marked[tier] += 1
    assert all(marked.values()), marked
    assert fast > tests / 2, (fast, tests, marked)


def test_make_test_fast_leaves_out_every_tier():
    """The Makefile's marker expression is the tiers' own: a new tier is left out of test-fast too."""
    makefile = (TESTS.parent / "Makefile").read_text(encoding="utf-8")
    assert f'-m "not ({FAST_EXCLUDES})"' in makefile
