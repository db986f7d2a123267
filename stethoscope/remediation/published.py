"""serve's latest evaluation, published through its relay (serve/relay.py): `diagnose` and `summary`
run beside serve answer from it at once instead of evaluating every rule again on a machine serve keeps
busy. A command takes it only when it would evaluate what serve evaluates (the same rules, nodes,
inventory settings, model and job settings: `evaluation_key`) at "now", and only while it is fresh (no
older than two of serve's intervals and half a minute); otherwise, or with `--fresh`, it evaluates
itself. It is shown as the command's own dry run shows findings: what serve's actions did is not their
outcome (`incidents` and `actions` say that).

A command given the files and options serve loaded, unchanged (`sources_digest`: its inventory,
catalog, rules and model read as bytes, its code, database and job settings), takes the evaluation
without loading any of them: on a controller serve keeps busy, parsing them (Ansible's inventory, the
rules, onnxruntime's graphs) was most of such a read's time."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stethoscope.diagnosis.findings import printable
from stethoscope.diagnosis.job_watch import JOB_SETTINGS, JobWatch
from stethoscope.diagnosis.model_findings import ModelUse
from stethoscope.diagnosis.rules import Rule
from stethoscope.remediation.cycle import CycleResult

NAME = "evaluation"  # the relay's document name
SCHEMA = 1
KEPT = ("held", "outcome", "silenced", "unread", "nodes")  # besides the printed fields
STALE_INTERVALS, STALE_SLACK_MS = 2, 30_000
# an inventory plugin's configuration (Ansible's auto plugin)
PLUGIN = re.compile(rb"^[\"']?plugin[\"']?\s*:", re.MULTILINE)


@dataclass(frozen=True)
class Identity:
    """What serve's evaluation is of: `key` (evaluation_key); `sources`, the digest of the files and
    options it was loaded from (sources_digest; None where those cannot say it); `hosts`, the nodes it
    evaluates (None: every stored node)."""

    key: str
    sources: str | None = None
    hosts: list[str] | None = None


def evaluation_key(
    rules: Sequence[Rule],
    hosts: Collection[str] | None,
    settings: Mapping[str, Any],
    model: ModelUse | None,
    jobs: JobWatch | None,
    judged: Mapping[str, Any] | None = None,
) -> str:
    """What an evaluation depends on besides the data and the time, as one digest. `judged`: what an
    executor judges by that a dry run does not (stream isolation, Alertmanager's silences), where set."""
    digest = hashlib.sha256(repr(sorted(rules, key=lambda rule: rule.rule_id)).encode())
    scope = {
        "hosts": sorted(hosts) if hosts is not None else None,
        "settings": settings,
        "model": [model.meta.name, model.level] if model is not None else None,
        "jobs": repr(jobs or JobWatch()),
        "judged": dict(judged or {}),
    }
    digest.update(json.dumps(scope, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def sources_digest(
    database: str, inventory: Path | None, rules: Path, model: Path | None, extra_vars: Sequence[str]
) -> str | None:
    """The files and options a command's evaluation is loaded from, read as bytes, parsed not at all."""
    return joined(loaded_once(database, inventory, model, extra_vars), rules_read(rules))


def loaded_once(
    database: str, inventory: Path | None, model: Path | None, extra_vars: Sequence[str]
) -> str | None:
    """What serve loads once, at its start: the database it evaluates, the code (each module's size and
    time), Ansible's settings (ANSIBLE_* and the ansible.cfg it reads), the inventory's files, the
    catalog and the stream's metric sets, the model's files (None: --no-model) and the `-e` an
    evaluation reads (the job settings, and any pair no key or no `=`: refused, exit 2; the executor's,
    such as a ticket URL, change no finding). None where the files cannot say what is loaded: an
    inventory that runs a script, names an inventory plugin (their hosts come from elsewhere) or holds
    a linked folder, or a file that cannot be read."""
    import stethoscope
    from stethoscope.catalog import default_path
    from stethoscope.inventory import inventory_files
    from stethoscope.telemetry.metric_set import default_path as metric_sets_path

    package = Path(stethoscope.__file__).resolve().parent
    digest = hashlib.sha256(f"{database} {stethoscope.__version__} {package}".encode())
    try:  # an upgrade under way: no digest
        code = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(package.rglob("*.py"))]
    except OSError:
        return None
    digest.update(repr(code).encode())
    digest.update(repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_"))).encode())
    read = [pair for pair in extra_vars if pair.partition("=")[0].strip() in ("", *JOB_SETTINGS)]
    digest.update(json.dumps(read).encode())
    files, found = [default_path(), metric_sets_path(), *_ansible_config()], []
    if inventory is not None:
        if not inventory.exists() or _linked_folder(inventory):
            return None
        found = inventory_files(inventory)
        if any(os.access(path, os.X_OK) for path in found):
            return None
    if model is not None:
        files.append(model)
        try:  # its graphs beside it: named and stamped, not read (tens of megabytes)
            metadata = model.resolve()
            beside = sorted(p for p in metadata.parent.iterdir() if p.is_file() and p != metadata)
            digest.update(repr([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in beside]).encode())
        except OSError:
            return None
    else:
        digest.update(b"no model")
    return _of_files(digest, [*files, *found], plugins_in=set(found))


def rules_read(rules: Path) -> str | None:
    """What serve re-reads every cycle: the rule files under `rules`."""
    from stethoscope.bounded_yaml import is_stdin
    from stethoscope.diagnosis.rules import rule_files

    if is_stdin(rules) or not rules.exists():
        return None
    return _of_files(hashlib.sha256(b"rules"), rule_files(rules))


def joined(*parts: str | None) -> str | None:
    """One digest of several, None where one is."""
    if any(part is None for part in parts):
        return None
    return hashlib.sha256(" ".join(str(part) for part in parts).encode()).hexdigest()


def _ansible_config() -> list[Path]:
    """The ansible.cfg Ansible reads here: $ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc's."""
    named = os.environ.get("ANSIBLE_CONFIG")
    candidates = [Path(named)] if named else []
    candidates += [Path("ansible.cfg"), Path.home() / ".ansible.cfg", Path("/etc/ansible/ansible.cfg")]
    return next(([path] for path in candidates if path.is_file()), [])


def _linked_folder(inventory: Path) -> bool:
    """Whether the inventory's folders hold a linked folder (Ansible follows it, the digest would not)."""
    folder = inventory if inventory.is_dir() else inventory.parent
    roots = [folder / "group_vars", folder / "host_vars"] + ([inventory] if inventory.is_dir() else [])
    for root in roots:
        for top, folders, _files in os.walk(root):
            if any((Path(top) / name).is_symlink() for name in folders):
                return True
    return False


def _of_files(digest: Any, files: Iterable[Path], plugins_in: Collection[Path] = ()) -> str | None:
    """`digest` over each file's path and bytes; None where one cannot be read, or one of `plugins_in`
    configures an inventory plugin."""
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if path in plugins_in and path.suffix in (".yml", ".yaml") and PLUGIN.search(data):
            return None
        digest.update(f"{path.resolve()} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


def document(result: CycleResult, identity: Identity, interval_seconds: float) -> dict[str, Any]:
    """A cycle's result as serve publishes it (JSON)."""
    model = result.model
    return {
        "schema": SCHEMA,
        "key": identity.key,
        "sources": identity.sources,
        "hosts": identity.hosts,
        "at_ms": result.at_ms,
        "interval_seconds": interval_seconds,
        "acting": result.executing,  # said beside it: this dry run's findings are those serve acts on
        "rules": result.rules,
        "findings": [printable(f, KEPT) for f in result.findings],
        "failed_rules": result.failed_rules,
        "unread_rules": result.unread_rules,
        "model": None
        if model is None
        else {"error": model.error, "ran": model.ran, "unjudged": model.unjudged, "level": model.level},
    }


def result_of(published: Any, key: str, model: ModelUse | None, now_ms: int) -> CycleResult | None:
    """The dry-run result a command given `key` would print, from serve's published evaluation; None
    when there is none, it evaluated something else, or it is stale. `model` takes its state."""
    if not isinstance(published, dict) or published.get("schema") != SCHEMA or published.get("key") != key:
        return None
    try:
        at_ms, interval = int(published["at_ms"]), float(published["interval_seconds"])
        findings = [_as_dry_run(f) for f in published["findings"]]
        rules, failed, unread = int(published["rules"]), published["failed_rules"], published["unread_rules"]
        said = published["model"]
    except (KeyError, TypeError, ValueError):
        return None
    stale = now_ms - at_ms > STALE_INTERVALS * interval * 1000 + STALE_SLACK_MS
    if stale or (model is None) != (said is None):
        return None
    if model is not None:
        model.error, model.ran, model.unjudged = str(said["error"]), bool(said["ran"]), dict(said["unjudged"])
    return CycleResult(at_ms, findings, rules, False, model=model, failed_rules=failed, unread_rules=unread)


def _as_dry_run(finding: dict[str, Any]) -> dict[str, Any]:
    """A finding as a dry run gives it: a held or silenced one keeps why, the others no action's outcome."""
    shown = dict(finding)
    if not shown.get("held") and not shown.get("silenced"):
        shown.pop("outcome", None)
    shown.setdefault("nodes", [])
    return shown
