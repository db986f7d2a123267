"""What the diagnosis runner needs from an Ansible inventory: the hosts (the only names a command may
receive), each host's slurm_name/rack/switch, and the `stethoscope_*` settings of the `all` group
(webhook, ticket and breaker settings, template variables). Values are read as written, not templated."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.bounded_yaml import INVENTORY_FILE_MAX_BYTES, YamlTooLarge, check_bounded
from stethoscope.names import is_node_name
from stethoscope.paths import project_root

# what a command that acts on the cluster says when it is given none: no command defaults to the lab
NO_INVENTORY = (
    "needs an inventory: --inventory INV or STETHOSCOPE_INVENTORY=INV (there is no default: "
    "`make demo` names the lab's, inventories/lab/hosts.yml)"
)


class InventoryError(ValueError):
    pass


@dataclass
class Host:
    name: str
    slurm_name: str
    rack: str = ""
    switch: str = ""
    groups: list[str] = field(default_factory=list)


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host]
    settings: dict[str, Any]

    def host(self, name: str) -> Host | None:
        """The host named `name`, only if it is an inventory host with a valid name."""
        host = self.hosts.get(name)
        valid = host is not None and is_node_name(name) and is_node_name(host.slurm_name)
        return host if valid else None


def default_inventory() -> Path:
    return project_root() / "inventories" / "lab" / "hosts.yml"


def load_inventory(path: str | Path | None = None) -> Inventory:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    path = Path(path) if path else default_inventory()
    if not path.exists():
        raise InventoryError(f"inventory {path}: no such file")
    check_inventory_bounds(path)
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=manager)
    hosts: dict[str, Host] = {}
    for host in manager.get_hosts():
        host_vars = variables.get_vars(host=host, include_hostvars=False)
        name = str(host.name)  # plain text: Ansible's are tagged strings, which no pickle of ours carries
        hosts[name] = Host(
            name,
            str(host_vars.get("slurm_name") or name),
            str(host_vars.get("rack") or ""),
            str(host_vars.get("switch") or ""),
            sorted(str(g.name) for g in host.get_groups() if g.name not in ("all", "ungrouped")),
        )
    if not hosts:
        raise InventoryError(f"inventory {path}: no hosts")
    return Inventory(path.resolve(), hosts, _all_group_settings(loader, manager, path))


def inventory_files(path: Path) -> list[Path]:
    """The files Ansible reads for the inventory source `path`: the file, or every file of the
    folder, and the group_vars and host_vars beside it (hidden ones, a .git, left out as it does)."""
    folder = path if path.is_dir() else path.parent
    found = set(_visible_files(path)) if path.is_dir() else {path}
    for beside in ("group_vars", "host_vars"):
        found.update(_visible_files(folder / beside))
    return sorted(found)


def _visible_files(folder: Path) -> list[Path]:
    return [
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]


def check_inventory_bounds(path: Path) -> None:
    """InventoryError, before Ansible reads a file, when one is past a bound of bounded_yaml (size,
    aliases, expansion, depth): Ansible's own YAML loader has none."""
    for file in inventory_files(path):
        try:
            check_bounded(file, INVENTORY_FILE_MAX_BYTES, "inventory file")
        except YamlTooLarge as exc:
            raise InventoryError(f"inventory {exc.where()}") from None
        except OSError as exc:
            raise InventoryError(f"inventory {file}: {exc.strerror}") from None


# role variables the controller reads too: the agents' period sets UNKNOWN's line for the stream
FLEET_WIDE_ROLE_VARS = ("push_agent_period",)


def _all_group_settings(loader: Any, manager: Any, path: Path) -> dict[str, Any]:
    """The `stethoscope_*` vars (and FLEET_WIDE_ROLE_VARS) of the `all` group: inline in the inventory
    file, then group_vars/all (Ansible's precedence), never one host's own (a host var there would
    speak for the fleet)."""
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources

    group = manager.groups["all"]
    merged = group.get_vars()
    for stage in ("inventory", "task"):  # where the vars plugins run depends on RUN_VARS_PLUGINS
        merged = combine_vars(merged, get_vars_from_inventory_sources(loader, [str(path)], [group], stage))
    return {k: v for k, v in merged.items() if k.startswith("stethoscope_") or k in FLEET_WIDE_ROLE_VARS}
