"""One duration syntax for settings too: the inventory's durations (executor and breaker settings,
serve's sweep and scrape intervals, the report intervals) read timeutil's `90s`, `1.5h`, `30m` or
plain seconds, and refuse anything else naming the setting."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from stethoscope.catalog import Catalog
from stethoscope.remediation.settings import Settings
from stethoscope.store.dsn import ConfigError
from stethoscope.timeutil import positive_seconds

from conftest import LAB_INVENTORY, TOP, ansible_env


class Inventory:
    """The settings of an inventory and its -e, as the executor reads them."""

    def __init__(self, **settings: Any):
        self.settings = settings

    def setting(self, name: str, default: Any = None) -> Any:
        return self.settings.get(name, default)


def test_breaker_window_reads_the_one_duration_syntax():
    assert Settings.of(Inventory(stethoscope_breaker_window="1.5h")).breaker_window_seconds == 5400
    assert Settings.of(Inventory(stethoscope_breaker_window="300")).breaker_window_seconds == 300
    assert Settings.of(Inventory(stethoscope_breaker_window=90)).breaker_window_seconds == 90


@pytest.mark.parametrize(
    ("setting", "given", "field", "seconds"),
    [
        ("stethoscope_playbook_timeout", "30m", "playbook_timeout", 1800),
        ("stethoscope_playbook_timeout", "1.5h", "playbook_timeout", 5400),
        ("stethoscope_playbook_timeout", "600", "playbook_timeout", 600),
        ("stethoscope_http_timeout", "2.5s", "http_timeout", 2.5),
        ("stethoscope_http_timeout", 10, "http_timeout", 10),
        ("stethoscope_executor_beat", "1m", "beat_seconds", 60),
        ("stethoscope_executor_beat", "30", "beat_seconds", 30),
        ("stethoscope_incident_window", "2h", "window_ms", 7_200_000),
    ],
)
def test_executor_durations_read_the_one_syntax(setting, given, field, seconds):
    assert getattr(Settings.of(Inventory(**{setting: given})), field) == seconds


@pytest.mark.parametrize(
    "setting",
    [
        "stethoscope_breaker_window",
        "stethoscope_incident_window",
        "stethoscope_playbook_timeout",
        "stethoscope_http_timeout",
        "stethoscope_executor_beat",
    ],
)
@pytest.mark.parametrize("given", ["bogus", "0", "-5m", "5 minutes", True])
def test_a_duration_setting_that_is_none_is_refused_naming_it(setting, given):
    with pytest.raises(ConfigError, match=setting):
        Settings.of(Inventory(**{setting: given}))


@pytest.mark.parametrize(
    ("given", "seconds"), [("90s", 90), ("1.5h", 5400), ("30m", 1800), (300, 300), ("2.5", 2.5)]
)
def test_interval_settings_read_the_one_syntax(given, seconds):
    """serve's sweep interval and the exporters' scrape interval."""
    assert positive_seconds(given) == seconds


@pytest.mark.parametrize("given", ["bogus", "0", 0, -60, "-1m", "1.5 hours", None, True])
def test_interval_settings_refuse_what_is_no_positive_duration(given):
    with pytest.raises(ValueError, match="90s"):  # the message names the syntax
        positive_seconds(given)


def test_report_intervals_read_the_one_syntax():
    catalog = Catalog.load().with_intervals("5m", {"gpu_temperature_celsius": "90s"})
    assert catalog.get("gpu_temperature_celsius").interval == 90
    swept = [spec for spec in catalog.metrics.values() if spec.authored_interval == 60]
    assert swept and {spec.interval for spec in swept} - {90} == {300}


@pytest.mark.parametrize("given", ["bogus", "0", "-5m", True])
def test_a_report_interval_that_is_no_duration_is_refused_naming_it(given):
    from stethoscope.catalog import CatalogError

    with pytest.raises(CatalogError, match="stethoscope_sweep_interval"):
        Catalog.load().with_intervals(given)


def test_a_whole_seconds_duration_says_so():
    assert positive_seconds("1.5m", whole=True) == 90
    with pytest.raises(ValueError, match=r"whole seconds.*90s"):
        positive_seconds("2.5s", whole=True)


@pytest.mark.parametrize(
    ("setting", "given"),
    [
        ("stethoscope_playbook_timeout", "bogus"),
        ("stethoscope_breaker_window", "2.5"),
        ("stethoscope_http_timeout", "x"),
    ],
)
def test_every_executor_duration_is_refused_in_the_same_words(setting, given):
    """One helper: the whole-seconds settings say the same syntax as the others, and the rule."""
    with pytest.raises(ConfigError, match=f"^{setting}: .*90s, 15m"):
        Settings.of(Inventory(**{setting: given}))


def test_the_whole_seconds_settings_read_fractions_of_bigger_units():
    assert Settings.of(Inventory(stethoscope_playbook_timeout="1.5m")).playbook_timeout == 90


@pytest.mark.parametrize("given", ["0.1s", 0.0001, "0.5"])
def test_a_beat_under_a_second_is_refused_naming_it(given):
    """A beat of 0.1 ms would spin the executor's beat thread against the store."""
    with pytest.raises(ConfigError, match=r"stethoscope_executor_beat: .*at least 1s"):
        Settings.of(Inventory(stethoscope_executor_beat=given))


def test_a_timer_floor_refuses_what_is_under_it():
    assert positive_seconds("1s", least=1) == 1
    with pytest.raises(ValueError, match="at least 1s"):
        positive_seconds(0.0001, least=1)


@pytest.mark.parametrize("given", ["0.1s", 0.0001])
def test_a_scrape_interval_under_a_second_is_refused_naming_it(tmp_path, given):
    from types import SimpleNamespace

    import yaml

    from stethoscope.serve.scrape import scraper_of

    inventory = tmp_path / "hosts.yml"
    entry = {"url": "http://node01:9400/metrics", "exporter": "dcgm"}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"node01": {"stethoscope_scrape": [entry]}}}}))
    with pytest.raises(ConfigError, match=r"stethoscope_scrape_interval: .*at least 1s"):
        scraper_of(SimpleNamespace(path=inventory, settings={"stethoscope_scrape_interval": given}), 60)


def test_serve_refuses_a_sweep_interval_under_a_second_naming_it(tmp_path):
    """Exit 2 before serve starts, not a scheduler that spins."""
    dsn = f"chdb://{tmp_path / 'db'}"
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"duration-settings-secret-0123456789\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(LAB_INVENTORY), "--secret-file", str(secret), "--no-model",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--sweep-interval", "0.1s",
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=ansible_env(tmp_path, dsn),
        cwd=TOP,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--sweep-interval" in done.stderr and "at least 1s" in done.stderr


def test_the_settings_keep_the_rebaseline_window_they_read():
    from stethoscope.remediation.rebaseline import Window

    settings = Settings.of(Inventory(stethoscope_rebaseline_window="sat 02:00-06:00"))
    assert settings.rebaseline_window == Window.parse("sat 02:00-06:00")
    assert Settings.of(Inventory()).rebaseline_window is None
