"""The test tiers (tests/helpers/tiers.py) follow a test's folder, its fixtures and what it calls
through its helpers, so that `make test-fast` leaves out every test that sweeps the lab, runs a
playbook, trains, waits or runs the whole loop."""

from __future__ import annotations

import ast
import textwrap

import pytest
from tiers import FAST_EXCLUDES, FOLDER_TIERS, TESTS, TIERS, tiers_of

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
    # conftest's slurm fixture requests slurm_controller, the real slurmctld (pytest passes the closure)
    assert tiers_of(module, "test_parses_a_line", ["slurm", "slurm_controller"]) == {"external"}
    # lab_sweeps records real sweeps of the lab
    assert tiers_of(module, "test_parses_a_line", ["lab_sweeps"]) == {"lab", "ansible"}


def test_the_suite_has_a_fast_tier_and_every_tier_in_use():
    """Every tier marks some test of this suite, and most tests are in none (the fast tier)."""
    marked = dict.fromkeys(TIERS, 0)
    tests = fast = 0
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                tests += 1
                found = tiers_of(path, node.name, [a.arg for a in node.args.args])
                fast += not found
                for tier in found:
                    marked[tier] += 1
    assert all(marked.values()), marked
    assert fast > tests / 2, (fast, tests, marked)


def test_a_folder_marks_every_test_it_holds(tmp_path):
    """tests/e2e/ is the e2e tier, whatever its tests call; a folder with no tier marks nothing."""
    assert FOLDER_TIERS["e2e"] == {"e2e"}
    for folder, expected in (("e2e", {"e2e"}), ("store", set())):
        module = TESTS / folder / "test_example.py"
        assert (module.parent / "test_store.py").is_file() or folder == "e2e"
        tmp_module = tmp_path / folder / "test_example.py"
        tmp_module.parent.mkdir()
        tmp_module.write_text(MODULE)
        # what the module calls is read from the copy; the folder from where it would live
        from tiers import folder_tiers

        assert folder_tiers(module) == expected
        assert tiers_of(tmp_module, "test_parses_a_line", []) == set()


def test_words_in_comments_docstrings_and_other_cases_mark_nothing(tmp_path):
    """Tiers are read from the syntax tree: prose, a value passed on and a parametrize list naming every
    case's command are not calls (the text regexes marked each of these)."""
    module = tmp_path / "test_example.py"
    module.write_text(
        textwrap.dedent("""
        import subprocess, pytest

        def test_prose():
            'Unlike the serve tests, this one never runs `time.sleep(` or slurm.'
            # ansible-playbook would be slow here
            pass

        def test_passes_popen_on():
            assert callable(subprocess.Popen)

        @pytest.mark.parametrize("command", ["watch", "diagnose"])
        def test_one_case_each(command):
            assert command
    """)
    )
    assert tiers_of(module, "test_prose", []) == set()
    assert tiers_of(module, "test_passes_popen_on", []) == set()
    assert tiers_of(module, "test_one_case_each", ["command"]) == set()


def test_the_suite_is_laid_out_in_folders_with_unique_names():
    """No test module left flat in tests/, and no two with one name (they import each other by name)."""
    modules = sorted(TESTS.rglob("test_*.py"))
    assert not list(TESTS.glob("test_*.py"))
    names = [path.name for path in modules if "fixtures" not in path.relative_to(TESTS).parts]
    assert len(names) == len(set(names))


def test_make_test_fast_leaves_out_every_tier():
    """The Makefile's marker expression is the tiers' own: a new tier is left out of test-fast too."""
    makefile = (TESTS.parent / "Makefile").read_text(encoding="utf-8")
    assert f'-m "not ({FAST_EXCLUDES})"' in makefile


def test_a_helper_imported_under_another_name_is_followed(tmp_path):
    """`from helpers_x import sweep as first_sweep`: the helper is looked up by its own name there."""
    (tmp_path / "helper_example.py").write_text(
        textwrap.dedent("""
        import subprocess

        def sweep():
            subprocess.run(["ansible-playbook", "playbooks/collect.yml"])
    """)
    )
    module = tmp_path / "test_example.py"
    module.write_text(
        textwrap.dedent("""
        from helper_example import sweep as first_sweep

        def test_sweeps():
            first_sweep()
    """)
    )
    from tiers import _test_modules

    _test_modules.cache_clear()
    _test_modules()["helper_example"] = tmp_path / "helper_example.py"
    try:
        assert tiers_of(module, "test_sweeps", []) == {"ansible"}
    finally:
        _test_modules.cache_clear()


def test_a_module_level_constant_a_test_runs_is_read_too(tmp_path):
    """A program in a module-level string the test passes to a process marks the test."""
    module = tmp_path / "test_example.py"
    module.write_text(
        textwrap.dedent('''
        import subprocess, sys

        SCRIPT = """
        from stethoscope.cli.main import main
        main(["model", "info"])
        """

        def test_runs_the_script():
            subprocess.run([sys.executable, "-c", SCRIPT])
    ''')
    )
    assert tiers_of(module, "test_runs_the_script", []) == {"cli"}


def test_programs_run_by_path_by_timeout_or_by_mount_mark_the_test(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text(
        textwrap.dedent("""
        import subprocess, sys
        from pathlib import Path

        BIN = Path(sys.executable).parent

        def test_console_script():
            subprocess.run([str(BIN / "stethoscope"), "--version"])

        def test_hung_program():
            subprocess.run(["timeout", "5", "sh", "-c", "sleep 30"])

        def test_small_disk(tmp_path):
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tmp_path)])
    """)
    )
    assert tiers_of(module, "test_console_script", []) == {"cli"}
    assert tiers_of(module, "test_hung_program", []) == {"realtime"}
    assert tiers_of(module, "test_small_disk", ["tmp_path"]) == {"external"}


@pytest.mark.parametrize(
    ("path", "test", "tier"),
    [
        ("cli/test_cli.py", "test_an_internal_error_is_exit_3_in_one_line", "cli"),
        (
            "plugins/module_utils/test_compute_devices.py",
            "test_hung_nvidia_smi_is_a_timed_out_sample_not_a_hung_benchmark",
            "realtime",
        ),
        ("model/test_training_apart.py", "test_without_the_training_package_the_cli_says_so_exit_2", "cli"),
        (
            "packaging/test_install.py",
            "test_db_init_from_elsewhere_lands_in_the_xdg_state_folder_not_the_checkout",
            "cli",
        ),
        ("cli/test_version.py", "test_version_prints_package_collection_rules_and_model_versions", "cli"),
    ],
)
def test_the_suites_slow_tests_are_out_of_test_fast(path, test, tier):
    module = TESTS / path
    node = next(
        n for n in ast.parse(module.read_text(encoding="utf-8")).body if getattr(n, "name", "") == test
    )
    assert tier in tiers_of(module, test, [a.arg for a in node.args.args])


def test_the_tmpfs_tests_are_external():
    module = next(TESTS.rglob("test_writers_survive.py"))
    tree = ast.parse(module.read_text(encoding="utf-8"))
    mounts = ("tmpfs(", "read_only(")
    tests = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
        and n.name.startswith("test_")
        and any(m in ast.unparse(n) for m in mounts)
    ]
    assert tests
    for node in tests:
        assert "external" in tiers_of(module, node.name, [a.arg for a in node.args.args]), node.name
