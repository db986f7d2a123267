# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
name: clickhouse
type: aggregate
short_description: Stores every stethoscope task result in ClickHouse
version_added: "0.1.0"
description:
  - Ingests every task result that carries C(stethoscope_metrics), C(stethoscope_bench) or
    C(ansible_facts.stethoscope_*) (it knows no module by name), and the inventory topology (rack,
    switch, groups, slurm_name) into the C(nodes) table.
  - Rows are batched and written from the controller's main process at I(batch_size) and at the end
    of the playbook, through the C(stethoscope) controller package (embedded chdb or a server).
  - A write that fails or runs past I(timeout) is spooled (fsynced NDJSON) and replayed on the next
    write; the play is never failed or stalled by the sink, and results are never modified. After one
    timeout the rest of that play is spooled without waiting.
  - Rows the spool cannot take either (its disk full or read-only), or that an unexpected error kept
    from being written, are held in memory (at most I(hold_rows)) and written again at the next flush
    and at the end of the playbook; one warning says so, and the end-of-run warning counts any that
    were lost.
  - Items of a looped task (C(results)) are ingested like results of their own. A value that is not a
    finite number (NaN, Inf, text) is counted in the one warning at the end and kept with its reason in
    C(<spool_dir>/rejected/); the other rows of that result are stored.
  - A host the play cannot reach gets C(ansible_host_unreachable) = 1 (device C(node)); every host a
    sweep reached gets 0, so the series resolves when the host comes back.
requirements:
  - the C(stethoscope) Python package (distribution C(aicluster-stethoscope)) in the Python that runs
    C(ansible-playbook) on the controller (the project's wheel, C(pip wheel . --no-deps) then
    C(pip install dist/aicluster_stethoscope-*.whl); or
    C(pip install -e .) in a checkout). The collection's C(requirements.txt) and
    C(meta/execution-environment.yml) declare it. Without it the callback warns once and stores nothing.
options:
  dsn:
    description:
      - clickhouse-connect DSN; default the embedded database C(db) in the state folder
        (C($STETHOSCOPE_HOME/.stethoscope), else C(.stethoscope) of a checkout run from, else
        C(${XDG_STATE_HOME:-~/.local/state}/stethoscope)).
    type: str
    env:
      - name: STETHOSCOPE_DSN
    ini:
      - section: callback_clickhouse
        key: dsn
  database:
    description: Database name.
    type: str
    default: stethoscope
    env:
      - name: STETHOSCOPE_DATABASE
    ini:
      - section: callback_clickhouse
        key: database
  batch_size:
    description: Metric rows buffered before a write.
    type: int
    default: 5000
    env:
      - name: STETHOSCOPE_BATCH_SIZE
    ini:
      - section: callback_clickhouse
        key: batch_size
  spool_dir:
    description: Folder of the spool; default C(spool) in the state folder (see I(dsn)).
    type: path
    env:
      - name: STETHOSCOPE_SPOOL_DIR
    ini:
      - section: callback_clickhouse
        key: spool_dir
  timeout:
    description: Seconds a write may take before its rows are spooled instead.
    type: float
    default: 10
    env:
      - name: STETHOSCOPE_WRITE_TIMEOUT
    ini:
      - section: callback_clickhouse
        key: timeout
  hold_rows:
    description:
      - Rows held in memory when they can be neither stored nor spooled, until a later flush writes
        them; beyond it the oldest are dropped and counted as lost in the end-of-run warning.
    type: int
    default: 2000000
    env:
      - name: STETHOSCOPE_HOLD_ROWS
    ini:
      - section: callback_clickhouse
        key: hold_rows
