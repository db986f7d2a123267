"""`stethoscope diagnose` and `watch` (`verify`: cli/verify.py)."""

from __future__ import annotations

import argparse
import contextlib
import time
import traceback
from pathlib import Path
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.cli.common import (
    FRESH_HELP,
    Subcommands,
    catalog_for,
    checked_rules,
    execution_options,
    fleet_of,
    hosts_of,
    inventory_named,
    inventory_of,
    model_of,
    model_options,
    model_path_of,
    say,
    spool_dir_of,
)
from stethoscope.cli.exit_codes import EXIT_FAILED, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from stethoscope.diagnosis.findings import RULE_FAILED
from stethoscope.diagnosis.job_watch import JobSettingError, JobWatch
from stethoscope.diagnosis.levels import SEVERITY_ORDER
from stethoscope.diagnosis.model_findings import ModelUse
from stethoscope.diagnosis.ruleset import RuleSet
from stethoscope.inventory import Inventory
from stethoscope.paths import rules_dir
from stethoscope.remediation.cycle import CycleResult, Cycles, render_result, worst
from stethoscope.remediation.lock import LockHeld
from stethoscope.store.dsn import redact
from stethoscope.timeutil import duration_option, iso, now_ms, to_ms


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    diagnose = commands.add_parser(
        "diagnose", help="evaluate the rules over ClickHouse (dry-run)", parents=parents
    )
    diagnose.add_argument("--at", help="evaluation time, ISO-8601 or epoch seconds (default now)")
    diagnose.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    diagnose.add_argument("--json", action="store_true", help="print the findings as JSON")
    diagnose.add_argument(
        "--fail-on",
        default="critical",
        choices=["info", "warning", "critical"],
        help="exit 1 when a finding is at or above this severity (default critical)",
    )
    diagnose.add_argument(
        "--plan",
        action="store_true",
        help="say per incident what --execute would do now (drain, ticket, refused...); acts on nothing",
    )
    diagnose.add_argument("--fresh", action="store_true", help=FRESH_HELP)
    execution_options(diagnose)
    model_options(diagnose)
    diagnose.set_defaults(func=diagnose_command)

    watch = commands.add_parser(
        "watch", help="diagnose periodically, re-reading changed rule files", parents=parents
    )
    watch.add_argument(
        "--interval", type=duration_option, default=60.0, help="between cycles: 90s, 5m... (default 60 s)"
    )
    watch.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    watch.add_argument("--json", action="store_true", help="print the findings as JSON")
    watch.add_argument(
        "--cycles", type=int, default=0, help="stop after N cycles (default: run until stopped)"
    )
    execution_options(watch)
    model_options(watch)
    watch.set_defaults(func=watch_command)


def _overrides(pairs: list[str]) -> dict[str, Any] | None:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            say(f"-e {pair!r}: expected KEY=VALUE")
            return None
        overrides[key.strip()] = value
    return overrides


def jobs_of(inventory: Inventory | None, command: str, extra_vars: list[str] | None = None) -> JobWatch:
    """The job settings (the job-level rules' warm-up) of the inventory, `-e KEY=VALUE` winning; one out
    of range exits 2 naming it."""
    overrides = _overrides(extra_vars or [])
    if overrides is None:
        raise SystemExit(EXIT_USAGE)
    settings = {**(inventory.settings if inventory is not None else {}), **overrides}
    try:
        return JobWatch.of(settings)
    except JobSettingError as exc:
        where = f"inventory {inventory.path}" if inventory is not None else "-e"
        say(f"{command}: {where}: {exc}")
        raise SystemExit(EXIT_USAGE) from None


def executor_factory(args: argparse.Namespace, inventory: Inventory | None):
    """None for a dry-run; else a function (dsn, database) -> execution Context. Errors exit 2."""
    if not args.execute or inventory is None:
        return None
    return execution_context(args, inventory)


def execution_context(args: argparse.Namespace, inventory: Inventory):
    """A function (dsn, database) -> execution Context, its settings checked (exit 2 naming a bad
    one); each action's line is printed to stderr from now on."""
    from stethoscope.remediation.action_events import print_actions
    from stethoscope.remediation.executor import Context, Settings
    from stethoscope.store.dsn import ConfigError

    overrides = _overrides(args.extra_var)
    if overrides is None:
        raise SystemExit(EXIT_USAGE)
    spool_dir = spool_dir_of(args)
    try:  # a bad setting stops the command now, not every cycle of a long-running one
        Settings.of(Context(args.dsn or "", args.database, inventory, overrides, spool_dir=spool_dir))
    except ConfigError as exc:
        say(f"{args.command}: {exc}")
        raise SystemExit(EXIT_USAGE) from None
    print_actions(getattr(args, "log_format", None) or "text")  # one line per action, to stderr
    return lambda dsn, database: Context(dsn, database, inventory, overrides, spool_dir=spool_dir)


