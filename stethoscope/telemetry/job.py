"""A training job's own report (docs/design.md "Telemetry"): step time, throughput, loss variance over a
rolling window and, with CUDA, memory fragmentation, sent as the stream's job part (labels job, rank).

    from stethoscope.telemetry.job import Reporter
    reporter = Reporter(job_id=os.environ["SLURM_JOB_ID"], rank=rank)
    for batch in data:
        loss = train_step(batch)
        reporter.step(samples=len(batch), loss=float(loss))
        # or, where the script times them: reporter.step(..., comm_time=t_allreduce, data_time=t_load)

Standard library only; torch is read only when the script has imported it. `step()` never blocks and
never raises into the training loop: a full socket buffer drops the sample (counted), any error is
counted and swallowed. The collector address and the node's key come from the arguments or from
STETHOSCOPE_COLLECTOR, STETHOSCOPE_NODE_KEY and STETHOSCOPE_NODE_KEY_FILE (or the agent's config).
"""

from __future__ import annotations

import collections
import json
import math
import os
import socket
import statistics
import sys
import time
from typing import Any

try:
    from stethoscope.telemetry import wire
except ImportError:  # copied beside wire.py
    import wire  # type: ignore[no-redef]

# the job part's slots as rules/telemetry.yml orders them (a test checks they agree)
READS = (
    "job.step_time",
    "job.throughput",
    "job.loss_variance",
    "job.fragmentation",
    "job.allreduce_time",
    "job.data_wait",
)
SET_ID = 3  # rules/telemetry.yml's gpu_node set (a test checks they agree); the agent's config wins
AGENT_CONFIG = "/etc/stethoscope/agent.json"


def fragmentation(torch_module: Any = None) -> float:
    """1 - allocated/reserved from torch.cuda.memory_stats(); NaN (absent) without CUDA."""
    torch = torch_module if torch_module is not None else sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return math.nan
    stats = torch.cuda.memory_stats()
    reserved = stats.get("reserved_bytes.all.current", 0)
    if not reserved:
        return math.nan
    return 1.0 - stats.get("allocated_bytes.all.current", 0) / reserved


class Reporter:
    def __init__(
        self,
        job_id: str,
        rank: int = 0,
        collector: str | None = None,
        node_key: int | None = None,
        key: bytes | None = None,
        set_id: int | None = None,
        period: float = 5.0,
        window: int = 100,
        sock: Any = None,
        torch_module: Any = None,
        clock: Any = None,
    ):
        config = _agent_config() if None in (collector, node_key, key) else {}
        self.collector = collector or os.environ.get("STETHOSCOPE_COLLECTOR") or config.get("collector")
        given = node_key if node_key is not None else os.environ.get("STETHOSCOPE_NODE_KEY")
        self.node_key = int(given if given is not None else config.get("node_key", 0))
        self.key = key if key is not None else _read_key(config)
        self.job, self.flags = wire.job_field(str(job_id))
        self.rank = int(rank)
        self.set_id = int(set_id or (config.get("set") or {}).get("id") or SET_ID)
        self.period = period
        self.torch = torch_module
        self.clock = clock or time.time  # the samples' wall time (a replay gives its own)
        self.boot_epoch = int(self.clock())
        self.seq = 0
        self.sent = self.dropped = self.errors = 0
        self._address = _address(self.collector) if self.collector else None
        self._sock = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if sock is None:
            self._sock.setblocking(False)
        self._losses: collections.deque = collections.deque(maxlen=window)
        self._history: collections.deque = collections.deque(maxlen=wire.REDUNDANCY)
        self._last_step: float | None = None
        self._period_start = time.monotonic()
        self._step_times: list = []
        self._comm_times: list = []
        self._data_times: list = []
        self._samples = 0

    def step(
        self,
        samples: int | None = None,
        loss: Any = None,
        step_time: float | None = None,
        comm_time: float | None = None,
        data_time: float | None = None,
    ) -> None:
        """Record one training step (its time is measured between calls unless given) and, where the
        script measures them, the step's time in collectives and waiting for input data; seconds."""
        try:
            now = time.monotonic()
            if step_time is None and self._last_step is not None:
                step_time = now - self._last_step
            self._last_step = now
            if step_time is not None:
                self._step_times.append(float(step_time))
            if comm_time is not None:
                self._comm_times.append(float(comm_time))
            if data_time is not None:
                self._data_times.append(float(data_time))
            if samples:
                self._samples += int(samples)
            if loss is not None:
                value = float(loss)
                if math.isfinite(value):
                    self._losses.append(value)
            if now - self._period_start >= self.period:
                self._report(now)
        except Exception:  # whatever goes wrong here must not reach the training loop
            self.errors += 1

    def _report(self, now: float) -> None:
        elapsed = now - self._period_start
        step_ms, comm_ms, data_ms = (
            statistics.mean(times) * 1000 if times else math.nan
            for times in (self._step_times, self._comm_times, self._data_times)
        )
        throughput = self._samples / elapsed if self._samples and elapsed > 0 else math.nan
        variance = statistics.pvariance(self._losses) if len(self._losses) >= 2 else math.nan
        try:
            frag = fragmentation(self.torch)
        except Exception:  # never raise into the training loop: counted, the slot stays NaN
            self.errors += 1
            frag = math.nan
        values = {
            "job.step_time": step_ms,
            "job.throughput": throughput,
            "job.loss_variance": variance,
            "job.fragmentation": frag,
            "job.allreduce_time": comm_ms,
            "job.data_wait": data_ms,
        }
        self._period_start, self._step_times, self._samples = now, [], 0
        self._comm_times, self._data_times = [], []
        if self._address is None or self.key is None:
            self.dropped += 1
            return
        datagram = wire.encode(
            self.key,
            set_id=self.set_id,
            node_key=self.node_key,
            part=wire.JOB_PART,
            boot_epoch=self.boot_epoch,
            seq=self.seq,
            ts_ms=int(self.clock() * 1000),
            values=[values[read] for read in READS],
            job=self.job,
            rank=self.rank,
            flags=self.flags,
        )
        self.seq += 1
        for copy in [datagram, *reversed(self._history)]:
            try:
                self._sock.sendto(copy, self._address)
                self.sent += 1
            except OSError:  # BlockingIOError on a full buffer included: drop, count, go on
                self.dropped += 1
        self._history.append(datagram)


def _agent_config() -> dict:
    try:
        with open(os.environ.get("STETHOSCOPE_AGENT_CONFIG", AGENT_CONFIG), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _read_key(config: dict) -> bytes | None:
    path = os.environ.get("STETHOSCOPE_NODE_KEY_FILE") or config.get("key_file")
    try:
        if path:
            with open(path, encoding="ascii") as handle:
                return bytes.fromhex(handle.read().strip())
    except (OSError, ValueError):
        return None
    return None


def _address(text: str) -> tuple:
    host, _colon, port = str(text).rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)
