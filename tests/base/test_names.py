"""The one node-name validator (stethoscope/names.py): what reaches `--limit`, scontrol and verify."""

from __future__ import annotations

import ast
import re

import pytest
import yaml

from stethoscope.names import NODE_NAME, is_node_name

from conftest import TOP


def _inventory_names(path):
    names, stack = [], [yaml.safe_load(path.read_text())["all"]]
    while stack:
        group = stack.pop() or {}
        for host, host_vars in (group.get("hosts") or {}).items():
            names += [host, *([host_vars["slurm_name"]] if host_vars and "slurm_name" in host_vars else [])]
        stack += list((group.get("children") or {}).values())
    return names


@pytest.mark.parametrize(
    "name",
    ["node;rm -rf /", "-oProxyCommand=sh", "-oProxyCommand", "node01\n", "node 01", "node[01-08]", "node*",
     "$(reboot)", "", "../node01", "a" * 254, "node01,node02"],
)  # fmt: skip
def test_a_name_that_could_be_an_option_or_a_command_is_refused(name):
    assert not is_node_name(name)


@pytest.mark.parametrize("inventory", ["lab", "example"])
def test_every_shipped_inventory_name_is_accepted(inventory):
    names = _inventory_names(TOP / "inventories" / inventory / "hosts.yml")
    assert names and all(is_node_name(n) for n in names), names


def test_the_inventory_refuses_a_host_the_validator_refuses(tmp_path):
    from stethoscope.inventory import load_inventory

    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    node01: {slurm_name: '-oProxyCommand=sh'}\n    node02: {}\n")
    inventory = load_inventory(path)
    assert inventory.host("node01") is None and inventory.host("node02") is not None
    assert inventory.host("node03") is None  # not a host of the inventory


def test_slurm_node_module_carries_the_same_pattern():
    """The module cannot import the controller: its copy of the rule must not drift."""
    tree = ast.parse((TOP / "plugins/modules/slurm_node.py").read_text())
    (pattern,) = [
        node.value.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "NAME"
    ]
    assert pattern == NODE_NAME.pattern


def test_the_drain_roles_preflight_carries_the_same_pattern():
    """The slurm_drain role checks the name before any task runs: the same rule, not a third one."""
    text = (TOP / "roles/slurm_drain/tasks/main.yml").read_text()
    (pattern,) = re.findall(r"slurm_drain_node_name is match\('(\^[^']+\$)'\)", text)
    assert pattern == NODE_NAME.pattern
