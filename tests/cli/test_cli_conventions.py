"""The command-line conventions an operator expects, checked by running the command as a process:
NO_COLOR, --json on every command that reports, one duration syntax for every duration option, and
`-` for standard input where a file is read."""

from __future__ import annotations

import argparse
import io
import json
import os
import pty
import re
import subprocess
import sys

import pytest

from conftest import TOP, hot_gpu

ANSI = "\x1b["


def cli(*args, env_extra=None, stdin=None, module="stethoscope.cli"):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=TOP,
        input=stdin,
        check=False,
    )


def on_a_terminal(*args, env_extra=None) -> str:
    """The command's standard output when it is a terminal (a pseudo-terminal here)."""
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(env_extra or {})
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "stethoscope.cli", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
        cwd=TOP,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: the command is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=300) == 0, process.stderr.read()
    return b"".join(chunks).decode()


@pytest.fixture(scope="module")
def hot_dsn(tmp_path_factory):
    dsn = f"chdb://{tmp_path_factory.mktemp('conventions') / 'db'}"
    hot_gpu(dsn)
    return dsn


# NO_COLOR


def test_the_board_is_coloured_on_a_terminal_unless_no_color_is_set(hot_dsn):
    assert ANSI in on_a_terminal("--dsn", hot_dsn, "report", "--days", "2", "--no-model")
    plain = on_a_terminal(
        "--dsn", hot_dsn, "report", "--days", "2", "--no-model", env_extra={"NO_COLOR": "1"}
    )
    assert ANSI not in plain and "node01" in plain


def test_no_colour_when_standard_output_is_not_a_terminal(hot_dsn):
    result = cli("--dsn", hot_dsn, "report", "--days", "2", "--no-model")
    assert result.returncode == 0 and "node01" in result.stdout and ANSI not in result.stdout


# --json: one document on standard output, stable keys


def test_db_init_json(tmp_path):
    result = cli(
        "--dsn", f"chdb://{tmp_path / 'db'}", "--spool-dir", str(tmp_path / "spool"), "db", "init", "--json"
    )
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said["database"] == "stethoscope" and said["raw_ttl_days"] == 30
    assert said["replayed"] == {"rows": 0, "files": 0, "other_targets": 0}


def test_summary_json(hot_dsn):
    result = cli("--dsn", hot_dsn, "summary", "--json", "--no-model")
    assert result.returncode == 0, result.stderr
    (node,) = json.loads(result.stdout)["nodes"]
    assert node["node_id"] == "node01" and node["rows"] == 3
    assert {"series", "last_seen", "findings"} <= set(node)


def test_baseline_json(hot_dsn):
    result = cli("--dsn", hot_dsn, "baseline", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"rows": []}


def test_report_json(hot_dsn):
    result = cli("--dsn", hot_dsn, "report", "--days", "2", "--no-model", "--json")
    assert result.returncode == 0, result.stderr
    board = json.loads(result.stdout)
    assert len(board["days"]) == 2 and board["layers"]
    (node,) = board["nodes"]
    assert node["node_id"] == "node01"
    assert {cell["layer"] for cell in node["cells"]} == set(board["layers"])
    assert {"day", "state", "notes"} <= set(node["cells"][0])


def test_report_json_prints_any_value_as_every_other_json_command(hot_dsn, monkeypatch, capsys):
    """A value JSON has no type for (a datetime, a Decimal from the store) is printed as text, as
    every other --json prints it, not a traceback after the board was computed."""
    import datetime as dt

    from stethoscope.cli.main import main
    from stethoscope.report import board

    at = dt.datetime(2026, 12, 6, 18, 0, tzinfo=dt.UTC)
    monkeypatch.setattr(board, "board_record", lambda data: {"generated_at": at})
    assert main(["--dsn", hot_dsn, "report", "--days", "2", "--no-model", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"generated_at": str(at)}


def test_rules_check_json():
    result = cli("rules", "check", "rules", "--json")
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said["rules"] > 50 and said["files"] > 5 and said["errors"] == []
    assert isinstance(said["notes"], list)


def test_rules_check_json_with_errors_is_still_one_document(tmp_path):
    (tmp_path / "bad.yml").write_text("- rule_id: x\n  severity: loud\n")
    result = cli("rules", "check", str(tmp_path), "--json")
    assert result.returncode == 2
    said = json.loads(result.stdout)
    assert said["rules"] == 0 and said["errors"]
    assert {"file", "line", "field", "message"} == set(said["errors"][0])


def test_spool_status_json(tmp_path):
    (tmp_path / "rows.ndjson").write_text(
        json.dumps(
            {
                "node_id": "n1",
                "metric_name": "net_mtu",
                "device": "ib0",
                "value": 4096,
                "timestamp": 1764460800,
            }
        )
        + "\n"
    )
    spool = str(tmp_path / "spool")
    down = {"STETHOSCOPE_DSN": "http://127.0.0.1:9/x"}
    assert cli("--spool-dir", spool, "ingest", str(tmp_path / "rows.ndjson"), env_extra=down).returncode == 0
    result = cli("--spool-dir", spool, "spool", "status", "--json")
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said["rows"] == 1
    (waiting,) = said["files"]
    assert waiting["rows"] == 1 and waiting["table"] == "metrics" and waiting["attempts"] == 0
    assert said["rejected"] == {"rows": 0, "reasons": {}} and said["quarantined"] == []


# one duration syntax


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("15m", 900), ("1.5h", 5400), ("2d", 172800), ("1w", 604800), ("300", 300), ("2.5", 2.5)],
)
def test_one_duration_syntax(text, seconds):
    from stethoscope.timeutil import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 min", "-5m", "1x", "nan", "inf", "1e400s", "h"])
