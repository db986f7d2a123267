"""The exporters a GPU site already runs as sources: serve scrapes the dcgm-exporter,
node_exporter and smartctl_exporter endpoints the inventory lists, maps their names through the one
table in rules/sources/exporters.yml to the catalog's, and hands the rows, node_id = the inventory
host, to the same sink the collector writes through. A name the table does not map is ignored and
counted; an endpoint that does not answer is counted and said, naming its URL.

node_exporter is Debian's, run for real on loopback over the real H100 /sys/class/infiniband
snapshot (tests/fixtures/public/sysfs); dcgm-exporter's and smartctl_exporter's outputs are public
captures (tests/fixtures/public/SOURCES.md) served unedited by a loopback HTTP server."""

from __future__ import annotations

import http.server
import logging
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from stethoscope.catalog import default_catalog
from stethoscope.serve.scrape import Scraper, ScrapeTarget, scrape_targets, scraper_of
from stethoscope.store.batch import Batch
from stethoscope.store.client import Store
from stethoscope.store.dsn import ConfigError
from stethoscope.telemetry.exporters import default_table, load_table

from conftest import TOP

PUBLIC = TOP / "tests" / "fixtures" / "public"
DCGM = PUBLIC / "exporters" / "dcgm_exporter_t4_460_lines1-48.prom"
SMARTCTL = PUBLIC / "exporters" / "smartctl_exporter_example_nvme0_worn_4_sata.prom"
IB_SYSFS = PUBLIC / "sysfs" / "sys-class-infiniband-h100_gpud"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
AT = 1_780_000_000_000


def rows_of(mapped):
    return {(r["metric_name"], r["device"]): r for r in mapped.rows.iter_rows()}


def test_every_name_the_table_maps_to_is_in_the_catalog_with_its_unit():
    table = default_table()
    catalog = default_catalog()
    assert set(table.exporters) == {"dcgm", "node_exporter", "smartctl"}
    for exporter, entries in table.exporters.items():
        for entry in entries:
            if "{" not in entry.metric:  # smart_{attribute} names are checked per sample
                assert entry.metric in catalog, (exporter, entry.source, entry.metric)


def test_a_table_naming_a_metric_the_catalog_lacks_is_refused_naming_it(tmp_path):
    bad = tmp_path / "exporters.yml"
    bad.write_text(
        yaml.safe_dump({"exporters": {"dcgm": [{"source": "DCGM_FI_X", "metric": "gpu_nonsense"}]}})
    )
    with pytest.raises(ValueError, match="gpu_nonsense"):
        load_table(bad, default_catalog())


def test_dcgm_exporter_capture_maps_to_the_catalog_per_gpu_with_units_as_the_catalog_has_them():
    mapped = default_table().map("dcgm", DCGM.read_text(), "node01", AT)
    rows = rows_of(mapped)
    assert rows[("gpu_temperature_celsius", "gpu0")]["value"] == 25
    assert rows[("gpu_power_watts", "gpu0")]["value"] == pytest.approx(8.969)
    assert rows[("gpu_sm_clock_mhz", "gpu0")]["value"] == 300
    assert rows[("gpu_memory_clock_mhz", "gpu0")]["value"] == 405
    assert rows[("gpu_pcie_replay_errors_total", "gpu0")]["value"] == 0
    assert rows[("gpu_utilization_percent", "gpu0")]["value"] == 0
    assert rows[("gpu_memory_used_mib", "gpu0")]["value"] == 0
    every = list(mapped.rows.iter_rows())
    assert {r["node_id"] for r in every} == {"node01"} and {r["timestamp"] for r in every} == {AT}
    assert all(r["labels"] == {"source": "dcgm"} for r in every)
    # the last XID is 0 there: no XID, no row; encoder, decoder, FB free, license, count: not mapped
    assert not any(name == "gpu_xid_errors_total" for name, _ in rows)
    assert mapped.unmapped == {
        "DCGM_FI_DEV_ENC_UTIL": 1,
        "DCGM_FI_DEV_DEC_UTIL": 1,
        "DCGM_FI_DEV_FB_FREE": 1,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 1,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 1,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 1,
        "DCGM_FI_DEV_COUNT": 1,
    }


def dcgm_with_last_xid(code: int) -> str:
    return DCGM.read_text().replace(
        'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0\n# HELP DCGM_FI_DEV_FB_FREE',
        f'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"}} {code}\n# HELP DCGM_FI_DEV_FB_FREE',
    )


