"""The node's push agent (docs/design.md "Telemetry"): every period, read, send the new sample of each part
and re-send the previous REDUNDANCY, over UDP to each collector it is given (two: the stream goes on
while one restarts; the store keeps each sample once).

Standard library only (NVML through nvidia-ml-py where installed) and Python 3.8-compatible: the
push_agent role copies this file, wire.py, sysfs_devices.py (the modules' own NVMe discovery,
plugins/module_utils) and the node's metric set (JSON) to the node and runs

    python3 agent.py --config /etc/stethoscope/agent.json

Reads come from NVML, or from sysfs/procfs under `root` (a prefix, as the modules take: the lab's
nodes are folders), never from a subprocess. A read that fails leaves its slot missing (NaN), never
zero, and is counted; nothing a node can throw at a read or a send stops the loop. The boot epoch
is a counter kept in `state_dir` (next_boot_epoch), so that it never moves back with the clock.
"""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable

try:
    from stethoscope.telemetry import sysfs_devices, wire
except ImportError:  # on a node: copied beside this file
    import sysfs_devices  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]

NAN = float("nan")

# reader -> (scope, kind, scale): scope "gpu" reads per GPU, "node" per device of the node (a port,
# a PCIe function, a disk); counters are sent as their rate over the period, times scale.
READERS: dict[str, tuple[str, str, float]] = {
    "gpu.temperature": ("gpu", "gauge", 1.0),
    "gpu.memory_temperature": ("gpu", "gauge", 1.0),
    "gpu.power": ("gpu", "gauge", 1.0),
    "gpu.sm_clock": ("gpu", "gauge", 1.0),
    "gpu.memory_clock": ("gpu", "gauge", 1.0),
    "gpu.utilization": ("gpu", "gauge", 1.0),
    "gpu.memory_used": ("gpu", "gauge", 1.0),
    "gpu.pcie_rx": ("gpu", "gauge", 1.0),
    "gpu.pcie_tx": ("gpu", "gauge", 1.0),
    "gpu.throttle_reasons": ("gpu", "gauge", 1.0),
    "gpu.pcie_link_gen": ("gpu", "gauge", 1.0),
    "gpu.pcie_link_width": ("gpu", "gauge", 1.0),
    "gpu.ecc_corrected": ("gpu", "counter", 1.0),
    "gpu.pcie_replay": ("gpu", "counter", 1.0),
    "ib.state": ("node", "gauge", 1.0),
    "ib.rcv_data": ("node", "counter", 32 / 1e9),  # port_rcv_data counts 4-byte words
    "ib.xmit_data": ("node", "counter", 32 / 1e9),
    "ib.xmit_wait": ("node", "counter", 1.0),
    "ib.rcv_errors": ("node", "counter", 1.0),
    "ib.symbol_errors": ("node", "counter", 1.0),
    "rdma.drops": ("node", "counter", 1.0),
    "aer.correctable": ("node", "counter", 1.0),
    "nvme.temperature": ("node", "gauge", 1.0),
}
IB_COUNTERS = {
    "ib.rcv_data": "counters/port_rcv_data",
    "ib.xmit_data": "counters/port_xmit_data",
    "ib.xmit_wait": "counters/port_xmit_wait",
    "ib.rcv_errors": "counters/port_rcv_errors",
    "ib.symbol_errors": "counters/symbol_error",
}
# Receive-side drops of a port, as the sweep counts them (rdma_facts, module_utils/collect_rdma.py
# DROP_COUNTERS): out_of_buffer (no receive WQE posted) plus the port's physical rx discards, those
# present summed, so that rdma_qps_dropped_per_second means one thing at both cadences.
RDMA_DROP_COUNTERS = ("hw_counters/out_of_buffer", "hw_counters/rx_discards_phy")
REDISCOVER_PERIODS = 60  # devices appear and go (a port reset, a hot-plugged disk)
EPOCH_FILE = "boot_epoch"  # in the agent's state folder (config "state_dir")
MAX_EPOCH = 2**32 - 1  # the wire's boot epoch is 32 bits