def diagnose_command(args: argparse.Namespace) -> int:
    served = served_as_loaded(args, args.rules)
    if served is not None:
        return _said(args, served[0])
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    loaded = checked_rules(args.rules, catalog, "diagnose")
    model = model_of(args, inventory, "diagnose")
    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        say(f"diagnose: --at {args.at!r} is neither ISO-8601 nor epoch seconds")
        return EXIT_USAGE
    if getattr(args, "plan", False):
        return _plan(args, inventory, catalog, loaded.rules, model, at_ms)
    result = None if args.at or args.execute else serves_evaluation(args, inventory, loaded.rules, model)
    if result is None:
        cycles = cycles_of(args, inventory, catalog, model)
        try:
            result = cycles.run(loaded.rules, at_ms)
        except LockHeld as exc:
            say(f"diagnose: {exc}; nothing done")
            return EXIT_FAILED
    return _said(args, result)


def _said(args: argparse.Namespace, result: CycleResult) -> int:
    """Print a diagnosis; its exit code."""
    say_cycle(result, args.json)
    if result.every_rule_failed:  # one rule failing is a finding; all of them, a failed run
        first = next(f for f in result.findings if f["rule_id"] == RULE_FAILED)
        say(f"diagnose: every rule failed ({result.rules}); the first: {first['message']}")
        return EXIT_FAILED
    model = result.model
    if model is not None and model.error:  # the rules' findings are printed; the diagnosis is not whole
        say(f"diagnose: model {model.meta.name}: {model.error}")
        return EXIT_FAILED
    return EXIT_FINDINGS if worst(result.findings) >= SEVERITY_ORDER[args.fail_on] else EXIT_OK


def served_as_loaded(
    args: argparse.Namespace, rules: Path | None
) -> tuple[CycleResult, list[str] | None] | None:
    """serve's evaluation of "now" and the nodes it evaluates, taken before this command loads anything:
    its inventory, catalog, rules, model and -e, read as bytes, are those serve loaded
    (remediation.published.sources_digest), so its evaluation is the one this command would make.
    None otherwise: the command loads them and compares what they evaluate (serves_evaluation)."""
    from stethoscope.model.metadata import ModelError, load
    from stethoscope.remediation.published import NAME, result_of, sources_digest
    from stethoscope.store.client import Store

    if args.at or any(getattr(args, option, False) for option in ("fresh", "execute", "plan")):
        return None
    model_path = model_path_of(args)
    extra_vars = getattr(args, "extra_var", None) or []
    store = Store(args.dsn, args.database)
    digest = sources_digest(
        store.database, inventory_named(args), Path(rules or rules_dir()), model_path, extra_vars
    )
    published = None if digest is None else store.published(NAME)
    if not isinstance(published, dict) or published.get("sources") != digest:
        return None
    model = None
    if model_path is not None:
        said = published.get("model")
        if not isinstance(said, dict) or "level" not in said:
            return None
        try:
            model = ModelUse(load(model_path), str(said["level"]))
        except ModelError:  # a damaged file: loading it says what is wrong
            return None
    result = result_of(published, str(published.get("key")), model, now_ms())
    hosts = published.get("hosts")
    if result is None or not (hosts is None or isinstance(hosts, list)):
        return None
    _say_taken(args.command, result, bool(published.get("acting")))
    return result, hosts


def serves_evaluation(
    args: argparse.Namespace, inventory: Inventory | None, rules: list[Any], model: ModelUse | None
) -> CycleResult | None:
    """The evaluation of "now" that the serve holding the store published (remediation.published),
    if it evaluated what this command would and is fresh; None (evaluate here) otherwise or --fresh."""
    from stethoscope.remediation.published import NAME, evaluation_key, result_of
    from stethoscope.store.client import Store

    if getattr(args, "fresh", False):
        return None
    published = Store(args.dsn, args.database).published(NAME)
    if published is None:
        return None
    jobs = jobs_of(inventory, args.command, getattr(args, "extra_var", None))
    settings = inventory.settings if inventory is not None else {}
    key = evaluation_key(rules, hosts_of(inventory), settings, model, jobs)
    result = result_of(published, key, model, now_ms())
    if result is not None:
        _say_taken(args.command, result, bool(published.get("acting")))
    return result


