"""Installed like a real tool (README "Deploy on a real cluster"): the wheel carries the rules, the
model, the collection (plugins, roles, playbooks, metadata) and the report templates; installed into a
fresh venv outside the checkout it finds them and keeps its state under STETHOSCOPE_HOME, never in
the checkout; ansible-runner runs the shipped collect.yml with the shipped collection and callback;
the callback without the package warns once, naming it; the controller reads Slurm with the
collection's own parser without touching sys.path."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import stethoscope
from stethoscope import paths

from conftest import REAL, TOP

BIN = Path(sys.executable).parent
WHEEL_DATA = "stethoscope/shipped/"
COLLECTION = "ansible_collections/aicluster/stethoscope/"
# what the wheel must hold under stethoscope/shipped/, and the checkout folder it comes from
SHIPPED = {
    "rules/": TOP / "rules",
    COLLECTION + "plugins/": TOP / "plugins",
    COLLECTION + "roles/": TOP / "roles",
    COLLECTION + "playbooks/": TOP / "playbooks",
    COLLECTION + "meta/": TOP / "collections/stethoscope/meta",
}
# what the build reads: the package and the folders its links point at
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "stethoscope",
    "rules",
    "plugins",
    "roles",
    "playbooks",
    "collections",
    "stethoscope_training",  # beside the package in the checkout, never in its wheel
)
# the training distribution: its project folder and the top-level package it links to
TRAINING_SOURCES = ("training", "stethoscope_training", "LICENSE")
WHERE = """
import json, stethoscope, stethoscope.paths as p
found = [stethoscope.__file__, p.rules_dir(), p.models_dir(), p.playbooks_dir(), p.collection_dir()]
print(json.dumps([str(f) for f in found]))
"""
IMPORT_ALL = """
import importlib, pkgutil, stethoscope
for module in pkgutil.walk_packages(stethoscope.__path__, "stethoscope."):
    if not module.name.startswith("stethoscope.shipped") and not module.name.endswith("__main__"):
        importlib.import_module(module.name)
