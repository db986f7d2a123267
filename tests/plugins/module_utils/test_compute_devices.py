"""The per-device side of bench_compute without torch: which workers run, the checksum quorum, the
sibling comparison, and the clock sampler against nvidia-smi at the process boundary (both field
names, under a real `timeout`)."""

from __future__ import annotations

import subprocess

from ansible_collections.aicluster.stethoscope.plugins.module_utils import compute_workers as cw

from conftest import PUBLIC, fake_tools

QUERY_FIELDS = ["index", "clocks_event_reasons.active", "power.draw", "clocks.current.sm", "temperature.gpu"]


def query_csv(field_name: str, gpus: int) -> str:
    """The columns the sampler asks for, cut from the real H200 `--query-gpu` capture (idle: reason
    mask 0x1), repeated for `gpus` indices; `field_name` renames the reason column as a driver names it."""
    header, row = (PUBLIC / "nvidia-smi/query-gpu_h200_idle_590.48.01.csv").read_text().splitlines()[:2]
    names = [n.strip() for n in header.split(",")]
    values = [v.strip() for v in row.split(",")]
    picked = [values[[n.split(" [")[0] for n in names].index(f)] for f in QUERY_FIELDS]
    units = {n.split(" [")[0]: n for n in names}
    head = ", ".join(units[f] for f in QUERY_FIELDS).replace("clocks_event_reasons", field_name)
    lines = [head] + [", ".join([str(i), *picked[1:]]) for i in range(gpus)]
    return "\n".join(lines) + "\n"


def sampler_with(tmp_path, cases):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(bindir, log, {"nvidia-smi": cases})

    def run(argv):
        proc = subprocess.run(
            ["timeout", "-k", "2", "5", str(bindir / "nvidia-smi"), *argv[1:]],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.returncode, proc.stdout, proc.stderr

    return cw.ClockSampler(run), log


def test_old_driver_throttle_field_is_read_not_silently_zero(tmp_path):
    (tmp_path / "old.csv").write_text(query_csv("clocks_throttle_reasons", 8))
    new = "--query-gpu=" + cw.QUERY % "clocks_event_reasons" + " --format=csv"
    old = "--query-gpu=" + cw.QUERY % "clocks_throttle_reasons" + " --format=csv"
    sampler, log = sampler_with(
        tmp_path,
        {
            new: "echo 'Field \"clocks_event_reasons.active\" is not a valid field to query.' >&2; exit 2",
            old: f"cat {tmp_path / 'old.csv'}",
        },
    )
    first = sampler.sample()
    assert sorted(first) == list(range(8))  # every GPU, not GPU 0 only
    real_mask = int(query_csv("clocks_event_reasons", 1).splitlines()[1].split(",")[1], 16)
    assert all(row["mask"] == real_mask for row in first.values()) and real_mask != 0
    sampler.sample()
    calls = log.read_text().splitlines()
    assert calls == [f"nvidia-smi {new}", f"nvidia-smi {old}", f"nvidia-smi {old}"]  # falls back once


def test_hung_nvidia_smi_is_a_timed_out_sample_not_a_hung_benchmark(tmp_path):
    sampler, _log = sampler_with(tmp_path, "sleep 30")
    assert sampler.sample() == {"error": f"nvidia-smi timed out after {cw.SAMPLE_TIMEOUT}s"}


def test_every_visible_gpu_gets_a_worker_in_nvidia_smi_order():
    planned = cw.plan_devices(4, 2, visible="4,5,6,7")
    assert [(i, kind, env["CUDA_VISIBLE_DEVICES"]) for i, kind, env in planned] == [
        (4, "cuda", "4"),
        (5, "cuda", "5"),
        (6, "cuda", "6"),
        (7, "cuda", "7"),
    ]
    standins = cw.plan_devices(0, 3)
    assert [(i, kind, env["OMP_NUM_THREADS"]) for i, kind, env in standins] == [
        (0, "cpu", "1"),
        (1, "cpu", "1"),
        (2, "cpu", "1"),
    ]
    assert cw.device_labels(1, "cpu") == {"gpu": "1", "standin": "cpu"}


def test_quorum_names_the_odd_one_out_and_a_tie_is_no_verdict():
    assert cw.quorum({0: 7, 1: 7, 2: 9, 3: 7}) == {0: True, 1: True, 2: False, 3: True}
    assert cw.quorum({0: 7, 1: 9, 2: 7, 3: 9}) == {}  # 2 against 2
    assert cw.quorum({0: 7, 1: 9}) == {}  # two GPUs cannot outvote each other


def test_slowest_sibling_is_measured_against_the_node_median():
    below = cw.below_siblings({0: 100.0, 1: 101.0, 2: 99.0, 3: 80.0})
    assert round(below[3], 1) == 19.6 and below[1] == 0.0
    assert cw.below_siblings({0: 100.0}) == {}
