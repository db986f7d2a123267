"""`stethoscope agent`, `collector` and `serve`: the 5-second stream's faces (no logic of their own)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from stethoscope.bounded_yaml import is_stdin
from stethoscope.catalog import SWEEP_INTERVAL
from stethoscope.cli.common import (
    Subcommands,
    catalog_for,
    execute_options,
    hosts_of,
    inventory_named,
    inventory_of,
    model_of,
    model_options,
    model_path_of,
    said_as,
    say,
    spool_dir_of,
)
from stethoscope.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from stethoscope.inventory import NO_INVENTORY, Inventory, default_inventory
from stethoscope.paths import rules_dir, state_dir
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import ConfigError, redact
from stethoscope.store.writer import Writer
from stethoscope.telemetry.keyring import Keyring, default_secret_path, keys_from_inventory, read_secret
from stethoscope.telemetry.metric_set import MetricSet, MetricSetError, load_sets
from stethoscope.timeutil import TIMER_FLOOR_SECONDS, duration_option, positive_seconds

DEFAULT_LISTEN = "127.0.0.1:9975"
DEFAULT_HTTP = "127.0.0.1:9976"
LOG_FORMATS = ("text", "json")  # serve's line per cycle


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    agent = commands.add_parser(
        "agent", help="run the lab's push agents (nodes run the copied agent.py)", parents=parents
    )
    agent.set_defaults(func=run_agent)
    _stream_options(agent)
    agent.add_argument("--collector", default=DEFAULT_LISTEN, help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    agent.add_argument(
        "--period", type=duration_option, help="between samples: 30s, 1m... (default: the metric set's)"
    )
    agent.add_argument(
        "--duration", type=duration_option, help="stop after this long: 90s, 1h... (default: until stopped)"
    )
    agent.add_argument("--node", action="append", default=[], help="only this lab node (repeatable)")
    agent.add_argument("--lab-dir", type=Path, help="the lab (default .lab or $STETHOSCOPE_LAB_DIR)")
    agent.add_argument("--print-config", metavar="NODE", help="print the agent.json for NODE and exit")

    collector = commands.add_parser("collector", help="receive the stream and store it", parents=parents)
    collector.set_defaults(func=run_collector)
    _stream_options(collector)
    _listen_options(collector)
    collector.add_argument(
        "--duration", type=duration_option, help="stop after this long: 90s, 1h... (default: until stopped)"
    )

    serve = commands.add_parser(
        "serve",
        help="the long-running controller: collector, sweeps, diagnosis every interval, HTTP",
        parents=parents,
    )
    serve.set_defaults(func=run_serve)
    _stream_options(serve)
    _listen_options(serve)
    serve.add_argument(
        "--http", default=DEFAULT_HTTP, help=f"HOST:PORT of /healthz /metrics /report ({DEFAULT_HTTP})"
    )
    serve.add_argument(
        "--gate-listen",
        metavar="HOST:PORT",
        help="also answer GET /gate/NODE (and nothing else) there, for the nodes' Slurm gates",
    )
    serve.add_argument(
        "--interval", type=duration_option, default=60.0, help="between diagnosis cycles: 90s, 5m... (60 s)"
    )
    serve.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    serve.add_argument("--cycles", type=int, default=0, help="stop after N cycles (default: until stopped)")
    model_options(serve)
    execute_options(serve)
    serve.add_argument(
        "--sweep-interval",
        type=duration_option,
        help="between sweeps (collect.yml): 90s, 5m... (default the inventory's stethoscope_sweep_interval, "
        f"else {SWEEP_INTERVAL})",
    )
    serve.add_argument(
        "--no-sweep", action="store_true", help="run no sweeps (another scheduler runs collect.yml)"
    )
    serve.add_argument(
        "--log-format", choices=LOG_FORMATS, default="text", help="each cycle's log line: text or json"
    )


def _stream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inventory",
        type=Path,
        help="hosts and their stethoscope_node_key (or $STETHOSCOPE_INVENTORY; the lab's only for agent)",
    )
    parser.add_argument(
        "--secret-file",
        type=Path,
        help="the cluster secret, - for standard input (default the state folder's telemetry/cluster.secret)",
    )
    parser.add_argument(
        "--previous-secret-file", type=Path, help="the secret before a rotation, still accepted"
    )
    parser.add_argument("--metric-sets", type=Path, help="rules/telemetry.yml")


def _listen_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help=f"UDP HOST:PORT (default {DEFAULT_LISTEN})")


def _address(text: str, flag: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{flag} {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _inventory_path(args: argparse.Namespace) -> Path:
    """The inventory of the hosts and keys: --inventory or $STETHOSCOPE_INVENTORY; the lab's only for
    `agent`, which runs the lab's agents. `collector` and `serve` have no default: exit 2."""
    named = inventory_named(args)
    if named is not None:
        return named
    if args.command == "agent":
        return default_inventory()
    raise ConfigError(NO_INVENTORY)