"""


def _files(root: Path) -> set[str]:
    """Regular files under root (links followed), as the wheel names them; no byte code."""
    found = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if "__pycache__" in relative.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        found.add(relative.as_posix())
    # rglob does not enter linked folders: walk them too
    for path in root.rglob("*"):
        if path.is_symlink() and path.is_dir():
            found |= {f"{path.relative_to(root).as_posix()}/{name}" for name in _files(path)}
    return found


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600, **kwargs)


def _copy_sources(names: tuple[str, ...], into: Path) -> None:
    """The named files and folders of the checkout, links kept as links, no byte code or egg-info."""
    into.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in names:
        if (TOP / name).is_dir():
            shutil.copytree(TOP / name, into / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(TOP / name, into / name)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout's sources (links kept as links), so that no stale
    build/ of the checkout leaks into it."""
    top = tmp_path_factory.mktemp("wheel")
    source = top / "src"
    _copy_sources(SOURCES, source)
    pip = [str(BIN / "pip"), "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    built = _run([*pip, "-w", str(top / "dist"), str(source)])
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = (top / "dist").glob("aicluster_stethoscope-*.whl")
    return found


@pytest.fixture(scope="module")
def training_wheel(tmp_path_factory) -> Path:
    """The training distribution's wheel, built from a copy of its sources as the runtime's is."""
    top = tmp_path_factory.mktemp("training-wheel")
    _copy_sources(TRAINING_SOURCES, top / "src")
    pip = [str(BIN / "pip"), "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    built = _run([*pip, "-w", str(top / "dist"), str(top / "src/training")])
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = (top / "dist").glob("aicluster_stethoscope_training-*.whl")
    return found


def _venv(where: Path) -> Path:
    """A fresh venv whose dependencies are those of this one (a .pth naming its site-packages), but
    not its editable stethoscope: that .pth file is not processed in a folder a .pth adds."""
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(where)])
    assert made.returncode == 0, made.stderr
    python = where / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    (Path(site) / "checkout-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    """No stethoscope or Ansible setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STETHOSCOPE_", "ANSIBLE_"))}
    return {**env, **extra}


def _isolated_env(**extra: str) -> dict[str, str]:
    """As _clean_env, for a fresh venv: nothing of the checkout on its path."""
    env = _clean_env(**extra)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The python of a fresh venv with the wheel installed (its console script stethoscope beside)."""
    python = _venv(tmp_path_factory.mktemp("installed") / "venv")
    done = _run(
        [str(BIN / "pip"), "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        env=_isolated_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # what pip would have written for ansible-core's console script, had it installed the dependencies
    script = python.parent / "ansible-playbook"
    script.write_text(f"#!{python}\nimport sys\nfrom ansible.cli.playbook import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return python


def test_wheel_ships_rules_models_collection_and_templates(wheel):
    with zipfile.ZipFile(wheel) as archive:
        infos = archive.infolist()
    names = {info.filename for info in infos}
    assert not [i.filename for i in infos if stat.S_ISLNK(i.external_attr >> 16)], "links in the wheel"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    for prefix, folder in SHIPPED.items():
        inside = {n.removeprefix(WHEEL_DATA + prefix) for n in names if n.startswith(WHEEL_DATA + prefix)}
        assert inside == _files(folder), f"{prefix}: the wheel differs from {folder}"
    must = [
        "rules/metrics.yml",
        "rules/telemetry.yml",
        "rules/models/core12.json",
        "rules/models/core12.onnx",
        "rules/models/core12.outlier.onnx",
        "ansible.cfg",
        *(
            COLLECTION + n
            for n in ("galaxy.yml", "README.md", "LICENSE", "requirements.txt", "meta/runtime.yml")
        ),
        COLLECTION + "playbooks/collect.yml",
        COLLECTION + "playbooks/remediate/drain.yml",
        COLLECTION + "plugins/callback/clickhouse.py",
        COLLECTION + "plugins/module_utils/slurm.py",
        COLLECTION + "roles/push_agent/files/agent.py",  # a link in the checkout, a file in the wheel
    ]
    assert [n for n in must if WHEEL_DATA + n not in names] == []
    templates = {p.name for p in (TOP / "stethoscope/report/templates").glob("*.j2")}
    assert templates and {f"stethoscope/report/templates/{t}" for t in templates} <= names
    schemas = {p.name for p in (TOP / "stethoscope/schemas").glob("*.json")}
    assert schemas and {f"stethoscope/schemas/{s}" for s in schemas} <= names
    # a link in the checkout to the node-side code: the wheel holds the file's own content
    linked = TOP / "stethoscope/telemetry/sysfs_devices.py"
    assert linked.is_symlink()
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("stethoscope/telemetry/sysfs_devices.py") == linked.read_bytes()


def _metadata_headers(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(meta).decode().split("\n\n")[0].splitlines()


def _required_distributions(headers: list[str]) -> set[str]:
    """The distribution names of the Requires-Dist headers, versions, extras and markers left out."""
    return {
        re.split(r"[<>=!~;\[ ]", h.removeprefix("Requires-Dist: "))[0]
        for h in headers
        if h.startswith("Requires-Dist: ")
    }


def test_runtime_wheel_holds_no_training_code(wheel):
    """Training (torch, the generators) is a distribution of its own: the runtime's wheel, built from
    sources that hold stethoscope_training beside stethoscope, leaves it out, and torch with it."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert [n for n in names if n.startswith("stethoscope_training/")] == []
    headers = _metadata_headers(wheel)
    assert not {"torch", "onnx"} & _required_distributions(headers)
    assert "Provides-Extra: train" not in headers


def test_training_wheel_holds_the_training_package_and_requires_the_runtime(training_wheel):
    with zipfile.ZipFile(training_wheel) as archive:
        names = set(archive.namelist())
    modules = {f"stethoscope_training/{f}" for f in _files(TOP / "stethoscope_training") if f.endswith(".py")}
    assert modules and modules <= names
    assert not [n for n in names if n.startswith("stethoscope/")]
    headers = _metadata_headers(training_wheel)
    assert "Name: aicluster-stethoscope-training" in headers
    assert f"Version: {stethoscope.__version__}" in headers
    wanted = {"aicluster-stethoscope", "torch", "onnx", "numpy", "onnxruntime"}
    assert wanted <= _required_distributions(headers)
    checked = _run([str(BIN / "twine"), "check", "--strict", str(training_wheel)])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_training_distribution_pins_the_runtime_it_is_released_with():
    # stethoscope_training imports the runtime's internals (features, metadata, store), which change
    # between releases: any other runtime version than its own may break it
    project = tomllib.loads((TOP / "training/pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = [d for d in project["dependencies"] if re.match(r"aicluster-stethoscope\s*[<>=!~]", d)]
    assert runtime == [f"aicluster-stethoscope=={stethoscope.__version__}"]


@pytest.mark.parametrize("command", [["train"], ["evaluate"], ["finetune", "--from-faults"]])
def test_model_training_commands_without_the_training_distribution_name_it(installed, tmp_path, command):
    """The runtime alone (the wheel, no training distribution): exit 2 and the line that says what to
    install, no traceback."""
    env = _isolated_env(STETHOSCOPE_HOME=str(tmp_path / "home"))
    ran = _run([str(installed.parent / "stethoscope"), "model", *command], cwd=tmp_path, env=env)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "pip install aicluster-stethoscope-training" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_wheel_metadata_passes_twine_and_names_the_distribution_everywhere(wheel):
    """What the package index checks (readme, licence, URLs), under the distribution's own name, which
    the collection's requirements.txt (ansible-builder's input) asks for."""
    checked = _run([str(BIN / "twine"), "check", "--strict", str(wheel)])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(meta).decode().split("\n\n")[0].splitlines()
    assert meta.replace("METADATA", "licenses/LICENSE") in names
    assert "Name: aicluster-stethoscope" in headers and "License-Expression: Apache-2.0" in headers
    assert "Description-Content-Type: text/markdown" in headers
    assert {h.split(",")[0] for h in headers if h.startswith("Project-URL: ")} >= {
        f"Project-URL: {k}" for k in ("Homepage", "Repository", "Issues", "Documentation")
    }
    wanted = (TOP / "collections/stethoscope/requirements.txt").read_text().splitlines()
    required = [line for line in wanted if line and not line.startswith("#")]
    assert required == [f"aicluster-stethoscope>={stethoscope.__version__}"]  # the collection's own release


def test_installed_cli_finds_the_shipped_rules_and_model_and_keeps_state_under_home(installed, tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    env = _isolated_env(STETHOSCOPE_HOME=str(home), PATH=f"{installed.parent}{os.pathsep}{os.defpath}")
    where = _run([str(installed), "-c", WHERE], cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    venv = installed.parent.parent.resolve()
    for path in json.loads(where.stdout):
        assert Path(path).resolve().is_relative_to(venv), f"{path} is not the installed package's"
    package, rules, _models, playbooks, _collection = map(Path, json.loads(where.stdout))
    # every module imports from the wheel (the lab's included), none of the checkout's
    imported = _run([str(installed), "-c", IMPORT_ALL], cwd=work, env=env)
    assert imported.returncode == 0, imported.stderr[-3000:]

    stethoscope = str(installed.parent / "stethoscope")
    init = _run([stethoscope, "db", "init"], cwd=work, env=env)
    assert init.returncode == 0, init.stderr
    assert (home / ".stethoscope/db").is_dir() and str(home / ".stethoscope/db") in init.stdout
    assert not (work / ".stethoscope").exists()

    checked = _run([stethoscope, "rules", "check", str(rules)], cwd=work, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    in_checkout = _run([str(BIN / "stethoscope"), "rules", "check", str(TOP / "rules")], cwd=TOP)
    assert checked.stdout == in_checkout.stdout  # the same rules, all of them
    count = int(checked.stdout.split()[0])
    diagnosed = _run([stethoscope, "diagnose", "--no-model"], cwd=work, env=env)
    assert diagnosed.returncode in (0, 1), diagnosed.stderr  # 1: findings (UNKNOWN of an empty store)
    assert f"{count} rules" in diagnosed.stdout.splitlines()[0]
    info = _run([stethoscope, "model", "info"], cwd=work, env=env)
    assert info.returncode == 0, info.stderr
    assert f"model core12 ({rules / 'models/core12.json'})" in info.stdout
    assert (playbooks / "remediate/drain.yml").is_file() and package.parent == rules.parents[1]


def test_installed_runner_runs_the_shipped_collect_playbook_and_its_callback_stores_rows(installed, tmp_path):
    """What `diagnose --execute` does for a remediation playbook, with collect.yml: ansible-runner, the
    shipped ansible.cfg and collection, the callback writing into STETHOSCOPE_HOME's database."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    env = _isolated_env(STETHOSCOPE_HOME=str(home), PATH=f"{installed.parent}{os.pathsep}{os.defpath}")
    inventory = tmp_path / "hosts.yml"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(installed),
        "health_collect_root": str(REAL / "root"),
        "health_collect_state_dir": str(tmp_path / "node-state"),
        "health_collect_collectors": ["pcie_aer", "tuning"],
        "health_collect_read_kernel_log": False,
    }
    inventory.write_text(json.dumps({"all": {"hosts": {"node01": host}}}))
    assert _run([str(installed.parent / "stethoscope"), "db", "init"], cwd=work, env=env).returncode == 0
    script = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from stethoscope.paths import ansible_cfg
        from stethoscope.remediation.actions.playbook import playbook_path, run_playbook
        from stethoscope.store.client import Store
        result = run_playbook("collect.yml", Path({str(inventory)!r}), "node01", {{}}, {{}}, 300)
        with Store() as store:
            rows = store.query(
                "SELECT count() FROM stethoscope.metrics "
                "WHERE node_id = 'node01' AND metric_name != 'ansible_host_unreachable'"
            )[0][0]
        print(json.dumps({{"ok": result.ok, "status": result.status, "events": result.events, "rows": rows,
                          "playbook": str(playbook_path("collect.yml")), "cfg": str(ansible_cfg())}}))
        """)
    ran = _run([str(installed), "-c", script], cwd=work, env=env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    result = json.loads(ran.stdout.splitlines()[-1])
    assert result["ok"], result
    venv = installed.parent.parent.resolve()
    assert Path(result["playbook"]).is_relative_to(venv) and Path(result["cfg"]).is_relative_to(venv)
    assert result["rows"] > 0  # the wheel's callback stored the sweep under STETHOSCOPE_HOME
    assert not (work / ".stethoscope").exists()


def test_callback_without_the_package_warns_once_naming_it(tmp_path):
    """The collection's callback in a Python that has ansible but not stethoscope: one warning that
    says what to install, no traceback, the play runs."""
    python = _venv(tmp_path / "bare")
    work = tmp_path / "work"
    work.mkdir()
    env = _isolated_env(
        ANSIBLE_CONFIG=str(work / "empty.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(TOP / ".collections"),
        ANSIBLE_CALLBACKS_ENABLED="aicluster.stethoscope.clickhouse",
        ANSIBLE_NOCOLOR="1",
    )
    assert _run([str(python), "-c", "import stethoscope"], cwd=work, env=env).returncode != 0
    playbook = work / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug: {msg: one}\n    - ansible.builtin.debug: {msg: two}\n"
    )
    (work / "empty.cfg").write_text("[defaults]\n")
    command = [str(python), "-m", "ansible", "playbook", "-i", "localhost,", str(playbook)]
    play = _run(command, cwd=work, env=env)
    output = play.stdout + play.stderr
    assert play.returncode == 0, output[-3000:]
    assert "Traceback" not in output
    warnings = [line for line in output.splitlines() if "aicluster.stethoscope.clickhouse" in line]
    assert len(warnings) == 1, output[-3000:]
    assert "'stethoscope' is not installed" in warnings[0]
    assert "pip install aicluster-stethoscope" in warnings[0]


def test_checkout_paths_are_the_top_level_folders():
    assert paths.rules_dir() == TOP / "rules"
    assert paths.models_dir() == TOP / "rules/models"
    assert paths.playbooks_dir() == TOP / "playbooks"
    assert (paths.collection_dir() / "plugins").resolve() == TOP / "plugins"


def test_the_shipped_link_farm_has_the_entries_of_the_collections_link_farm():
    """Two link farms of one collection: .collections/ (tools/link_collection.sh, ansible.cfg) and the
    package's (the wheel): the same entries, pointing at the same files."""
    subprocess.run(["bash", str(TOP / "tools/link_collection.sh")], check=True, capture_output=True)
    farm = TOP / ".collections" / COLLECTION
    shipped = paths.collection_dir()
    assert sorted(p.name for p in shipped.iterdir()) == sorted(p.name for p in farm.iterdir())
    for entry in shipped.iterdir():
        assert entry.is_symlink() and not Path(os.readlink(entry)).is_absolute(), entry
        assert entry.resolve() == (farm / entry.name).resolve(), entry


def test_state_lives_under_home_else_the_checkout_run_from_else_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("STETHOSCOPE_SPOOL_DIR", raising=False)
    checkout = tmp_path / "checkout"
    (checkout / "collections/stethoscope").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))

    monkeypatch.setenv("STETHOSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(checkout)
    assert paths.default_db_path() == tmp_path / "home/.stethoscope/db"

    monkeypatch.delenv("STETHOSCOPE_HOME")
    assert paths.default_db_path() == checkout / ".stethoscope/db"
    assert paths.default_spool_dir() == checkout / ".stethoscope/spool"

    monkeypatch.chdir(elsewhere)  # never the checkout this package lives in
    assert paths.state_dir() == tmp_path / "xdg/stethoscope"
    assert paths.ansible_cfg() == paths.shipped_dir() / "ansible.cfg"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert paths.state_dir() == Path.home() / ".local/state/stethoscope"


def test_db_init_from_elsewhere_lands_in_the_xdg_state_folder_not_the_checkout(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = _clean_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    init = _run([str(BIN / "stethoscope"), "db", "init"], cwd=work, env=env)
    assert init.returncode == 0, init.stderr
    assert f"chdb://{tmp_path / 'xdg/stethoscope/db'}?" in init.stdout
    assert (tmp_path / "xdg/stethoscope/db").is_dir()


def test_slurm_state_reads_scontrol_with_the_collections_parser_and_leaves_sys_path_alone(tmp_path):
    """In a fresh process (no test's sys.path): the parser is the collection's own file."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scontrol = bindir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        "echo 'NodeName=node07 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=2 "
        "Reason=stethoscope: ssd_reallocated_sectors t1 [root@2026-11-30T02:30:25]'\n"
        "echo 'NodeName=node08 Arch=x86_64 State=DOWN ThreadsPerCore=2 Reason=Not responding'\n"
        "echo 'NodeName=node01 Arch=x86_64 State=ALLOCATED ThreadsPerCore=2'\n"
    )
    scontrol.chmod(0o755)
    script = textwrap.dedent("""
        import json, sys
        before = list(sys.path)
        from stethoscope.remediation import slurm_state
        PARSER = "ansible_collections.aicluster.stethoscope.plugins.module_utils.slurm"
        nodes = slurm_state.read_nodes()
        print(json.dumps({
            "nodes": {n: [s.out_of_service, s.reason] for n, s in nodes.items()},
            "sys_path_unchanged": sys.path == before,
            "parser": sys.modules[PARSER].__file__,
        }))
        """)
    env = _clean_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    ran = _run([sys.executable, "-c", script], cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout)
    assert seen["sys_path_unchanged"]
    assert seen["nodes"] == {
        "node07": [True, "stethoscope: ssd_reallocated_sectors t1"],
        "node08": [True, "Not responding"],
        "node01": [False, ""],
    }
    assert Path(seen["parser"]).resolve() == TOP / "plugins/module_utils/slurm.py"