def test_not_durations(text):
    from stethoscope.timeutil import parse_duration

    with pytest.raises(ValueError) as raised:
        parse_duration(text)
    assert str(raised.value).startswith(f"{text!r} is not a duration")


def test_since_takes_fractions_and_weeks(hot_dsn):
    for since in ("1.5h", "1w", "90s"):
        result = cli("--dsn", hot_dsn, "actions", "--since", since, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == []


def test_lead_target_takes_days(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    result = cli("--dsn", dsn, "audit", "--json", "--no-model", "--lead-target", "1d")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["lead_target_minutes"] == 1440


@pytest.mark.parametrize(
    "args, option",
    [
        (["silence", "add", "--node", "n1", "--for", "1x", "--reason", "r"], "--for"),
        (["actions", "--since", "soon"], "--since"),
        (["audit", "--lead-target", "half an hour"], "--lead-target"),
        (["watch", "--interval", "1x"], "--interval"),
    ],
)
def test_a_bad_duration_is_exit_2_naming_the_option_and_value(tmp_path, args, option):
    result = cli("--dsn", f"chdb://{tmp_path / 'db'}", *args)
    assert result.returncode == 2
    value = args[args.index(option) + 1]
    assert option in result.stderr and repr(value) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_rebaseline_plan_takes_since_duration(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    assert cli("--dsn", dsn, "--spool-dir", str(tmp_path / "spool"), "db", "init").returncode == 0
    plan = cli("--dsn", dsn, "--since", "1.5h", "--json", module="stethoscope.bench.plan")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout) == []
    bad = cli("--dsn", dsn, "--since", "1x", module="stethoscope.bench.plan")
    assert bad.returncode == 2 and "--since" in bad.stderr and "'1x'" in bad.stderr


# `-` for standard input


def test_rules_check_reads_standard_input():
    rule = (TOP / "rules" / "gpu" / "ecc.yml").read_text()
    result = cli("rules", "check", "-", stdin=rule)
    assert result.returncode == 0, result.stderr
    assert "rules valid in 1 files" in result.stdout
    broken = cli("rules", "check", "-", stdin="- rule_id: x\n  severity: loud\n")
    assert broken.returncode == 2 and "-:1:" in broken.stderr


@pytest.mark.parametrize(
    "text",
    [
        "node,kind,layer,impact\nnode01,overheat,compute,latest\n",
        '[{"node": "node01", "kind": "overheat", "layer": "compute", "impact": "latest"}]\n',
    ],
)
def test_audit_reads_faults_from_standard_input(tmp_path, text):
    dsn = f"chdb://{tmp_path / 'db'}"
    hot_gpu(dsn)
    result = cli("--dsn", dsn, "audit", "--json", "--no-model", "--faults", "-", stdin=text)
    assert result.returncode in (0, 1), result.stderr
    assert "imported 1 faults from -" in result.stderr
    assert [f["kind"] for f in json.loads(result.stdout)["faults"]] == ["overheat"]


def test_the_cluster_secret_from_standard_input(monkeypatch):
    from stethoscope.telemetry.keyring import KeyringError, read_secret

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"s3cret-from-the-vault-0123456789\n")))
    assert read_secret("-") == b"s3cret-from-the-vault-0123456789"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"short\n")))
    with pytest.raises(KeyringError, match="standard input: shorter than 16 bytes"):
        read_secret("-")


def test_a_cluster_secret_longer_than_the_limit_is_refused_not_cut(monkeypatch):
    from stethoscope.telemetry.keyring import SECRET_MAX_BYTES, KeyringError, read_secret

    longest = b"k" * SECRET_MAX_BYTES
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(longest + b"\n")))
    assert read_secret("-") == longest
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(longest + b"k\n")))
    with pytest.raises(KeyringError, match=f"standard input: longer than {SECRET_MAX_BYTES} bytes"):
        read_secret("-")


