"""The executor's context: where the store is, the inventory, the command line's settings, and where
its state and spool live. The settings are the inventory's, overridden by `-e`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.inventory import Inventory
from stethoscope.paths import default_spool_dir
from stethoscope.paths import state_dir as default_state_dir


@dataclass
class Context:
    dsn: str
    database: str | None
    inventory: Inventory
    overrides: dict[str, Any] = field(default_factory=dict)
    state_dir: Path = field(default_factory=default_state_dir)
    spool_dir: Path = field(default_factory=default_spool_dir)
    # what a cycle reads once and several of its steps use (a context is one cycle's): by name
    read_once: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def setting(self, name: str, default: Any = None) -> Any:
        return self.overrides.get(name, self.inventory.settings.get(name, default))

    @property
    def variables(self) -> dict[str, Any]:
        return {
            **self.inventory.settings,
            **self.inventory.settings.get("stethoscope_diagnose_vars", {}),
            **self.overrides,
        }

    @property
    def slurm_environment(self) -> dict[str, str]:
        """The environment `scontrol` runs in (stethoscope_slurm_environment), as strings."""
        configured = self.setting("stethoscope_slurm_environment") or {}
        return {str(k): str(v) for k, v in dict(configured).items()}

    @property
    def slurm_names(self) -> dict[str, str]:
        """Inventory host -> the name Slurm knows it by."""
        return {name: host.slurm_name for name, host in self.inventory.hosts.items()}
