"""Remediation playbooks through ansible-runner: `--limit` to one validated inventory name, the finding
and its transaction id as extra vars (what came from a node or the store as untrusted data: a vars
file whose every string is tagged `!unsafe`, which Ansible never renders as a template), the
ansible.cfg and the collections path through envvars (ansible-runner does not read them from its own
working dir; `ansible_environment`), and its structured events recorded. The playbook runs in the
current directory, so its callback finds the same state folder as this process (stethoscope.paths);
`playbook_environment` tells it the database and the spool of the process that runs it.

A shipped playbook with nothing to act with (its backend not configured) says so with `set_stats:
{data: {stethoscope_skipped: REASON}}` and ends the host: the run is recorded `skipped`, with the
reason, never `failed` (the stats reach the executor in the runner's playbook_on_stats event)."""

from __future__ import annotations

import configparser
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stethoscope.paths import ansible_cfg, collections_path, playbooks_dir
from stethoscope.priority import niced_path
from stethoscope.store.dsn import is_embedded

RECORDED_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped")
MAX_EVENTS = 200
LOST_EVENTS = ("runner_on_failed", "runner_on_unreachable")
# a host task's result event -> the playbook stats' key it counts under
TALLIED = {
    "runner_on_ok": "ok",
    "runner_on_skipped": "skipped",
    "runner_on_failed": "failures",
    "runner_on_unreachable": "dark",
}
SKIPPED = "stethoscope_skipped"  # the set_stats key of a playbook that had nothing to act with
CALLBACK = "aicluster.stethoscope.clickhouse"  # stores what the run found


@dataclass
class PlaybookResult:
    ok: bool
    status: str
    rc: int | None
    events: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""  # why the playbook did not act (SKIPPED), when it said so


def playbook_path(name: str) -> Path:
    return playbooks_dir() / name


def playbook_environment(dsn: str, database: str | None, spool_dir: str | Path) -> dict[str, str]:
    """What a playbook stethoscope runs (a remediation, serve's sweeps) tells its callback: write into
    `dsn` and `database`, spool into `spool_dir` (the spool the running process replays); and for an
    embedded database, which the running process may hold (serve does, for its whole life), open
    without waiting and write within 2 s: the callback spools at once instead of stalling the play."""
    env = {"STETHOSCOPE_DSN": dsn, "STETHOSCOPE_SPOOL_DIR": str(spool_dir)}
    if database:
        env["STETHOSCOPE_DATABASE"] = database
    if is_embedded(dsn):
        env.update(STETHOSCOPE_OPEN_WAIT="0", STETHOSCOPE_WRITE_TIMEOUT="2")
    return env


def ansible_environment() -> dict[str, str]:
    """ANSIBLE_CONFIG and ANSIBLE_COLLECTIONS_PATH for ansible-runner. The config: the user's where
    ANSIBLE_CONFIG names one that exists (their SSH, become and forks settings), else the checkout's
    or the shipped one. The collections path: the shipped collection first (the playbooks run are
    the shipped ones: their roles and modules must be of the same version), then the user's
    (ANSIBLE_COLLECTIONS_PATH, else their ansible.cfg's collections_path, else Ansible's default).
    Under the user's config, the stethoscope callback is enabled beside theirs: it stores the run."""
    shipped = str(collections_path())
    theirs = _listed(os.environ.get("ANSIBLE_COLLECTIONS_PATH", ""), os.pathsep)
    user = _user_config()
    if user is None:
        return {
            "ANSIBLE_CONFIG": str(ansible_cfg()),
            "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(dict.fromkeys([shipped, *theirs])),
        }
    defaults = _defaults(user)
    theirs = theirs or _collections_of(user, defaults)
    callbacks = _listed(
        os.environ.get("ANSIBLE_CALLBACKS_ENABLED")
        or defaults.get("callbacks_enabled")
        or defaults.get("callback_whitelist", ""),
        ",",
    )
    return {
        "ANSIBLE_CONFIG": os.environ["ANSIBLE_CONFIG"],
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(dict.fromkeys([shipped, *theirs])),
        "ANSIBLE_CALLBACKS_ENABLED": ",".join(dict.fromkeys([*callbacks, CALLBACK])),
    }