def test_spool_replay_json(tmp_path):
    (tmp_path / "rows.ndjson").write_text(
        json.dumps(
            {"node_id": "n1", "metric_name": "net_mtu", "device": "ib0", "value": 1, "timestamp": 1764460800}
        )
        + "\n"
    )
    dsn = f"chdb://{tmp_path / 'db'}"
    spool = str(tmp_path / "spool")
    down = {"STETHOSCOPE_DSN": "http://127.0.0.1:9/x"}
    assert cli("--spool-dir", spool, "ingest", str(tmp_path / "rows.ndjson"), env_extra=down).returncode == 0
    result = cli("--dsn", dsn, "--spool-dir", spool, "spool", "replay", "--into", dsn, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"rows": 1, "files": 1, "other_targets": 0}


def test_verify_since_takes_a_duration_ago(tmp_path):
    verify = ["--dsn", f"chdb://{tmp_path / 'db'}", "verify", "--node", "node01", "--txn", "t1"]
    bad = cli(*verify, "--since", "soon")
    assert bad.returncode == 2 and "--since 'soon'" in bad.stderr
    ago = cli(*verify, "--since", "1.5h")  # then refused for the missing inventory, not for --since
    assert ago.returncode == 2 and "--since" not in ago.stderr and "inventory" in ago.stderr, ago.stderr


TIME_SPAN = re.compile(r"second|minute|hour|days?\b|timeout|interval|since|window|ttl", re.IGNORECASE)


def options_of(parser, path=()):
    """(command path, action) of every option of `parser` and of its subcommands, at any depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options_of(sub, (*path, name))
        else:
            yield path, action


def test_no_time_span_option_takes_a_bare_number():
    """Every option that is a time span (its name, metavar or help says so) takes the one duration
    syntax: a plain int/float type would refuse `36h` and `1w`."""
    from stethoscope.cli.main import build_parser

    bare = [
        f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
        for path, action in options_of(build_parser())
        if action.type in (int, float) and TIME_SPAN.search(f"{action.dest} {action.metavar} {action.help}")
    ]
    assert bare == []


@pytest.mark.parametrize(
    "args, dest, value",
    [
        (["db", "init", "--ttl-days", "14"], "ttl_days", 14),
        (["db", "init", "--ttl-days", "2w"], "ttl_days", 14),
        (["db", "init", "--ttl-days", "48h"], "ttl_days", 2),
        (["top", "gpu_temperature_celsius", "--days", "7"], "days", 7),
        (["top", "gpu_temperature_celsius", "--days", "36h"], "days", 1.5),
        (["report", "--days", "3"], "days", 3),
        (["report", "--days", "1w"], "days", 7),
        (["model", "finetune", "--days", "0.5"], "days", 0.5),
        (["model", "finetune", "--days", "12h"], "days", 0.5),
        (["gate", "--timeout", "0.3"], "timeout", 0.3),
        (["gate", "--timeout", "0.3s"], "timeout", 0.3),
        (["gate", "--grace", "2m"], "grace", 120),
    ],
)
def test_a_span_in_days_reads_a_bare_number_as_days_and_takes_the_duration_syntax(args, dest, value):
    """An option counted in days keeps its bare number of days and takes any unit of the one syntax;
    the gate's seconds take it too."""
    from stethoscope.cli.main import build_parser

    assert getattr(build_parser().parse_args(args), dest) == value


@pytest.mark.parametrize(
    "args, option",
    [
        (["db", "init", "--ttl-days", "1.5h"], "--ttl-days"),  # ClickHouse's TTL is whole days
        (["db", "init", "--ttl-days", "0"], "--ttl-days"),
        (["report", "--days", "36h"], "--days"),  # one column a day
        (["top", "gpu_temperature_celsius", "--days", "1x"], "--days"),
        (["top", "gpu_temperature_celsius", "--days", "0"], "--days"),
        (["model", "finetune", "--days", "soon"], "--days"),
        (["gate", "--timeout", "1x"], "--timeout"),
        (["gate", "--grace", "a while"], "--grace"),
    ],
)
def test_a_bad_span_is_exit_2_naming_the_option_and_value(capsys, args, option):
    from stethoscope.cli.main import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(args)
    assert exited.value.code == 2
    said = capsys.readouterr().err
    value = args[args.index(option) + 1]
    assert f"argument {option}" in said and repr(value) in said, said


def test_db_init_ttl_days_in_weeks_is_the_same_ttl_as_in_days(tmp_path):
    where = ["--dsn", f"chdb://{tmp_path / 'db'}", "--spool-dir", str(tmp_path / "spool")]
    weeks = cli(*where, "db", "init", "--ttl-days", "2w", "--json")
    assert weeks.returncode == 0, weeks.stderr
    assert json.loads(weeks.stdout)["raw_ttl_days"] == 14
    days = cli(*where, "db", "init", "--ttl-days", "14", "--json")
    assert days.returncode == 0, days.stderr
    said = json.loads(days.stdout)
    assert said["raw_ttl_days"] == 14 and not said["tables_changed"] and said["raw_ttl_changed_from"] is None
