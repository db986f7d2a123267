"""The stream's replay window, kept across restarts: per node, part, job and rank the agent's boot
epoch, the highest sequence and those seen within the resend horizon, so that an exact replay of a
signed datagram stays refused after the collector restarts.

One small JSON file under the state folder (`telemetry/replay-<port>.json`), rewritten atomically by
the collector's writing thread at most every few seconds, never per datagram. Streams silent for
longer than the freshness window are left out: a replay of them is refused as stale anyway. Replays
of what arrived after the last save are accepted once more after a crash: they are identical rows,
which the store's Replacing engine folds. Nodes are named, not numbered, so that a key handed to
another node does not inherit a window.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from stethoscope.telemetry import wire

log = logging.getLogger(__name__)
SAVE_EVERY = 5.0  # seconds


class ReplayState:
    def __init__(self, path: Path, every: float = SAVE_EVERY, freshness_ms: int = wire.FRESHNESS_MS):
        self.path = path
        self.every = every
        self.freshness_ms = freshness_ms
        self._saved_at = 0.0

    @classmethod
    def under(cls, folder: Path, port: int) -> ReplayState:
        return cls(folder / f"replay-{port}.json")

    def load(self, guard: wire.SequenceGuard, nodes: dict[int, str], now_ms: int) -> int:
        """Give `guard` the windows saved for the nodes in `nodes` (node key -> node_id); how many."""
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            streams = saved["streams"]
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("collector: replay window %s unreadable (%s): starting without it", self.path, exc)
            return 0
        keys = {node: key for key, node in nodes.items()}
        entries = []
        for item in streams if isinstance(streams, list) else []:
            try:
                key = keys.get(item["node"])
                if key is None or int(item["ts"]) < now_ms - self.freshness_ms:
                    continue
                stream = (key, int(item["part"]), int(item["job"]), int(item["rank"]))
                seen = [int(seq) for seq in item["seen"]]
                entries.append(
                    (stream, int(item["epoch"]), int(item["high"]), int(item["low"]), seen, int(item["ts"]))
                )
            except (KeyError, TypeError, ValueError):
                continue  # one damaged entry costs its stream only
        guard.restore(entries)
        return len(entries)

    def due(self) -> bool:
        return time.monotonic() - self._saved_at >= self.every

    def snapshot(self, guard: wire.SequenceGuard, nodes: dict[int, str], now_ms: int) -> list[dict]:
        """The windows to save (taken under the collector's lock, written outside it)."""
        return [
            {"node": nodes[stream[0]], "part": stream[1], "job": stream[2], "rank": stream[3], "epoch": epoch,
             "high": high, "low": low, "seen": seen, "ts": newest}
            for stream, epoch, high, low, seen, newest in guard.export(now_ms - self.freshness_ms)
            if stream[0] in nodes
        ]  # fmt: skip

    def save(self, streams: list[dict]) -> None:
        self._saved_at = time.monotonic()
        part = self.path.with_name(f"{self.path.name}.{os.getpid()}.part")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": 1, "streams": streams}, handle, separators=(",", ":"))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(part, self.path)
        except OSError as exc:  # the window is a guard, the rows matter more: the stream goes on
            log.warning("collector: replay window not saved to %s: %s", self.path, exc.strerror)