def xid_rows(mapped) -> list[dict]:
    return [r for r in mapped.rows.iter_rows() if r["metric_name"].startswith("gpu_xid_")]


def test_a_stale_last_xid_at_the_first_scrape_is_preexisting_not_an_event():
    """dcgm-exporter's gauge holds the LAST XID, however old: its first sighting is no news (as the
    kernel-log reader's first read); only a change to a new code is an event of that code."""
    seen: dict = {}
    first = default_table().map("dcgm", dcgm_with_last_xid(79), "node01", AT, seen)
    assert xid_rows(first) == [
        {"node_id": "node01", "metric_name": "gpu_xid_preexisting_total", "device": "gpu0",
         "labels": {"source": "dcgm", "xid": "79"}, "value": 1.0, "timestamp": AT}
    ]  # fmt: skip
    again = default_table().map("dcgm", dcgm_with_last_xid(79), "node01", AT + 60_000, seen)
    assert xid_rows(again) == []
    changed = default_table().map("dcgm", dcgm_with_last_xid(48), "node01", AT + 120_000, seen)
    assert xid_rows(changed) == [
        {"node_id": "node01", "metric_name": "gpu_xid_errors_total", "device": "gpu0",
         "labels": {"source": "dcgm", "xid": "48"}, "value": 1.0, "timestamp": AT + 120_000}
    ]  # fmt: skip


def test_a_stale_xid_at_the_first_scrape_is_no_xid_incident_through_diagnose(tmp_dsn):
    """The shipped rules over what the first scrape of a node whose last XID was 79 long ago stores:
    the pre-existing XID's info finding, nothing that would drain it."""
    from stethoscope.diagnosis.findings import diagnose
    from stethoscope.diagnosis.rules import load_rules

    now = int(time.time() * 1000)
    seen: dict = {}
    with Store(tmp_dsn, f"t_{uuid.uuid4().hex[:8]}") as store:
        store.init_schema()
        store.insert_metrics(default_table().map("dcgm", dcgm_with_last_xid(79), "gpu-a", now, seen).rows)
        findings = diagnose(store, load_rules(TOP / "rules", default_catalog()).rules, now + 1_000)
    assert {(f["rule_id"], f["device"], f["severity"]) for f in findings if "xid" in f["rule_id"]} == {
        ("gpu_xid_preexisting", "gpu0", "info")
    }


def test_the_scraper_remembers_the_last_xid_per_node_and_gpu_across_rounds(tmp_path):
    page = tmp_path / "metrics"
    page.write_text(dcgm_with_last_xid(79))
    sink = Sink()
    with ServedFile(page) as url:
        scraper = Scraper([ScrapeTarget("node01", url, "dcgm")], default_table(), 60)
        scraper.scrape_once(sink)
        assert not any(name == "gpu_xid_errors_total" for _, name, _ in sink.rows())
        assert ("node01", "gpu_xid_preexisting_total", "gpu0") in sink.rows()
        page.write_text(dcgm_with_last_xid(48))
        sink.batches.clear()
        scraper.scrape_once(sink)
    rows = [r for b in sink.batches for r in b.metrics.iter_rows()]
    (event,) = [r for r in rows if r["metric_name"] == "gpu_xid_errors_total"]
    assert (event["device"], event["labels"]["xid"]) == ("gpu0", "48")


