"""The exporters a site already runs, scraped by serve as sources: each inventory host's
`stethoscope_scrape` list (`[{url: http://node01:9400/metrics, exporter: dcgm}, ...]`) is scraped
every interval (`stethoscope_scrape_interval`, else the sweeps'), mapped through the exporters'
table (telemetry.exporters) and handed, node_id = the inventory host, to the sink the collector
writes through (the same writer and spool). An endpoint that does not answer is counted per URL on
serve's /metrics and said in a log line naming it: never silence."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from prometheus_client.core import CounterMetricFamily

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.dsn import redact
from stethoscope.telemetry.exporters import EXPORTERS, ExporterParseError, ExporterTable
from stethoscope.timeutil import TIMER_FLOOR_SECONDS, positive_seconds

log = logging.getLogger(__name__)
SETTING = "stethoscope_scrape"
MAX_BODY_BYTES = 32 * 1024 * 1024  # an exporter's page; a larger one is refused, not read to the end
WORKERS = 8  # endpoints scraped at once
ROUND_SHARE = 0.8  # a round's deadline: this share of the interval
REQUEST_SHARE = 0.5  # the longest one request may take (at most its timeout): ends within the round


@dataclass(frozen=True)
class ScrapeTarget:
    node_id: str  # the inventory host the rows are of
    url: str
    exporter: str  # one of telemetry.exporters.EXPORTERS


@dataclass
class ScrapeStats:
    scrapes: Counter = field(default_factory=Counter)  # exporter -> scrapes that answered
    failures: Counter = field(default_factory=Counter)  # (node, url) -> scrapes that did not
    unmapped: Counter = field(default_factory=Counter)  # exporter -> samples the table does not map
    rows: Counter = field(default_factory=Counter)  # exporter -> rows handed to the sink
    last_error: dict[tuple[str, str], str] = field(default_factory=dict)


def scrape_targets(inventory: Path) -> list[ScrapeTarget]:
    """Every host's `stethoscope_scrape` entries, in inventory order; ValueError naming the host and
    the entry when one has no http(s) url or an exporter the table does not know."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    variables = VariableManager(loader=loader, inventory=manager)
    targets = []
    for host in manager.get_hosts():
        entries = variables.get_vars(host=host, include_hostvars=False).get(SETTING) or []
        if not isinstance(entries, list):
            raise ValueError(f"{host.name}: {SETTING} must be a list of {{url, exporter}}")
        for entry in entries:
            targets.append(_target(host.name, entry))
    return targets


def _target(host: str, entry: Any) -> ScrapeTarget:
    url = str(entry.get("url", "")) if isinstance(entry, dict) else ""
    exporter = str(entry.get("exporter", "")) if isinstance(entry, dict) else ""
    if "{{" in url:
        raise ValueError(
            f"{host}: {SETTING} url {url!r} is a template: templates are not rendered here; give the URL"
        )
    if not url.startswith(("http://", "https://")) or exporter not in EXPORTERS:
        raise ValueError(
            f"{host}: {SETTING} entry {entry!r}: needs an http(s) url and an exporter, one of "
            f"{', '.join(EXPORTERS)} (got {exporter!r})"
        )
    return ScrapeTarget(host, url, exporter)