def _aggregate(how: str | None, values: Iterable[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    if not present:
        return NAN
    if how == "max":
        return max(present)
    if how == "min":
        return min(present)
    if how == "sum":
        return sum(present)
    if how == "avg":
        return sum(present) / len(present)
    if how == "or":
        bits = 0
        for value in present:
            bits |= int(value)
        return float(bits)
    return present[0]


class Counters:
    def __init__(self) -> None:
        self.periods = 0
        self.sent = 0
        self.send_errors = 0
        self.read_errors = 0

    def line(self) -> str:
        return "periods=%d sent=%d send_errors=%d read_errors=%d" % (
            self.periods,
            self.sent,
            self.send_errors,
            self.read_errors,
        )


class SysfsSource:
    """The node's own devices under a root prefix: IB/RDMA port counters, AER, NVMe temperature."""

    def __init__(self, root: str, counters: Counters):
        self.root = root.rstrip("/") or ""
        self.counters = counters
        self._paths: dict[str, list[tuple[str, tuple[str, ...]]]] = {}

    def discover(self) -> None:
        paths: dict[str, list[tuple[str, tuple[str, ...]]]] = collections.defaultdict(list)
        for port in sorted(glob.glob(self.root + "/sys/class/infiniband/*/ports/*")):
            device = port[len(self.root) + len("/sys/class/infiniband/") :].replace("/ports/", "/")
            paths["ib.state"].append((device, (port + "/state",)))
            for reader, relative in IB_COUNTERS.items():
                if os.path.exists(port + "/" + relative):
                    paths[reader].append((device, (port + "/" + relative,)))
            drops = tuple(port + "/" + c for c in RDMA_DROP_COUNTERS if os.path.exists(port + "/" + c))
            if drops:
                paths["rdma.drops"].append((device, drops))
        for aer in sorted(glob.glob(self.root + "/sys/bus/pci/devices/*/aer_dev_correctable")):
            paths["aer.correctable"].append((aer.split("/")[-2], (aer,)))
        for controller, temp in sysfs_devices.nvme_temperature_inputs(self.root or "/"):
            paths["nvme.temperature"].append((controller, (temp,)))
        self._paths = dict(paths)

    def read(self) -> dict[str, dict[str, float]]:
        readings: dict[str, dict[str, float]] = {}
        for reader, entries in self._paths.items():
            # a device read from several files (a port's drop counters) is their sum
            readings[reader] = {
                device: sum(self._value(reader, path) for path in files) for device, files in entries
            }
        return readings

    def _value(self, reader: str, path: str) -> float:
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                text = handle.read()
            if reader == "ib.state":  # "4: ACTIVE"
                return float(text.split(":", 1)[0])
            if reader == "aer.correctable":
                for line in text.splitlines():
                    if line.startswith("TOTAL_ERR_COR"):
                        return float(line.split()[1])
                raise ValueError("no TOTAL_ERR_COR line")
            if reader == "nvme.temperature":
                return float(text) / 1000.0
            return float(text)
        except (OSError, ValueError, IndexError):
            self.counters.read_errors += 1
            return NAN


# nvidia-smi --query-gpu column -> reader (the recorded capture the lab replays)
CAPTURE_COLUMNS = {
    "temperature.gpu": "gpu.temperature",
    "temperature.memory": "gpu.memory_temperature",
    "power.draw [W]": "gpu.power",
    "clocks.current.sm [MHz]": "gpu.sm_clock",
    "clocks.current.memory [MHz]": "gpu.memory_clock",
    "utilization.gpu [%]": "gpu.utilization",
    "memory.used [MiB]": "gpu.memory_used",
    "pcie.link.gen.current": "gpu.pcie_link_gen",
    "pcie.link.width.current": "gpu.pcie_link_width",
    "clocks_event_reasons.active": "gpu.throttle_reasons",
    "clocks_throttle_reasons.active": "gpu.throttle_reasons",
    "ecc.errors.corrected.volatile.total": "gpu.ecc_corrected",
}


def _number(text: str) -> float:
    text = text.strip()
    if text.lower().startswith("0x"):
        return float(int(text, 16))
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return NAN  # "N/A", "[N/A]", "[Not Supported]": missing


class CaptureSource:
    """A recorded `nvidia-smi --query-gpu ... -lms` capture, one time step per period, cycling."""

    def __init__(self, path: str):
        steps: list[dict[int, dict[str, float]]] = [{}]
        with open(path, encoding="utf-8") as handle:
            rows = list(csv.reader(handle, skipinitialspace=True))
        header = [name.strip() for name in rows[0]]
        for row in rows[1:]:
            if len(row) != len(header):
                continue
            fields = dict(zip(header, row))
            gpu = int(fields["index"])
            if gpu in steps[-1]:  # the capture polled every GPU once per step
                steps.append({})
            steps[-1][gpu] = {
                reader: _number(fields[column])
                for column, reader in CAPTURE_COLUMNS.items()
                if column in fields
            }
        self._steps = steps
        self._next = 0

    def read(self) -> list[dict[str, float]]:
        step = self._steps[self._next % len(self._steps)]
        self._next += 1
        return [step[gpu] for gpu in sorted(step)]


class NvmlSource:
    """GPUs through NVML (nvidia-ml-py); each call on its own, so one unsupported query costs one slot."""

    def __init__(self, counters: Counters):
        import pynvml  # type: ignore[import-not-found]

        self.nvml = pynvml
        self.counters = counters
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self) -> list[dict[str, float]]:
        n = self.nvml
        throttle = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        queries: dict[str, Callable[[Any], float]] = {
            "gpu.temperature": lambda h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "gpu.memory_temperature": lambda h: (
                n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_MEMORY_TEMP])[0].value.uiVal
            ),
            "gpu.power": lambda h: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "gpu.sm_clock": lambda h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "gpu.memory_clock": lambda h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            "gpu.utilization": lambda h: n.nvmlDeviceGetUtilizationRates(h).gpu,
            "gpu.memory_used": lambda h: n.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            "gpu.pcie_rx": lambda h: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) / 1000.0,
            "gpu.pcie_tx": lambda h: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) / 1000.0,
            "gpu.throttle_reasons": lambda h: throttle(h) if throttle else NAN,
            "gpu.pcie_link_gen": n.nvmlDeviceGetCurrPcieLinkGeneration,
            "gpu.pcie_link_width": n.nvmlDeviceGetCurrPcieLinkWidth,
            "gpu.ecc_corrected": lambda h: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
            ),
            "gpu.pcie_replay": n.nvmlDeviceGetPcieReplayCounter,
        }
        gpus = []
        for handle in self.handles:
            values = {}
            for reader, query in queries.items():
                try:
                    values[reader] = float(query(handle))
                except Exception:  # NVMLError_NotSupported and kin: the slot is missing
                    self.counters.read_errors += 1
                    values[reader] = NAN
            gpus.append(values)
        return gpus