def test_smartctl_exporter_capture_nvme_health_only_for_nvme_devices():
    mapped = default_table().map("smartctl", SMARTCTL.read_text(), "node02", AT)
    rows = rows_of(mapped)
    assert rows[("nvme_percentage_used", "nvme0")]["value"] == 161
    assert rows[("nvme_critical_warning", "nvme0")]["value"] == 4
    assert rows[("nvme_available_spare_percent", "nvme0")]["value"] == 100
    assert rows[("nvme_media_errors_total", "nvme0")]["value"] == 0
    assert rows[("smart_health_passed", "nvme0")]["value"] == 0
    assert rows[("smart_health_passed", "sda")]["value"] == 1
    assert rows[("disk_temperature_celsius", "nvme0")]["value"] == 37
    assert rows[("disk_temperature_celsius", "sdd")]["value"] == 39
    # smartctl_exporter prints the NVMe health fields at 0 for SATA disks too: not a reading of theirs
    assert ("nvme_percentage_used", "sda") not in rows and ("nvme_critical_warning", "sdb") not in rows
    assert mapped.unmapped["smartctl_device_power_on_seconds"] == 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def node_exporter(tmp_path):
    """Debian's node_exporter on loopback, its infiniband and hwmon collectors over a sysfs that is the
    real H100 /sys/class/infiniband snapshot."""
    if shutil.which(NODE_EXPORTER) is None:
        pytest.skip(f"{NODE_EXPORTER} is not installed (Debian's prometheus-node-exporter)")
    sysfs = tmp_path / "sys"
    (sysfs / "class").mkdir(parents=True)
    (sysfs / "class" / "infiniband").symlink_to(IB_SYSFS)
    port = free_port()
    command = [
        NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
        "--collector.infiniband", "--collector.hwmon", f"--path.sysfs={sysfs}",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics")
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def served():
    """A loopback HTTP server answering /metrics with a capture's bytes as they are."""
    servers = []

    def serve(path: Path) -> str:
        body = path.read_bytes()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


class ServedFile:
    """A loopback HTTP server answering /metrics with a file's bytes as they are at each request."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> str:
        path = self.path

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Sink:
    """What serve hands the scraper: the collector's writer (here, what it was given)."""

    def __init__(self):
        self.batches: list[Batch] = []

    def __call__(self, batch: Batch):
        self.batches.append(batch)

    def rows(self):
        return {
            (r["node_id"], r["metric_name"], r["device"]): r
            for b in self.batches
            for r in b.metrics.iter_rows()
        }


def test_a_real_node_exporter_infiniband_counters_are_stored_as_the_catalogs(node_exporter):
    sink = Sink()
    scraper = Scraper([ScrapeTarget("node07", node_exporter, "node_exporter")], default_table(), 60)
    scraper.scrape_once(sink)
    rows = sink.rows()
    assert rows[("node07", "ib_port_rcv_errors_total", "mlx5_0/1")]["value"] == 14
    assert rows[("node07", "ib_port_state", "mlx5_0/1")]["value"] == 4
    assert rows[("node07", "ib_port_phys_state", "mlx5_0/1")]["value"] == 5
    assert rows[("node07", "ib_port_rate_gbit_per_s", "mlx5_0/1")]["value"] == 400  # 5e10 bytes/s
    assert rows[("node07", "ib_link_downed_total", "mlx5_1/1")]["value"] == 255
    assert rows[("node07", "ib_symbol_errors_total", "mlx5_0/1")]["labels"] == {"source": "node_exporter"}
    # node_exporter's own series (go_*, process_*, scrape_*) and the IB packet counters: not the catalog's
    assert scraper.stats.unmapped["node_exporter"] > 0 and not any(scraper.stats.failures.values())


def test_dcgm_and_smartctl_endpoints_each_feed_their_node(served):
    sink = Sink()
    targets = [
        ScrapeTarget("node01", served(DCGM), "dcgm"),
        ScrapeTarget("node02", served(SMARTCTL), "smartctl"),
    ]
    Scraper(targets, default_table(), 60).scrape_once(sink)
    rows = sink.rows()
    assert rows[("node01", "gpu_temperature_celsius", "gpu0")]["value"] == 25
    assert rows[("node02", "nvme_percentage_used", "nvme0")]["value"] == 161
    assert not any(node == "node02" and name.startswith("gpu_") for node, name, _ in rows)


def test_an_endpoint_that_does_not_answer_is_counted_and_said_naming_its_url(served, caplog):
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    sink = Sink()
    scraper = Scraper(
        [ScrapeTarget("node03", dead, "dcgm"), ScrapeTarget("node01", served(DCGM), "dcgm")],
        default_table(),
        60,
    )
    with caplog.at_level(logging.WARNING):
        scraper.scrape_once(sink)
        scraper.scrape_once(sink)
    assert +scraper.stats.failures == {("node03", dead): 2}
    assert dead in caplog.text and "node03" in caplog.text
    assert ("node01", "gpu_temperature_celsius", "gpu0") in sink.rows()  # the others are scraped
    exposed = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in scraper.collect()
        for sample in metric.samples
    }
    key = ("stethoscope_scrape_failures_total", (("exporter", "dcgm"), ("node", "node03"), ("url", dead)))
    assert exposed[key] == 2


