"""perftest output cut short (^C, a killed client) and failing to connect: never a complete result."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils import suite_network
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.perftest import parse_perftest

from conftest import fixture_text

BW_CUT = "public/perftest/ib_write_bw_gpudirect_h200_gke_CUT_lines1-50_killed_mid_sweep.txt"
LAT_CUT = "public/perftest/ib_read_lat_roce_cx5_spiderpool_CUT_lines1-22_killed_before_end.txt"
NO_CONNECTION = "public/perftest/ib_write_bw_couldnt_connect_roce_pr228.txt"


def test_a_bandwidth_sweep_killed_mid_run_is_incomplete():
    parsed = parse_perftest(fixture_text(BW_CUT))
    assert parsed["incomplete"] and parsed["failed"]
    assert "line 50" in parsed["failure"]
    # what was measured before the kill is still read, 2 B to 16 KiB
    assert len(parsed["rows"]) == 14 and parsed["rows"][-1]["bw_average_gbit_per_s"] == 135.43


def test_a_latency_run_killed_before_its_closing_line_is_incomplete():
    parsed = parse_perftest(fixture_text(LAT_CUT))
    assert parsed["incomplete"] and parsed["failed"] and "line 22" in parsed["failure"]


def test_couldnt_connect_is_a_failure_naming_the_peer():
    parsed = parse_perftest(fixture_text(NO_CONNECTION))
    assert parsed["failed"] and parsed["failure"] == "Couldn't connect to 192.168.125.211:18515"
    assert parsed["rows"] == []


@pytest.mark.parametrize(
    "fixture, rows, last_average_gbit",
    [
        ("ib_write_bw_gpudirect_cuda_dmabuf_h200_gke.txt", 23, 140.40),  # -a sweep, --report_gbits, RoCE
        ("ib_write_bw_8M_loopback_superbench.txt", 2, 24056.72 * 1048576 * 8 / 1e9),  # MB/sec, IB
        ("ib_write_bw_all_sizes_interleaved_superbench.txt", None, None),  # server and client interleaved
    ],
)
def test_complete_runs_stay_complete(fixture, rows, last_average_gbit):
    parsed = parse_perftest(fixture_text(f"public/perftest/{fixture}"))
    assert not parsed["incomplete"] and not parsed["failed"]
    if rows is not None:
        assert len(parsed["rows"]) == rows
        assert parsed["rows"][-1]["bw_average_gbit_per_s"] == pytest.approx(last_average_gbit)


def test_a_complete_latency_run_stays_complete():
    parsed = parse_perftest(fixture_text("public/perftest/ib_read_lat_roce_cx5_mlx5_0_spiderpool.txt"))
    assert not parsed["incomplete"] and parsed["rows"][0]["t_typical_us"] == 7.04


class ReplayContext:
    """The module Context's run(): one recorded output for every command."""

    timeout = 600

    def __init__(self, text, rc):
        self.text, self.rc = text, rc

    def run(self, argv, env=None):
        return self.rc, self.text, ""


@pytest.mark.parametrize("fixture", [BW_CUT, LAT_CUT])
def test_the_suite_fails_a_run_cut_short_even_with_exit_code_0(fixture):
    # a wrapper (timeout, a shell pipeline) can hide the signal's exit code
    ctx = ReplayContext(fixture_text(fixture), 0)
    with pytest.raises(CollectorError, match="incomplete"):
        suite_network.run(ctx, ["ib_write_bw"], "10.0.0.2", "node02", "mlx5_3", 65536, 5000, 1, {}, 3.0)