# a keyring no datagram can pass: serve of a cluster whose nodes do not stream (no stethoscope_node_key)
NO_STREAM_SECRET = b"no host streams"


def _stream(args: argparse.Namespace) -> tuple[Keyring, dict[int, MetricSet]]:
    inventory = _inventory_path(args)
    nodes = keys_from_inventory(inventory)
    if not nodes and args.command == "serve":  # sweeps and diagnosis need no stream
        print(
            f"stethoscope: serve: inventory {inventory}: no host has a stethoscope_node_key: the 5-second "
            "stream is off (sweeps and diagnosis run; playbooks/agent.yml starts the agents)",
            file=sys.stderr,
            flush=True,
        )
        return Keyring({}, [NO_STREAM_SECRET]), {s.id: s for s in _sets(args).values()}
    if not nodes:
        raise ConfigError(f"inventory {inventory}: no host has a stethoscope_node_key: nothing can stream")
    lab = inventory.resolve() == default_inventory().resolve()
    if args.previous_secret_file and is_stdin(args.previous_secret_file) and is_stdin(args.secret_file or ""):
        raise ConfigError("--secret-file - and --previous-secret-file -: standard input holds one secret")
    secret_path = args.secret_file or default_secret_path()
    secrets = [read_secret(secret_path, create=lab and args.secret_file is None)]
    if args.previous_secret_file:
        secrets.append(read_secret(args.previous_secret_file))
    return Keyring(nodes, secrets), {s.id: s for s in _sets(args).values()}


def _sets(args: argparse.Namespace) -> dict[str, MetricSet]:
    try:
        return load_sets(args.metric_sets)
    except MetricSetError as exc:
        raise ConfigError(str(exc)) from None


@said_as("agent", (ConfigError,), (StoreError,))
def run_agent(args: argparse.Namespace) -> int:
    return _agent(args, *_stream(args))


@said_as("collector", (ConfigError,), (StoreError,))
def run_collector(args: argparse.Namespace) -> int:
    return _collector(args, *_stream(args))


@said_as("serve", (ConfigError,), (StoreError,))
def run_serve(args: argparse.Namespace) -> int:
    return _serve(args, *_stream(args))


def _agent(args: argparse.Namespace, keyring: Keyring, sets: dict[int, MetricSet]) -> int:
    from stethoscope.telemetry.lab import agent_config, lab_agents, lab_dir, run_agents

    metric_set = next(iter(sets.values()))
    directory = args.lab_dir or lab_dir()
    if args.print_config:
        config = agent_config(args.print_config, keyring, metric_set, args.collector, Path("/"), args.period)
        print(json.dumps({**config, "gpu_source": "auto"}, indent=1, sort_keys=True))
        return EXIT_OK
    _address(args.collector, "--collector")
    agents = lab_agents(keyring, metric_set, args.collector, args.period, args.node or None, directory)
    if not agents:
        print(
            f"stethoscope: agent: no lab node roots under {directory} (run tools/lab.py build)",
            file=sys.stderr,
        )
        return EXIT_USAGE

    def stop_all(*_: object) -> None:
        for agent in agents:
            agent.stop.set()

    signal.signal(signal.SIGTERM, stop_all)
    print(f"{len(agents)} agents sending to {args.collector} every {agents[0].period:g} s", flush=True)
    counters = run_agents(agents, args.duration)
    for agent, counter in zip(agents, counters, strict=True):
        print(f"{agent.config['node_id']}: {counter.line()}")
    return EXIT_OK