def _listed(text: str, separator: str) -> list[str]:
    return [part.strip() for part in text.split(separator) if part.strip()]


def _user_config() -> Path | None:
    """The ansible.cfg the user's ANSIBLE_CONFIG names (a file, or a folder holding ansible.cfg, as
    Ansible reads it), if it exists."""
    named = os.environ.get("ANSIBLE_CONFIG", "")
    if not named:
        return None
    path = Path(os.path.expandvars(named)).expanduser()
    if path.is_dir():
        path = path / "ansible.cfg"
    return path if path.is_file() else None


def _defaults(config: Path) -> dict[str, str]:
    """The [defaults] section of an ansible.cfg ({} where it cannot be read: Ansible says why)."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(config, encoding="utf-8")
        return dict(parser["defaults"]) if parser.has_section("defaults") else {}
    except (configparser.Error, OSError, UnicodeDecodeError):
        return {}


def _collections_of(config: Path, defaults: dict[str, str]) -> list[str]:
    """The collections path an ansible.cfg sets (relative to its folder, as Ansible resolves it), else
    Ansible's default."""
    named = defaults.get("collections_path") or defaults.get("collections_paths") or ""
    if not named.strip():
        home = os.environ.get("ANSIBLE_HOME") or "~/.ansible"
        return [str(Path(home).expanduser() / "collections"), "/usr/share/ansible/collections"]
    paths = []
    for part in _listed(named, os.pathsep):
        path = Path(os.path.expandvars(part)).expanduser()
        paths.append(str(path if path.is_absolute() else (config.parent / path).resolve()))
    return paths


class _Unsafe(yaml.SafeDumper):
    """Every string, keys included, tagged `!unsafe`: Ansible keeps it as text, never a template."""


def _unsafe_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("!unsafe", text, style='"')


_Unsafe.add_representer(str, _unsafe_text)


def untrusted_vars(values: dict[str, Any]) -> str:
    """`values` as a YAML vars file for `-e @file`, every string in it `!unsafe`."""
    return yaml.dump(values, Dumper=_Unsafe, sort_keys=True, allow_unicode=False, width=1 << 20)