@pytest.fixture
def silent_endpoints():
    """Endpoints that take the connection and never answer (a listening socket nobody accepts on)."""
    sockets = []

    def make(count: int) -> list[str]:
        for _ in range(count):
            listening = socket.socket()
            listening.bind(("127.0.0.1", 0))
            listening.listen(16)
            sockets.append(listening)
        return [f"http://127.0.0.1:{s.getsockname()[1]}/metrics" for s in sockets[-count:]]

    yield make
    for listening in sockets:
        listening.close()


def test_dead_endpoints_do_not_hold_back_the_live_ones_rows_past_one_round(served, silent_endpoints):
    """Scraped side by side with a round's deadline below the interval: five endpoints that never
    answer (10 s timeout each, 50 s one after the other) cost the live one no round."""
    sink = Sink()
    dead = [ScrapeTarget(f"node{i}", url, "dcgm") for i, url in enumerate(silent_endpoints(5))]
    scraper = Scraper([*dead, ScrapeTarget("node09", served(DCGM), "dcgm")], default_table(), interval=2)
    scraper.start(sink)
    try:
        deadline = time.monotonic() + 15  # rounds of 2 s; the dead ones alone would take 50 s in turn
        while not sink.batches and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        scraper.stop()
    assert ("node09", "gpu_temperature_celsius", "gpu0") in sink.rows()


def test_an_endpoint_url_that_is_a_template_is_refused_naming_its_host(tmp_path):
    inventory = tmp_path / "hosts.yml"
    entry = {"url": "http://{{ inventory_hostname }}:9400/metrics", "exporter": "dcgm"}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a": {"stethoscope_scrape": [entry]}}}}))
    with pytest.raises(ValueError, match=r"gpu-a.*not rendered"):
        scrape_targets(inventory)
    with pytest.raises(ConfigError, match=r"gpu-a.*not rendered"):  # serve: exit 2, before it starts
        scraper_of(SimpleNamespace(path=inventory, settings={}), 60)


def test_the_inventory_lists_each_hosts_endpoints_and_a_bad_entry_is_refused(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({
            "all": {"hosts": {
                "node01": {"stethoscope_scrape": [
                    {"url": "http://node01:9400/metrics", "exporter": "dcgm"},
                    {"url": "http://node01:9100/metrics", "exporter": "node_exporter"},
                ]},
                "node02": {},
            }}
        })
    )  # fmt: skip
    assert scrape_targets(inventory) == [
        ScrapeTarget("node01", "http://node01:9400/metrics", "dcgm"),
        ScrapeTarget("node01", "http://node01:9100/metrics", "node_exporter"),
    ]
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"hosts": {"node01": {"stethoscope_scrape": [{"url": "http://x/", "exporter": "snmp"}]}}}}
        )
    )
    with pytest.raises(ValueError, match=r"node01.*snmp"):
        scrape_targets(inventory)


def test_serve_scrapes_the_inventorys_endpoints_into_the_store_and_counts_the_dead_one(
    tmp_path, tmp_dsn, served
):
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({
            "all": {
                "vars": {"stethoscope_scrape_interval": 1},
                "hosts": {
                    "gpu-a": {"stethoscope_node_key": 1,
                              "stethoscope_scrape": [{"url": served(DCGM), "exporter": "dcgm"}]},
                    "gpu-b": {"stethoscope_node_key": 2,
                              "stethoscope_scrape": [{"url": dead, "exporter": "dcgm"}]},
                },
            }
        })
    )  # fmt: skip
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"scrape-test-secret-0123456789\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-sweep",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    try:
        line = proc.stdout.readline()
        found = re.search(r"http (http://[\d.]+:\d+)", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
        failures = f'stethoscope_scrape_failures_total{{exporter="dcgm",node="gpu-b",url="{dead}"}}'
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(f"{found[1]}/metrics", timeout=10) as response:
                page = response.read().decode()
            stored = re.search(r'stethoscope_scrape_rows_total\{exporter="dcgm"\} (\S+)', page)
            if failures in page and stored and float(stored[1]) > 0:
                break
            assert time.monotonic() < deadline, page
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert dead in stderr and "gpu-b" in stderr
    with Store(tmp_dsn) as store:
        rows = store.query(
            f"SELECT node_id, device, value, labels['source'] FROM {store.database}.metrics "
            "WHERE metric_name = 'gpu_temperature_celsius' LIMIT 1"
        )
    assert rows == [("gpu-a", "gpu0", 25.0, "dcgm")]