def _say_taken(command: str, result: CycleResult, acting: bool) -> None:
    age = max(0, (now_ms() - result.at_ms) // 1000)
    does = (
        "evaluates and acts every cycle: `incidents` and `actions` say what it did"
        if acting
        else "evaluates every cycle"
    )
    say(
        f"{command}: serve's evaluation of {iso(result.at_ms)} ({age} s ago; serve holds the "
        f"database and {does}); --fresh evaluates now"
    )


def _plan(
    args: argparse.Namespace,
    inventory: Inventory | None,
    catalog: Catalog,
    rules: list[Any],
    model: ModelUse | None,
    at_ms: int,
) -> int:
    """`diagnose --plan`: evaluate as --execute would, then say per incident what it would do now;
    nothing acts, nothing is written, no executor lock is taken (serve may be acting)."""
    import json

    from stethoscope.diagnosis.cadence import Cadence
    from stethoscope.remediation.plan import preview, render_plan
    from stethoscope.store.client import Store

    if args.execute:
        say("diagnose: --plan shows what --execute would do; give one of them")
        return EXIT_USAGE
    if inventory is None:
        inventory_of(args, required=True, command="diagnose --plan")
        return EXIT_USAGE
    context = execution_context(args, inventory)
    cycles = cycles_of(args, inventory, catalog, model)
    cycles.judge_with = context  # silenced and capped as --execute would: its Slurm, its settings
    result = cycles.run(rules, at_ms)
    seen = model.evaluated if model is not None and model.ran else None
    with Store(args.dsn, args.database) as store:
        fitted = Cadence.learn(store, at_ms, hosts_of(inventory)).fit_all(rules)
        entries = preview(store, context(store.dsn, store.database), result.findings, fitted, at_ms, seen)
    print(json.dumps(entries, indent=1, sort_keys=True) if args.json else render_plan(entries), flush=True)
    return EXIT_FINDINGS if worst(result.findings) >= SEVERITY_ORDER[args.fail_on] else EXIT_OK


def cycles_of(
    args: argparse.Namespace,
    inventory: Inventory | None,
    catalog: Catalog,
    model: ModelUse | None,
    long_running: bool = False,
) -> Cycles:
    """The diagnosis cycles a command runs (remediation.cycle), as its options and inventory say."""
    return Cycles(
        args.dsn,
        args.database,
        catalog,
        execute_with=executor_factory(args, inventory),
        nodes=hosts_of(inventory),
        fleet=fleet_of(inventory),
        model=model,
        long_running=long_running,
        jobs=jobs_of(
            inventory, getattr(args, "command", None) or "diagnose", getattr(args, "extra_var", None)
        ),
    )


def say_cycle(result: CycleResult, as_json: bool) -> None:
    if result.standby:
        say(f"{result.standby}; this run does not act")
    print(render_result(result, as_json), flush=True)


def watch_command(args: argparse.Namespace) -> int:
    """Cycles until stopped; a cycle that fails, for whatever reason, is reported in one line (with
    its traceback under --debug), counted, and the next cycle runs."""
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    path = Path(args.rules or rules_dir())
    checked_rules(path, catalog, "watch")  # the first cycle's rules must load; later bad edits are kept out
    rules = RuleSet(path, catalog)
    model = model_of(args, inventory, "watch")
    cycles = cycles_of(args, inventory, catalog, model, long_running=True)
    cycle = failed = 0
    try:
        while True:
            cycle += 1
            try:
                for message in rules.refresh():
                    say(f"watch: {message}")
                if not rules.rules:  # every rule file removed since: never "healthy" over no rules
                    say(f"watch: cycle {cycle}: no rules under {path}; nothing evaluated")
                else:
                    say_cycle(cycles.run(rules.rules, now_ms()), args.json)
            except KeyboardInterrupt:
                raise
            except LockHeld as exc:  # another executor acts on this database: this one never will
                say(f"watch: {exc}; nothing done")
                return EXIT_FAILED
            except Exception as exc:  # the store, a rule, a playbook, the disk: keep watching
                failed += 1
                say(
                    f"watch: cycle {cycle} failed ({failed} so far): {type(exc).__name__}: {redact(str(exc))}"
                )
                if args.debug:
                    traceback.print_exc()
            if args.cycles and cycle >= args.cycles:
                return EXIT_OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        with contextlib.suppress(Exception):  # the store may be the reason it stops
            cycles.close()