class Rates:
    """Counters to rates over the period; the first reading and a counter reset give a missing value."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[float, float]] = {}

    def __call__(self, reader: str, device: str, value: float, now: float) -> float:
        previous = self._last.get((reader, device))
        self._last[(reader, device)] = (value, now)
        if previous is None or math.isnan(value) or math.isnan(previous[0]) or now <= previous[1]:
            return NAN
        if value < previous[0]:
            return NAN
        return (value - previous[0]) / (now - previous[1]) * READERS[reader][2]


class Agent:
    def __init__(
        self,
        config: dict[str, Any],
        sock: Any = None,
        gpu_source: Any = None,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.clock = clock  # the node's wall clock (a test gives one that is wrong, then corrected)
        self.metric_set = config["set"]
        self.period = float(config.get("period") or self.metric_set.get("period") or 5)
        self.node_key = int(config["node_key"])
        self.key = bytes.fromhex(config["key"])
        self.counters = Counters()
        self.sysfs = SysfsSource(str(config.get("root") or "/"), self.counters)
        self.sysfs.discover()  # tick() counts the period before it samples: the first has devices too
        self.gpu_source = gpu_source if gpu_source is not None else _gpu_source(config, self.counters)
        self.gpu_parts = bool(config.get("gpu_parts", True))
        self._given_sock = sock is not None  # a test's: it takes every family's datagrams
        self.sock = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sockets: dict[int, Any] = {}  # other families' (IPv6), made at their first send
        self.addresses = collector_addresses(config["collector"])
        # host names are looked up here, not by each sendto; a name that does not resolve is a setting
        # to fix (exit 2, systemd restarts the agent)
        self._targets: list[Any] = [resolve(address) for address in self.addresses]
        self.boot_epoch = int(config.get("boot_epoch") or self._next_boot_epoch(config.get("state_dir")))
        self.rates = Rates()
        self._history: dict[int, collections.deque[bytes]] = collections.defaultdict(
            lambda: collections.deque(maxlen=wire.REDUNDANCY)
        )
        self.stop = threading.Event()

    def _next_boot_epoch(self, state_dir: str | None) -> int:
        epoch, problem = next_boot_epoch(state_dir, self.clock)
        if problem:
            print(
                "stethoscope-agent: boot epoch not kept in %s: the clock's seconds instead "
                "(a collector re-synchronises within a minute should the clock move back)" % problem,
                file=sys.stderr,
            )
        return epoch

    # one period ---------------------------------------------------------------------------------
    def sample(self, now: float) -> dict[int, list[float]]:
        """Values per part number for this period."""
        if self.counters.periods % REDISCOVER_PERIODS == 0:
            self.sysfs.discover()
        node = {reader: self._rates(reader, devices, now) for reader, devices in self.sysfs.read().items()}
        gpus: list[dict[str, float]] = []
        if self.gpu_source is not None:
            try:
                gpus = self.gpu_source.read()
            except Exception:  # a GPU source that fails whole (driver gone) leaves GPU slots missing
                self.counters.read_errors += 1
        gpus = [
            {reader: self._rate(reader, "gpu%d" % index, value, now) for reader, value in gpu.items()}
            for index, gpu in enumerate(gpus)
        ]
        parts: dict[int, list[float]] = {}
        slots = self.metric_set["parts"]
        values = []
        for slot in slots["node"]:
            if READERS.get(slot["read"], ("",))[0] == "gpu":
                values.append(_aggregate(slot.get("agg"), (gpu.get(slot["read"], NAN) for gpu in gpus)))
            else:
                values.append(_aggregate(slot.get("agg"), node.get(slot["read"], {}).values()))
        parts[wire.NODE_PART] = values
        if self.gpu_parts and "gpu" in slots:
            for index, gpu in enumerate(gpus):
                parts[index + 1] = [gpu.get(slot["read"], NAN) for slot in slots["gpu"]]
        return parts

    def _rates(self, reader: str, devices: dict[str, float], now: float) -> dict[str, float]:
        return {device: self._rate(reader, device, value, now) for device, value in devices.items()}

    def _rate(self, reader: str, device: str, value: float, now: float) -> float:
        spec = READERS.get(reader)
        if spec is None:
            return NAN
        return self.rates(reader, device, value, now) if spec[1] == "counter" else value

    def tick(self, seq: int, now: float) -> None:
        """Read, encode and send this period's samples, then re-send the previous ones."""
        self.counters.periods += 1
        try:
            parts = self.sample(now)
        except Exception:  # a reader bug must not stop the stream: this period is missing
            self.counters.read_errors += 1
            return
        for part, values in parts.items():
            datagram = wire.encode(
                self.key,
                set_id=int(self.metric_set["id"]),
                node_key=self.node_key,
                part=part,
                boot_epoch=self.boot_epoch,
                seq=seq,
                ts_ms=int(now * 1000),
                values=values,
            )
            history = self._history[part]
            for copy in [datagram, *reversed(history)]:
                self.send(copy)
            history.append(datagram)

    def send(self, datagram: bytes) -> None:
        for index, address in enumerate(self.addresses):
            try:
                family, sockaddr = self._targets[index] or resolve(address)
                self._targets[index] = (family, sockaddr)
                self._socket(family).sendto(datagram, sockaddr)
                self.counters.sent += 1
            except (OSError, ValueError):  # a full buffer, no route, a port closed: the resends cover it
                self.counters.send_errors += 1
                self._targets[index] = None  # the collector may have moved: looked up at the next send

    def _socket(self, family: int) -> Any:
        if family == socket.AF_INET or self._given_sock:
            return self.sock
        if family not in self._sockets:
            self._sockets[family] = socket.socket(family, socket.SOCK_DGRAM)
        return self._sockets[family]

    def run(self, duration: float | None = None) -> Counters:
        """Tick on a fixed schedule (no drift); one sequence number per sample made, so the collector's
        loss counts samples no copy delivered. A tick that overran its period skips to the next slot:
        the gap shows in the timestamps."""
        start = time.time()
        seq = 0
        while not self.stop.is_set():
            now = time.time()
            if duration is not None and now - start >= duration:
                break
            self.tick(seq, now)
            seq += 1
            slot = int((time.time() - start) // self.period) + 1
            self.stop.wait(max(0.0, start + slot * self.period - time.time()))
        return self.counters


def next_boot_epoch(state_dir: str | None, clock: Callable[[], float] = time.time) -> tuple[int, str | None]:
    """This start's boot epoch, and why it could not be kept where it was not.

    A counter in `<state_dir>/boot_epoch`, written and fsynced before the first datagram: one more
    than the last start's, so that it never moves back with the clock and a collector never refuses
    this start's samples as replays of the last one's; and never below the clock's seconds, so that
    it stays above the epochs of an agent before it, or of a start that could not write the file.
    Without a state folder, or one that cannot be written, the clock's seconds (the collector's
    re-sync covers a clock that moved back: docs/design.md "Telemetry")."""
    now = min(int(clock()), MAX_EPOCH)
    if not state_dir:
        return now, None
    path = os.path.join(state_dir, EPOCH_FILE)
    last = _read_epoch(path)
    epoch = now if last is None else min(max(last + 1, now), MAX_EPOCH)
    try:
        _write_epoch(path, epoch)
    except OSError as exc:
        return now, "%s (%s)" % (state_dir, exc.strerror or exc)
    return epoch, None


def _read_epoch(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):  # none yet, or damaged: the clock seeds it again
        return None
    return value if 0 <= value <= MAX_EPOCH else None


def _write_epoch(path: str, epoch: int) -> None:
    """Atomically and durably: a crash right after leaves the old epoch or the new one, never none."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    part = path + ".part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write("%d\n" % epoch)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(part, path)
    folder_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)


def _gpu_source(config: dict[str, Any], counters: Counters) -> Any:
    source = str(config.get("gpu_source") or "auto")
    if source == "none":
        return None
    if source.startswith("capture:"):
        return CaptureSource(source[len("capture:") :])
    try:
        return NvmlSource(counters)
    except Exception:  # no nvidia-ml-py or no driver: a node without GPU slots
        if source == "nvml":
            raise
        return None


def collector_addresses(value: Any) -> list[tuple[str, int]]:
    """The collectors of the configuration's `collector`: one HOST:PORT, or a list of them."""
    texts = list(value) if isinstance(value, (list, tuple)) else [value]
    if not texts:
        raise ValueError("collector: no HOST:PORT given")
    return [_address(text) for text in texts]


def resolve(address: tuple[str, int]) -> tuple[int, tuple]:
    """(family, socket address) of a collector's HOST, PORT: its first address (IPv4 or IPv6), or
    ValueError naming it."""
    host, port = address
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)
    except OSError as exc:
        raise ValueError("collector %s:%d: cannot look it up: %s" % (host, port, exc)) from None
    family, _type, _proto, _name, sockaddr = infos[0]
    return family, sockaddr


def _address(text: str) -> tuple[str, int]:
    host, _colon, port = str(text).rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("collector %r: expected HOST:PORT" % (text,))
    return host.strip("[]") or "127.0.0.1", int(port)


def load_config(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    if "set" not in config:
        with open(config["set_file"], encoding="utf-8") as handle:
            config["set"] = json.load(handle)
    if "key" not in config:
        with open(config["key_file"], encoding="ascii") as handle:
            config["key"] = handle.read().strip()
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--config",
        required=True,
        help="agent.json (collector, node_key, key_file, set_file, root, state_dir)",
    )
    parser.add_argument(
        "--collector",
        action="append",
        help="HOST:PORT to send to, repeatable: each datagram goes to each (default: the config's collector)",
    )
    parser.add_argument(
        "--duration", type=float, help="stop after this many seconds (default: run until stopped)"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if args.collector:
            config["collector"] = args.collector
        agent = Agent(config)
    except (OSError, ValueError, KeyError) as exc:
        print("stethoscope-agent: %s: %s" % (args.config, exc), file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    counters = agent.run(args.duration)
    print("stethoscope-agent: stopped: " + counters.line(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