class Scraper:
    """The targets scraped side by side (WORKERS at a time), each round within ROUND_SHARE of the
    interval: an endpoint that does not answer costs its own request's time, not the others' rows."""

    def __init__(
        self, targets: list[ScrapeTarget], table: ExporterTable, interval: float, timeout: float = 10.0
    ):
        self.targets, self.table, self.interval = targets, table, interval
        self.round_seconds = ROUND_SHARE * interval
        self.timeout = min(timeout, REQUEST_SHARE * interval)
        self.stats = ScrapeStats()
        self.stats.failures.update(dict.fromkeys(((t.node_id, t.url) for t in targets), 0))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = urllib3.PoolManager(
            num_pools=WORKERS, maxsize=WORKERS, timeout=urllib3.Timeout(total=self.timeout), retries=False
        )
        self._workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="stethoscope-scrape")
        self._counting = threading.Lock()  # the workers count into the same stats
        # (node, gpu) -> the XID dcgm-exporter last showed: in memory, so after a restart the first
        # sighting is pre-existing again (telemetry.exporters)
        self._last_xid: dict[tuple[str, str], int] = {}

    def start(self, sink: Callable[[Batch], Any]) -> Scraper:
        self._thread = threading.Thread(
            target=self._loop, args=(sink,), name="stethoscope-scrape", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _loop(self, sink: Callable[[Batch], Any]) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self.scrape_once(sink)
            except Exception as exc:  # the sink raised: said, and the next interval scrapes again
                log.warning("scrape: rows not handed to the store: %s", redact(str(exc)))
            due += self.interval
            self._stop.wait(max(0.0, due - time.monotonic()))

    def scrape_once(self, sink: Callable[[Batch], Any]) -> Batch:
        """Every target once, side by side; the rows of those that answered within the round to
        `sink` in one batch (also returned). A target still waiting for a worker at the round's end
        is not scraped this round: counted and said as one that did not answer."""
        rows = MetricColumns()
        scrapes = {self._workers.submit(self._scrape, target): target for target in self.targets}
        done, late = wait(scrapes, timeout=self.round_seconds)
        for future in done:
            rows.extend(future.result())
        for future in late:  # one already running ends within its request's time, too late for this batch
            if future.cancel():
                self._failed(scrapes[future], f"not scraped within the round ({self.round_seconds:g} s)")
        batch = Batch(metrics=rows)
        if len(rows):
            sink(batch)
        return batch

    def _scrape(self, target: ScrapeTarget) -> MetricColumns:
        key = (target.node_id, target.url)
        try:
            text = self._fetch(target.url)
            at = int(time.time() * 1000)
            mapped = self.table.map(target.exporter, text, target.node_id, at, self._last_xid)
        except (urllib3.exceptions.HTTPError, OSError, ExporterParseError, UnicodeDecodeError) as exc:
            self._failed(target, f"{type(exc).__name__}: {redact(str(exc))}")
            return MetricColumns()
        with self._counting:
            self.stats.last_error.pop(key, None)
            self.stats.scrapes[target.exporter] += 1
            self.stats.unmapped[target.exporter] += sum(mapped.unmapped.values())
            self.stats.rows[target.exporter] += len(mapped.rows)
        return mapped.rows

    def _failed(self, target: ScrapeTarget, why: str) -> None:
        key = (target.node_id, target.url)
        with self._counting:
            self.stats.failures[key] += 1
            self.stats.last_error[key] = why
        log.warning(
            "scrape: %s endpoint of %s did not answer: %s: %s",
            target.exporter,
            target.node_id,
            redact(target.url),
            why,
        )

    def _fetch(self, url: str) -> str:
        response = self._pool.request("GET", url, preload_content=False, headers={"Accept": "text/plain"})
        try:
            if response.status != 200:
                raise urllib3.exceptions.HTTPError(f"HTTP {response.status}")
            body = response.read(MAX_BODY_BYTES + 1)
        finally:
            response.release_conn()
        if len(body) > MAX_BODY_BYTES:
            raise urllib3.exceptions.HTTPError(f"answer larger than {MAX_BODY_BYTES} bytes")
        return body.decode("utf-8")

    # serve's /metrics: registered in its registry --------------------------------------------
    def collect(self) -> Iterator[CounterMetricFamily]:
        failures = CounterMetricFamily(
            "stethoscope_scrape_failures",
            "scrapes of an exporter endpoint that did not answer or not in the text format",
            labels=["node", "exporter", "url"],
        )
        exporter_of = {(t.node_id, t.url): t.exporter for t in self.targets}
        for (node, url), count in sorted(self.stats.failures.items()):
            failures.add_metric([node, exporter_of.get((node, url), ""), redact(url)], count)
        yield failures
        for name, help_text, counts in (
            ("stethoscope_scrape_rows", "rows the exporters' scrapes handed to the store", self.stats.rows),
            (
                "stethoscope_scrape_samples_unmapped",
                "exporter samples no entry of the table maps",
                self.stats.unmapped,
            ),
        ):
            family = CounterMetricFamily(name, help_text, labels=["exporter"])
            for exporter in EXPORTERS:
                family.add_metric([exporter], counts[exporter])
            yield family


def scraper_of(inventory: Any, default_interval: float) -> Scraper | None:
    """serve's scraper of the inventory's endpoints, every `stethoscope_scrape_interval` seconds (else
    `default_interval`, the sweeps'); None when no host lists one. ConfigError on a bad entry."""
    from stethoscope.store.dsn import ConfigError
    from stethoscope.telemetry.exporters import ExporterTableError, default_table

    try:
        targets = scrape_targets(inventory.path)
        table = default_table() if targets else None
    except (ValueError, ExporterTableError) as exc:
        raise ConfigError(f"inventory {inventory.path}: {exc}") from None
    if table is None:
        return None
    interval = inventory.settings.get("stethoscope_scrape_interval") or default_interval
    try:
        seconds = positive_seconds(interval, least=TIMER_FLOOR_SECONDS)
    except ValueError as exc:
        raise ConfigError(f"stethoscope_scrape_interval: {exc}") from None
    return Scraper(targets, table, seconds)