def replay_dir() -> Path:
    """Where the collector keeps its replay window across restarts (telemetry.replay_state)."""
    return state_dir() / "telemetry"


def _stop_on_signals(stop: Any) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stop())
    signal.signal(signal.SIGINT, lambda *_: stop())


def _collector(args: argparse.Namespace, keyring: Keyring, sets: dict[int, MetricSet]) -> int:
    import threading

    from stethoscope.telemetry.udp_collector import WRITE_TIMEOUT, Collector

    listen = _address(args.listen, "--listen")
    spool_dir = spool_dir_of(args)
    holder = Store(args.dsn, args.database)
    writer = Writer(holder.dsn, spool_dir, timeout=WRITE_TIMEOUT)
    # bound first: a busy address refuses the start before the database is held
    collector = Collector(keyring, sets, writer.write, listen=listen, state_dir=replay_dir())
    holder.open()  # the embedded database's owner while it runs
    holder.ensure_schema()
    collector.start()
    host, port = collector.address
    print(
        f"collector on udp {host}:{port} for {len(keyring.nodes)} nodes (rcvbuf {collector.rcvbuf})",
        flush=True,
    )
    stop = threading.Event()
    _stop_on_signals(stop.set)
    stop.wait(args.duration)
    collector.stop()
    holder.close()
    stats = collector.stats
    print(
        f"collector stopped: {stats.datagrams} datagrams, {stats.duplicates} duplicates, "
        f"{sum(stats.rejected.values())} rejected {dict(stats.rejected)}, "
        f"{stats.stored} rows stored, {stats.spooled} spooled"
        + (f", {collector.hold.lost} LOST (neither stored nor spooled)" if collector.hold.lost else "")
    )
    return EXIT_FAILED if collector.hold.lost else EXIT_OK


def executor_judgement(cycles: Any, store: Store) -> dict[str, bool]:
    """What serve's executor judges findings by that a dry run does not (published evaluation key)."""
    if cycles.execute_with is None:
        return {}
    context = cycles.execute_with(store.dsn, store.database)
    settings = ("stethoscope_stream_isolation", "stethoscope_alertmanager_url")
    return {name: True for name in settings if context.setting(name, None)}