def _write_untrusted(private: str, values: dict[str, Any]) -> None:
    """ansible-runner passes `env/extravars` of its private folder as `-e @file`, before the trusted
    extra vars (which win where a name is in both)."""
    folder = Path(private) / "env"
    folder.mkdir(mode=0o700)
    fd = os.open(folder / "extravars", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(untrusted_vars(values))


def run_playbook(
    name: str,
    inventory: Path,
    limit: str | None,
    extravars: dict[str, Any],
    envvars: dict[str, str],
    timeout: int = 1800,
    untrusted: dict[str, Any] | None = None,
    niceness: int = 0,
) -> PlaybookResult:
    """`extravars`: the operator's and stethoscope's own (templated as Ansible templates extra vars);
    `untrusted`: what came from a node or the store, which Ansible must never render; `niceness`:
    ansible-playbook's CPU priority, background work's BACKGROUND_NICENESS (stethoscope.priority)."""
    import ansible_runner
    import pexpect

    top = Path.cwd()
    events: list[dict[str, Any]] = []

    stats: dict[str, Any] = {}
    skipped: list[str] = []
    tally = HostTally()

    def keep(event: dict[str, Any]) -> bool:
        tally.count(event)
        if event.get("event") == "playbook_on_stats":
            data = event.get("event_data") or {}
            stats.update({k: data.get(k) or {} for k in ("ok", "changed", "failures", "skipped", "dark")})
            reason = (data.get("artifact_data") or {}).get(SKIPPED)
            if reason:
                skipped.append(str(reason))
        # a host's failure is kept past the cap (up to MAX_EVENTS of them): on a large run the first
        # MAX_EVENTS events are ok ones, and a failure must still say what its task said
        kept = len(events) < MAX_EVENTS or (
            event.get("event") in LOST_EVENTS and sum(e["event"] in LOST_EVENTS for e in events) < MAX_EVENTS
        )
        if event.get("event") in RECORDED_EVENTS and kept:
            data = event.get("event_data") or {}
            result = data.get("res") or {}
            events.append(
                {
                    "event": event["event"],
                    "host": data.get("host"),
                    "task": data.get("task"),
                    "changed": bool(result.get("changed")),
                    "msg": str(result.get("msg", ""))[:300],
                }
            )
        return True

    env = {
        **ansible_environment(),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        # ansible-playbook of this environment, also when the venv is not activated
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        **envvars,
    }
    with tempfile.TemporaryDirectory(prefix="stethoscope-runner-") as private:
        if untrusted:
            _write_untrusted(private, untrusted)
        if niceness:
            env["PATH"] = niced_path(private, niceness, env["PATH"])
        try:
            runner = ansible_runner.run(
                private_data_dir=private,
                project_dir=str(top),
                playbook=str(playbook_path(name)),
                inventory=str(inventory),
                limit=limit,
                extravars=extravars,
                envvars=env,
                quiet=True,
                timeout=timeout,
                event_handler=keep,
            )
        except pexpect.exceptions.TIMEOUT:
            return outlived_output(events, tally)
    ok = runner.status == "successful" and runner.rc == 0
    return PlaybookResult(ok, runner.status, runner.rc, events, stats, "; ".join(skipped) if ok else "")


class HostTally:
    """Each host's last task result, counted as the playbook stats count hosts: the stats are the
    run's last event, lost when ansible-runner gives up on the run's end. A failure rescued, or a
    host unreachable once that went on, is judged by what came after it; one ignored is no failure."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}
        self.skipped: list[str] = []  # SKIPPED reasons, as set_stats set them in a task's result

    def count(self, event: dict[str, Any]) -> None:
        data = event.get("event_data") or {}
        kind = TALLIED.get(str(event.get("event")))
        if kind is None:
            return
        self.last[str(data.get("host"))] = "ok" if kind == "failures" and data.get("ignore_errors") else kind
        stats = (data.get("res") or {}).get("ansible_stats") or {}
        reason = (stats.get("data") or {}).get(SKIPPED) if isinstance(stats, dict) else None
        if reason:
            self.skipped.append(str(reason))

    def stats(self) -> dict[str, dict[str, int]]:
        keys = ("ok", "changed", "failures", "skipped", "dark")
        return {key: {host: 1 for host, last in self.last.items() if last == key} for key in keys}


def outlived_output(events: list[dict[str, Any]], tally: HostTally) -> PlaybookResult:
    """ansible-runner waits 5 s for its terminal's end once ansible-playbook has exited, then raises
    pexpect's TIMEOUT instead of a result (https://github.com/ansible/ansible-runner/issues/1343): output
    left in the terminal, or a reader starved of CPU on a loaded controller. The run is over, but its
    last event, the stats, is lost with it: each host's last task result, tallied as it came, says
    how it went (no rc is known)."""
    said = "ended, but its output went on after ansible-playbook exited (pexpect TIMEOUT)"
    stats = tally.stats()
    if not tally.last:
        return PlaybookResult(False, f"{said}: no host's result came", None, events, stats)
    ok = not any(stats.get(key) for key in ("failures", "dark"))
    status = f"{said}: judged by each host's last task result ({'successful' if ok else 'failed'})"
    return PlaybookResult(ok, status, None, events, stats, "; ".join(tally.skipped) if ok else "")
