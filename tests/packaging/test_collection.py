"""Packaging: the Galaxy tarball builds, installs into a temp path, its modules resolve from it and its
callback, with the dependency it declares, stores a real play's rows; role defaults agree with
meta/argument_specs.yml (the linters run in `make lint`, which `make test` runs first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stethoscope.store.client import Store

from conftest import REAL, TOP

BIN = Path(sys.executable).parent


def test_galaxy_tarball_installs_and_resolves_a_module(tmp_path):
    build = subprocess.run(
        ["bash", str(TOP / "tools/build_collection.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        check=False,
    )
    assert build.returncode == 0, build.stderr
    version = yaml.safe_load((TOP / "collections/stethoscope/galaxy.yml").read_text())["version"]
    tarball = TOP / "build" / f"aicluster-stethoscope-{version}.tar.gz"  # a checkout may hold older ones
    target = tmp_path / "collections"
    # neither the project's ansible.cfg nor its link farm: only what the tarball installs
    (tmp_path / "empty.cfg").write_text("[defaults]\n")
    clean = {**os.environ, "ANSIBLE_CONFIG": str(tmp_path / "empty.cfg")}
    clean["ANSIBLE_COLLECTIONS_PATH"] = str(target)
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(target)],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp_path,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    installed = target / "ansible_collections/aicluster/stethoscope"
    assert (installed / "plugins/modules/gpu_facts.py").is_file() and not (installed / "plugins").is_symlink()
    assert (installed / "LICENSE").read_bytes() == (TOP / "LICENSE").read_bytes()  # galaxy.yml: Apache-2.0
    doc = subprocess.run(
        [str(BIN / "ansible-doc"), "aicluster.stethoscope.gpu_facts"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp_path,
        check=False,
    )
    assert doc.returncode == 0, doc.stderr
    assert str(installed) in doc.stdout and "nvidia-smi -q -x" in doc.stdout

    # the callback's controller-side dependency, declared as collections do (ansible-builder reads both)
    assert "stethoscope" in (installed / "requirements.txt").read_text()
    ee = yaml.safe_load((installed / "meta/execution-environment.yml").read_text())
    assert ee["dependencies"]["python"] == "requirements.txt"
    callback = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "callback", "aicluster.stethoscope.clickhouse"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=tmp_path,
        check=False,
    )
    assert callback.returncode == 0, callback.stderr
    assert str(installed / "plugins/callback") in callback.stdout
    assert "requirements.txt" in callback.stdout  # its DOCUMENTATION says what to install

    # a module and the callback of the installed collection in one real play: the rows are stored
    dsn = f"chdb://{tmp_path / 'db'}"
    stored = {**clean, "STETHOSCOPE_DSN": dsn, "STETHOSCOPE_SPOOL_DIR": str(tmp_path / "spool")}
    init = subprocess.run(
        [str(BIN / "stethoscope"), "db", "init"], capture_output=True, text=True, env=stored, check=False
    )
    assert init.returncode == 0, init.stderr
    playbook = tmp_path / "play.yml"
    task = {"root": str(REAL / "root"), "state_dir": str(tmp_path / "state")}
    tasks = [{"aicluster.stethoscope.tuning_facts": task}]
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    playbook.write_text(yaml.safe_dump(play))
    interpreter = f"ansible_python_interpreter={sys.executable}"
    ran = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", interpreter, str(playbook)],
        capture_output=True,
        text=True,
        env={**stored, "ANSIBLE_CALLBACKS_ENABLED": "aicluster.stethoscope.clickhouse"},
        cwd=tmp_path,
        check=False,
    )
    assert ran.returncode == 0 and "WARNING" not in ran.stderr, ran.stdout[-3000:] + ran.stderr[-3000:]
    with Store(dsn) as store:
        rows = store.query(
            "SELECT count() FROM stethoscope.metrics WHERE node_id = 'localhost' "
            "AND metric_name = 'numa_balancing_enabled'"
        )[0][0]
    assert rows > 0


@pytest.mark.parametrize("role", sorted(p.name for p in (TOP / "roles").iterdir() if p.is_dir()))
def test_role_defaults_match_argument_specs(role):
    defaults = yaml.safe_load((TOP / "roles" / role / "defaults/main.yml").read_text()) or {}
    specs = yaml.safe_load((TOP / "roles" / role / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    for name, value in defaults.items():
        assert name.startswith(role + "_")
        assert options[name]["default"] == value, name
        assert "type" in options[name]


MODULES = sorted(p.stem for p in (TOP / "plugins/modules").glob("*.py") if p.stem != "__init__")
ROLES = sorted(p.name for p in (TOP / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize(("kind", "names"), [("module", MODULES), ("role", ROLES)])
def test_ansible_doc_renders_every_module_and_role(kind, names):
    """One call for all of a kind: ansible-doc stops at the first page it cannot render."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(TOP / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(TOP / ".collections")
    command = [str(BIN / "ansible-doc"), "-t", kind, *(f"aicluster.stethoscope.{n}" for n in names)]
    doc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=TOP, check=False)
    assert doc.returncode == 0 and "[ERROR]" not in doc.stderr, doc.stderr
    headers = [line for line in doc.stdout.splitlines() if line.startswith(">")]
    rendered = sorted(h.split()[2].strip("*").removeprefix("aicluster.stethoscope.") for h in headers)
    assert rendered == names
    assert len(doc.stdout.splitlines()) > 10 * len(names)  # each page has its options, not only a title


def test_host_key_checking_stays_ansibles_default():
    """The lab's hosts are local connections; a real inventory must not inherit a disabled check."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(TOP / "ansible.cfg")}
    dump = subprocess.run(
        [str(BIN / "ansible-config"), "dump", "--only-changed"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert dump.returncode == 0 and "CONFIG_FILE" in dump.stdout, dump.stderr
    assert "HOST_KEY_CHECKING" not in dump.stdout