def _serve(args: argparse.Namespace, keyring: Keyring, sets: dict[int, MetricSet]) -> int:
    from stethoscope.cli.diagnose import cycles_of
    from stethoscope.diagnosis.ruleset import RuleSet
    from stethoscope.remediation.alertmanager import sink_of
    from stethoscope.remediation.lock import LockHeld
    from stethoscope.remediation.published import Identity, evaluation_key, joined, loaded_once, rules_read
    from stethoscope.serve import Server
    from stethoscope.serve.scrape import scraper_of

    # read before they are loaded: an edit meanwhile makes the digest not serve's, never the reverse
    loaded = loaded_once(
        Store(args.dsn, args.database).database, inventory_named(args), model_path_of(args), args.extra_var
    )
    inventory = inventory_of(args, required=True, command="serve")
    assert inventory is not None
    catalog = catalog_for(inventory)
    rules_path = Path(args.rules or rules_dir())
    rules = RuleSet(rules_path, catalog)
    if not rules.rules:
        for message in rules.refresh():
            say(f"serve: {message}")
    if not rules.rules:
        say("serve: no rule loads: refusing to start")
        return EXIT_USAGE

    model = model_of(args, inventory, "serve")
    sources: dict[str, str | None] = {"rules": None}  # the digest of the rules this cycle evaluates

    def current_rules() -> list:
        read = rules_read(rules_path)
        for message in rules.refresh():
            say(f"serve: {message}")
        sources["rules"] = read if rules.as_files else None
        return rules.rules

    store = Store(args.dsn, args.database)
    spool_dir = spool_dir_of(args)
    cycles = cycles_of(args, inventory, catalog, model, long_running=True)
    judged = executor_judgement(cycles, store)
    try:
        cycles.claim()  # --execute: the one executor of this database while serve runs
    except LockHeld as exc:
        say(f"serve: {exc}; not started")
        return EXIT_FAILED
    server = Server(
        store=store,
        spool_dir=spool_dir,
        keyring=keyring,
        sets=sets,
        listen=_address(args.listen, "--listen"),
        http=_address(args.http, "--http"),
        interval=args.interval,
        rules=current_rules,
        catalog=catalog,
        cycles=cycles,
        sweeper=None if args.no_sweep else _sweeper(args, inventory, store, spool_dir),
        log_format=args.log_format,
        replay_dir=replay_dir(),
        gate_http=_address(args.gate_listen, "--gate-listen") if args.gate_listen else None,
        identity=lambda used: Identity(
            evaluation_key(used, hosts_of(inventory), inventory.settings, model, cycles.jobs, judged),
            None if judged else joined(loaded, sources["rules"]),
            hosts_of(inventory),
        ),
        scraper=scraper_of(
            inventory,
            args.sweep_interval or inventory.settings.get("stethoscope_sweep_interval") or SWEEP_INTERVAL,
        ),
        alert_sink=sink_of(
            cycles.execute_with(store.dsn, store.database) if cycles.execute_with else None, args.interval
        ),
    )
    try:
        server.start()
    except BaseException:
        cycles.close()
        raise
    assert server.collector is not None and server.httpd is not None
    udp, http = server.collector.address, server.httpd.server_address[:2]
    sweeps = f", sweeps every {server.sweeper.interval:g} s" if server.sweeper else ", no sweeps"
    if server.gate_httpd is not None:
        gate_at = server.gate_httpd.server_address
        sweeps = f", gate http://{gate_at[0]!s}:{gate_at[1]}/gate/NODE" + sweeps
    try:  # the mode from the first line: executing, standby and why, or dry-run
        mode = cycles.mode(server.store)
    except Exception as exc:  # the first cycle says it again, or why it failed
        mode = f"mode not known yet ({type(exc).__name__}: {redact(str(exc))})"
    print(
        f"serve: udp {udp[0]}:{udp[1]}, http http://{http[0]!s}:{http[1]}/healthz{sweeps}; {mode}",
        flush=True,
    )
    _stop_on_signals(server.stop_event.set)
    started = time.time()
    try:
        server.run(args.cycles)
    finally:
        server.stop()
    stats, lost = server.collector.stats, server.collector.hold.lost
    print(
        f"serve stopped after {time.time() - started:.0f} s: {server.state.cycles} cycles, "
        f"{stats.stored} rows stored, {stats.spooled} spooled"
        + (f", {lost} LOST (neither stored nor spooled)" if lost else "")
    )
    return EXIT_FAILED if lost else EXIT_OK


def _sweeper(args: argparse.Namespace, inventory: Inventory, store: Store, spool_dir: Path) -> Any:
    """collect.yml at the inventory's cadence; its callback writes where serve reads, and spools into
    serve's spool while serve holds the embedded database (a short write timeout: no sweep waits)."""
    from stethoscope.remediation.actions.playbook import playbook_environment
    from stethoscope.serve.sweeps import Sweeper

    given = args.sweep_interval or inventory.settings.get("stethoscope_sweep_interval") or SWEEP_INTERVAL
    try:
        interval = positive_seconds(given, least=TIMER_FLOOR_SECONDS)
    except ValueError as exc:
        named = "--sweep-interval" if args.sweep_interval else "stethoscope_sweep_interval"
        raise ConfigError(f"{named}: {exc}") from None
    envvars = playbook_environment(store.dsn, store.database, spool_dir)
    batch = str(inventory.settings.get("stethoscope_sweep_batch") or "100%")
    return Sweeper(inventory.path, interval, envvars, hosts=sorted(inventory.hosts), batch=batch)