"""

import json
import sys
import time
import uuid
from collections import Counter

from ansible.plugins.callback import CallbackBase

try:
    from stethoscope.catalog import default_catalog
    from stethoscope.paths import default_spool_dir
    from stethoscope.store.batch import Batch
    from stethoscope.store.dsn import ConfigError, redact
    from stethoscope.store.hold import Hold, held_rows
    from stethoscope.store.result_rows import carries_rows, rows_from_result
    from stethoscope.store.spool import Spool
    from stethoscope.store.writer import Writer

    IMPORT_ERROR = None
except ImportError as exc:  # the controller package (or one of its dependencies) is not installed here
    IMPORT_ERROR = exc


def _import_warning(exc):
    """One line a human can act on, naming what is missing, instead of a traceback."""
    missing = exc.name or ""
    if missing == "stethoscope" or missing.startswith("stethoscope."):
        what = "the controller package 'stethoscope' is not installed in this Python"
    elif missing:
        what = "'stethoscope' cannot be imported: its dependency %r is missing" % missing
    else:
        what = "'stethoscope' cannot be imported: %s" % exc
    return (
        "aicluster.stethoscope.clickhouse: %s (%s), so no result is stored. Install it where "
        "ansible-playbook runs: pip install aicluster-stethoscope (the wheel built from the project "
        "repository: pip wheel . --no-deps; see the collection's requirements.txt)" % (what, sys.executable)
    )


UNREACHABLE = "ansible_host_unreachable"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "aicluster.stethoscope.clickhouse"
    CALLBACK_NEEDS_ENABLED = True
    _import_warned = False

    def __init__(self, display=None):
        super().__init__(display=display)
        self.disabled = IMPORT_ERROR is not None
        self._batch = Batch() if not self.disabled else None
        self._writer = None
        self._hold = None  # rows neither stored nor spooled, written again at the next flush
        self._held_reason = None  # why the last rows were held
        self._config_error = None
        self._run_id = uuid.uuid4().hex
        self._warned = set()
        self._catalog = None
        self._topology = {}  # host -> nodes row, from the inventory at play start
        self._recorded = set()  # hosts whose nodes row this run has queued
        self._rejected = Counter()  # reason -> values not stored
        self._timeouts = 0
        self._spooled = 0
        self._spool_only = False  # this play's sink timed out once: no more waiting in it
        self._reached, self._unreachable, self._play_rows = set(), set(), False
        if self.disabled and not CallbackModule._import_warned:  # once a process, not per instance
            CallbackModule._import_warned = True
            self._display.warning(_import_warning(IMPORT_ERROR))

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        if self.disabled:
            return
        self._batch_size = max(1, int(self.get_option("batch_size")))
        self._spool_dir = self.get_option("spool_dir")
        self._hold = Hold(max(0, int(self.get_option("hold_rows"))))
        try:
            self._writer = Writer(
                self.get_option("dsn"),
                self._spool_dir,
                float(self.get_option("timeout")),
                database=self.get_option("database"),
            )
        except ConfigError as exc:  # a setting to fix: nothing is spooled for a database that cannot be
            self._config_error = redact(exc)
            self._warn_once("config", "configuration error, rows not stored: %s" % self._config_error)
        try:
            self._catalog = default_catalog()
        except Exception as exc:  # a broken catalog must not stop the play; rows are still stored
            self._warn_once("catalog", "metric catalog unreadable (%s): names not checked" % exc)

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            self._display.warning("stethoscope: %s" % message)

    # plays and inventory topology ---------------------------------------------------------------
    def v2_playbook_on_play_start(self, play):
        if self.disabled:
            return
        self._end_play()
        self._spool_only = False
        try:
            manager = play.get_variable_manager()
            inventory = manager._inventory
            now = int(time.time() * 1000)
            for host in inventory.get_hosts(play.hosts):
                host_vars = manager.get_vars(play=play, host=host, include_hostvars=False)
                self._topology[host.get_name()] = {
                    "node_id": host.get_name(),
                    "slurm_name": str(host_vars.get("slurm_name") or host.get_name()),
                    "rack": str(host_vars.get("rack") or ""),
                    "switch": str(host_vars.get("switch") or ""),
                    "groups": sorted(g.get_name() for g in host.get_groups() if g.get_name() != "all"),
                    "updated_at": now,
                }
        except Exception as exc:  # topology is a nicety; the sweep's rows matter more
            self._warn_once("topology", "inventory topology not recorded: %s" % exc)

    def _end_play(self):
        """Reached hosts of a sweep report ansible_host_unreachable 0: a rule sees the host come back."""
        if self._play_rows or self._unreachable:
            now = int(time.time() * 1000)
            for node_id in sorted(self._reached - self._unreachable):
                self._node_row(node_id)
                self._batch.metrics.append(node_id, UNREACHABLE, "node", {}, 0.0, now)
        self._reached, self._unreachable, self._play_rows = set(), set(), False

    def _node_row(self, node_id):
        if node_id not in self._recorded and node_id in self._topology:
            # only nodes that report: a play on localhost or a verify step is no cluster node
            self._recorded.add(node_id)
            self._batch.nodes.append(self._topology[node_id])

    # task results -------------------------------------------------------------------------------
    def v2_runner_on_ok(self, result):
        self._ingest(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._ingest(result)  # a failed collector still returns the rows of those that answered

    def v2_runner_on_unreachable(self, result):
        if self.disabled:
            return
        node_id = result._host.get_name()
        self._unreachable.add(node_id)
        self._node_row(node_id)
        self._batch.metrics.append(node_id, UNREACHABLE, "node", {}, 1.0, int(time.time() * 1000))
        self._maybe_flush()

    def _ingest(self, result):
        if self.disabled:
            return
        data = result._result
        node_id = result._host.get_name()
        # a delegated task (the lab's advance step on localhost) says nothing about its host
        if not (result._task_fields or {}).get("delegate_to"):
            self._reached.add(node_id)
        if not isinstance(data, dict) or not carries_rows(data):
            return
        self._play_rows = True
        self._node_row(node_id)
        rows = rows_from_result(node_id, data, self._run_id, int(time.time() * 1000))
        if self._catalog is not None:
            for name in set(rows.metrics.metric_name):
                if name not in self._catalog:
                    self._warn_once(
                        "metric:" + name,
                        "metric %r from %s is not in rules/metrics.yml (stored anyway)" % (name, node_id),
                    )
        self._rejected.update(row["reason"] for row in rows.rejected)
        self._batch.metrics.extend(rows.metrics)
        self._batch.facts.extend(rows.facts)
        self._batch.bench.extend(rows.bench)
        self._batch.fingerprints.extend(rows.fingerprints)
        self._batch.rejected.extend(rows.rejected)
        self._maybe_flush()

    def _maybe_flush(self):
        if len(self._batch.metrics) >= self._batch_size or self._batch.bench:
            self._flush()

    def v2_playbook_on_stats(self, stats):
        if self.disabled:
            return
        self._end_play()
        self._flush()
        self._give_up_held()
        self._summary()

    def _flush(self):
        batch = self._hold.take() if self._hold is not None else Batch()
        batch.extend(self._batch.take())  # what waited first
        if not held_rows(batch):
            return
        if self._writer is None:
            self._keep_rejected(batch)
            return
        try:
            report = self._writer.write(batch, spool_only=self._spool_only)
        except ConfigError as exc:  # an option ClickHouse refuses: known only once it is tried
            self._config_error = redact(exc)
            self._warn_once("config", "configuration error, rows not stored: %s" % self._config_error)
            self._writer = None
            self._keep_rejected(batch)
            return
        except Exception as exc:  # whatever else the writer raises, the play goes on and the rows wait
            self._keep(batch, "writing failed unexpectedly (%s: %s)" % (type(exc).__name__, redact(exc)))
            return
        if held_rows(report.held):
            store = " (ClickHouse: %s)" % report.error if report.error else ""
            self._keep(report.held, "%s%s" % (report.spool_error, store))
        for problem in report.problems:
            self._warn_once("spool:" + problem, "spool: " + problem)
        self._spooled += report.spooled
        if report.timed_out:
            self._timeouts += 1
            self._spool_only = True
        if (report.error and report.spooled and not self._spool_only) or report.timed_out:
            self._warn_once(
                "write-error",
                "ClickHouse write failed (%s); rows spooled and replayed on the next write" % report.error,
            )
        elif report.replayed:
            self._display.vv("stethoscope: replayed %d spooled rows" % report.replayed)
        self._display.vv("stethoscope: %s" % json.dumps(report.summary()))

    def _keep(self, batch, why):
        """Rows neither stored nor spooled wait in memory, bounded, for the next flush."""
        self._hold.keep(batch)
        self._held_reason = why
        self._warn_once(
            "held",
            "%s: rows kept in memory and written again at the next flush and at the end of the playbook"
            % why,
        )

    def _give_up_held(self):
        """Rows still held at the end of the playbook go with the process: counted as lost."""
        if self._hold is not None:
            self._hold.lost += held_rows(self._hold.take())

    def _keep_rejected(self, batch):
        """Under a configuration error the rows go where a person can find them, with the reason."""
        try:
            Spool(self._spool_dir or default_spool_dir()).reject_batch(batch, self._config_error)
        except OSError as exc:
            self._warn_once("rejected", "rows could not be kept: %s" % exc)

    def _summary(self):
        """The one end-of-run warning: values not stored, timeouts, rows spooled."""
        parts = []
        if self._rejected:
            kinds = ", ".join("%s %d" % (reason, n) for reason, n in sorted(self._rejected.items()))
            parts.append(
                "%d values not stored (%s), kept with their reason in %s/rejected/"
                % (sum(self._rejected.values()), kinds, self._spool_dir or "the spool")
            )
        if self._timeouts:
            parts.append(
                "%d writes timed out (each time the rest of that play was spooled without waiting)"
                % self._timeouts
            )
        if self._spooled:
            parts.append("%d rows spooled in total" % self._spooled)
        if self._hold is not None and self._hold.lost:
            parts.append(
                "%d rows LOST: neither stored nor spooled (%s)" % (self._hold.lost, self._held_reason)
            )
        if parts:
            self._display.warning("stethoscope: " + "; ".join(parts))
