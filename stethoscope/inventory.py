"""What the diagnosis runner needs from an Ansible inventory: the hosts (the only names a command may
receive), each host's slurm_name/rack/switch, and the `stethoscope_*` settings of the `all` group
(webhook, ticket and breaker settings, template variables). Values are read as written, not templated."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.paths import project_root

# an inventory hostname as Slurm and a shell would accept it; anything else never reaches a command
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


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
        return (
            host if host is not None and NODE_NAME.match(name) and NODE_NAME.match(host.slurm_name) else None
        )


def default_inventory() -> Path:
    return project_root() / "inventories" / "lab" / "hosts.yml"


def load_inventory(path: str | Path | None = None) -> Inventory:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    path = Path(path) if path else default_inventory()
    if not path.exists():
        raise InventoryError(f"inventory {path}: no such file")
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=manager)
    hosts: dict[str, Host] = {}
    settings: dict[str, Any] = {}
    for host in manager.get_hosts():
        host_vars = variables.get_vars(host=host, include_hostvars=False)
        hosts[host.name] = Host(
            host.name,
            str(host_vars.get("slurm_name") or host.name),
            str(host_vars.get("rack") or ""),
            str(host_vars.get("switch") or ""),
            sorted(g.name for g in host.get_groups() if g.name not in ("all", "ungrouped")),
        )
        if not settings:
            settings = {k: v for k, v in host_vars.items() if k.startswith("stethoscope_")}
    if not hosts:
        raise InventoryError(f"inventory {path}: no hosts")
    return Inventory(path.resolve(), hosts, settings)
