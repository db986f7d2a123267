"""How embedded ClickHouse (chdb through clickhouse-connect, as store.Store opens it) behaves with
several threads of one process: serial vs concurrent queries on one client and on two clients of the
same path, queries while another thread inserts, what a Writer's per-batch open costs with and without
a handle held open, and whether another process can open the path meanwhile. `serve` is designed on
the answers (stethoscope/serve.py).

    python benchmarks/chdb_threads.py [--rows 200000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.store.batch import Batch, MetricColumns  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.store.writer import Writer  # noqa: E402

QUERY = "SELECT node_id, avg(value), quantile(0.99)(value) FROM t.metrics GROUP BY node_id ORDER BY node_id"


def _rows(n: int, start_ms: int, metric: str = "gpu_temperature_celsius") -> MetricColumns:
    columns = MetricColumns()
    for i in range(n):
        columns.append(
            f"n{i % 200}", metric, "gpu0", {"source": "stream"}, float(i % 90), start_ms - (i // 200) * 5000
        )
    return columns


def _threads(target, args_list) -> tuple[float, list[str]]:
    errors: list[str] = []

    def run(*args):
        try:
            target(*args)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")

    threads = [threading.Thread(target=run, args=a) for a in args_list]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - start, errors


def _other_process_opens(path: Path) -> str:
    code = (
        "from stethoscope.store.client import Store\n"
        f"try:\n    Store('chdb://{path}', 't').open().query('SELECT 1'); print('opened')\n"
        "except Exception as e:\n    print(str(e).splitlines()[0][:120])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return run.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="chdb-threads-")) / "db"
    now = int(time.time() * 1000)
    store = Store(f"chdb://{path}", "t").open()
    store.init_schema()
    t = time.time()
    store.insert_metrics(_rows(args.rows, now))
    figures: dict = {"rows": args.rows, "insert_s": round(time.time() - t, 3)}
    t = time.time()
    for _ in range(8):
        store.query(QUERY)
    figures["8_queries_serial_s"] = round(time.time() - t, 3)
    elapsed, errors = _threads(lambda: [store.query(QUERY) for _ in range(2)], [()] * 4)
    figures["8_queries_4_threads_one_client_s"], figures["errors_one_client"] = round(elapsed, 3), errors
    second = Store(f"chdb://{path}", "t").open()
    elapsed, errors = _threads(lambda s: [s.query(QUERY) for _ in range(2)], [(store,), (second,)] * 2)
    figures["8_queries_4_threads_two_clients_s"], figures["errors_two_clients"] = round(elapsed, 3), errors
    stop, inserted, insert_errors = threading.Event(), [0], []

    def writer() -> None:
        k = 0
        while not stop.is_set():
            try:
                second.insert_metrics(_rows(2000, now + 10_000_000 + k * 1000, "gpu_power_watts"))
                inserted[0] += 2000
            except Exception as exc:
                insert_errors.append(str(exc)[:160])
            k += 1

    thread = threading.Thread(target=writer)
    thread.start()
    latencies = []
    for _ in range(10):
        t = time.time()
        store.query(QUERY)
        latencies.append(time.time() - t)
    stop.set()
    thread.join()
    figures["query_max_s_while_inserting"] = round(max(latencies), 3)
    figures["rows_inserted_meanwhile"], figures["insert_errors"] = inserted[0], insert_errors
    second.close()
    writes = Writer(store.dsn, path.parent / "spool")
    timings = []
    for i in range(5):
        t = time.time()
        writes.write(Batch(metrics=_rows(100, now + 20_000_000 + i * 1000, "gpu_sm_clock_mhz")))
        timings.append(time.time() - t)
    figures["writer_write_s_with_handle_held"] = [round(x, 3) for x in timings]
    figures["other_process_while_held"] = _other_process_opens(path)
    store.close()
    timings = []
    for i in range(3):
        t = time.time()
        writes.write(Batch(metrics=_rows(100, now + 30_000_000 + i * 1000, "gpu_sm_clock_mhz")))
        timings.append(time.time() - t)
    figures["writer_write_s_without_handle"] = [round(x, 3) for x in timings]
    figures["other_process_after_close"] = _other_process_opens(path)
    print(json.dumps(figures, indent=1))
    if args.out:
        write_results(args.out, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
