"""Who may send: the inventory's `stethoscope_node_key` per host, and each node's key derived from the
cluster secret (HMAC(secret, node_id)). The previous secret stays accepted during a rotation window."""

from __future__ import annotations

import os
import secrets as token
import sys
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.bounded_yaml import is_stdin
from stethoscope.inventory import default_inventory
from stethoscope.names import is_node_name
from stethoscope.paths import state_dir
from stethoscope.store.dsn import ConfigError
from stethoscope.telemetry import wire

SECRET_MAX_BYTES = 4096


class KeyringError(ConfigError):
    """A stream setting that cannot be used (exit 2)."""


@dataclass
class Keyring:
    nodes: dict[int, str]  # node key -> node_id
    secrets: list[bytes]  # current first, then the previous one during a rotation
    _keys: dict[int, list[bytes]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.secrets:
            raise KeyringError("no cluster secret: the stream cannot be authenticated")
        self._keys = {
            key: [wire.node_secret(secret, node) for secret in self.secrets]
            for key, node in self.nodes.items()
        }

    def keys_of(self, node_key: int) -> list[bytes] | None:
        return self._keys.get(node_key)

    def node_of(self, node_key: int) -> str:
        return self.nodes[node_key]

    def key_for(self, node_id: str) -> tuple[int, bytes]:
        """What a node's agent holds: its key number and its own derived key (current secret)."""
        for number, node in self.nodes.items():
            if node == node_id:
                return number, wire.node_secret(self.secrets[0], node)
        raise KeyringError(f"{node_id}: no stethoscope_node_key in the inventory")


def node_keys(host_vars: dict[str, dict], source: str) -> dict[int, str]:
    """node key -> host from each host's variables; a duplicate or an invalid key is refused."""
    keys: dict[int, str] = {}
    for host in sorted(host_vars):
        value = host_vars[host].get("stethoscope_node_key")
        if value is None:
            continue  # a host that does not stream
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**16:
            raise KeyringError(
                f"{source}: {host}: stethoscope_node_key must be an integer 0..65535, not {value!r}"
            )
        if not is_node_name(host):
            raise KeyringError(f"{source}: {host}: not a valid node name")
        if value in keys:
            raise KeyringError(
                f"{source}: stethoscope_node_key {value} is given to both {keys[value]} and {host}"
            )
        keys[value] = host
    return keys


def keys_from_inventory(path: str | Path | None = None) -> dict[int, str]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    path = Path(path) if path else default_inventory()
    if not path.exists():
        raise KeyringError(f"inventory {path}: no such file")
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=manager)
    host_vars = {
        host.name: variables.get_vars(host=host, include_hostvars=False) for host in manager.get_hosts()
    }
    return node_keys(host_vars, str(path))


def default_secret_path() -> Path:
    return state_dir() / "telemetry" / "cluster.secret"


def read_secret(path: str | Path, create: bool = False) -> bytes:
    """A secret file's content (stripped). `create` makes a random one, root-only, where none is:
    the lab's; a real cluster's comes from its vault."""
    path = Path(path)
    if is_stdin(path):  # from a vault's client, through a pipe: never on the disk
        # one byte more than allowed: a longer secret is refused, never cut to a different key
        return _checked_secret(sys.stdin.buffer.read(SECRET_MAX_BYTES + 1).strip(), "from standard input")
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token.token_hex(32) + "\n")
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise KeyringError(f"cluster secret {path}: {exc.strerror}") from None
    return _checked_secret(secret, str(path))


def _checked_secret(secret: bytes, where: str) -> bytes:
    if len(secret) < 16:
        raise KeyringError(f"cluster secret {where}: shorter than 16 bytes")
    if len(secret) > SECRET_MAX_BYTES:
        raise KeyringError(f"cluster secret {where}: longer than {SECRET_MAX_BYTES} bytes")
    return secret
