"""nccl-tests output from other machines and launchers: mpirun --tag-output, srun --label, validation off,
the pre-2.13 `error` column, the 2017 summary without `#`, data corruption and runs cut short."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils import nccl_launch, suite_nccl
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nccl_tests import parse_nccl_tests

from conftest import fixture_text

T4_TAG_OUTPUT = (
    "public/nccl-tests/all_reduce_perf_mpirun_tag_output_2node_T4_efa_nccl2.12.7_eks_blueprints.txt"
)
H100_SRUN_LABEL = "public/nccl-tests/all_reduce_perf_srun_label_validation_off_2node_16xH100_ib_issue290.txt"
K80_NO_CHECK = "public/nccl-tests/all_reduce_perf_validation_off_2node_K80_pkb.txt"
V100_ERROR_COLUMN = "public/nccl-tests/all_reduce_perf_error_column_2node_16xV100_pkb_2019.txt"
FORMAT_2017 = "public/nccl-tests/SYNTHETIC_all_reduce_perf_2017_format_no_hash_summary.txt"
RTX5090_NCCL_FAILURE = "public/nccl-tests/all_reduce_perf_test_nccl_failure_2xRTX5090_nccl2.25.1_issue287.txt"


def busbw(row):
    return row["oop_busbw"], row["ip_busbw"]


def test_mpirun_tag_output_prefixes_are_stripped():
    parsed = parse_nccl_tests(fixture_text(T4_TAG_OUTPUT))
    assert len(parsed["rows"]) == 31  # 0, 0, then 4 B to 1 GiB
    assert parsed["rows"][-1]["size"] == 1073741824 and busbw(parsed["rows"][-1]) == (3.11, 3.12)
    assert busbw(parsed["rows"][16]) == (0.57, 0.57)  # 65536 B
    assert parsed["avg_busbw_gb_per_s"] == 1.15327
    assert parsed["nccl_version"] == "2.12.7+cuda11.4"
    assert (parsed["wrong"], parsed["validated"], parsed["failed"]) == (0, True, False)


def test_a_table_printed_by_every_rank_keeps_rank_0s_copy():
    text = fixture_text(T4_TAG_OUTPUT)
    rank_1_copy = text.replace("[1,0]<stdout>:", "[1,1]<stdout>:")
    parsed = parse_nccl_tests(text + rank_1_copy)
    assert len(parsed["rows"]) == 31 and parsed["avg_busbw_gb_per_s"] == 1.15327


def test_srun_label_prefixes_are_stripped_and_unchecked_results_are_not_zero_wrong():
    parsed = parse_nccl_tests(fixture_text(H100_SRUN_LABEL))
    assert len(parsed["rows"]) == 11
    assert parsed["rows"][0]["size"] == 8388608 and busbw(parsed["rows"][0]) == (73.04, 87.38)
    assert busbw(parsed["rows"][-1]) == (155.57, 155.56)
    assert parsed["avg_busbw_gb_per_s"] == 142.735
    assert parsed["validated"] is False and parsed["wrong"] is None and not parsed["failed"]


def test_validation_off_on_k80_reports_not_checked():
    parsed = parse_nccl_tests(fixture_text(K80_NO_CHECK))
    assert len(parsed["rows"]) == 11 and busbw(parsed["rows"][0]) == (0.44, 0.39)
    assert parsed["avg_busbw_gb_per_s"] == 0.565546
    assert parsed["validated"] is False and parsed["wrong"] is None
    assert all(row["oop_wrong"] is None and row["ip_wrong"] is None for row in parsed["rows"])


def test_pre_2_13_error_column_is_a_max_deviation_not_a_count():
    parsed = parse_nccl_tests(fixture_text(V100_ERROR_COLUMN))
    assert parsed["nccl_version"] == "2.4.6+cuda10.0"
    assert parsed["rows"][-1]["size"] == 8589934592 and busbw(parsed["rows"][-1]) == (9.93, 9.92)
    assert parsed["avg_busbw_gb_per_s"] == 5.16186
    # "Out of bounds values : 0 OK": checked, nothing out of bounds
    assert (parsed["validated"], parsed["wrong"], parsed["out_of_bounds"]) == (True, 0, 0)


def test_2017_format_summary_without_hash_and_times_in_ms():
    parsed = parse_nccl_tests(fixture_text(FORMAT_2017))
    assert parsed["avg_busbw_gb_per_s"] == 7.8
    assert len(parsed["rows"]) == 3 and parsed["rows"][0]["oop_time_us"] == pytest.approx(31.0)
    assert (parsed["validated"], parsed["wrong"], parsed["failed"]) == (True, 0, False)


def test_a_table_cut_short_is_a_failure_naming_its_last_line():
    lines = fixture_text(T4_TAG_OUTPUT).splitlines()
    cut = "\n".join(lines[:70]) + "\n"  # the launcher killed it after 4 KiB
    parsed = parse_nccl_tests(cut)
    assert parsed["failed"] and "line 70" in parsed["failure"] and "Avg bus bandwidth" in parsed["failure"]


def test_test_nccl_failure_after_the_header_names_the_line():
    parsed = parse_nccl_tests(fixture_text(RTX5090_NCCL_FAILURE))
    assert parsed["failed"] and parsed["rows"] == []
    assert parsed["failure"].startswith("GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error")


def test_test_nccl_failure_after_some_sizes_fails_the_run():
    lines = fixture_text(T4_TAG_OUTPUT).splitlines()
    crash = fixture_text(RTX5090_NCCL_FAILURE).splitlines()[10:]  # the real failure lines of nccl-tests #287
    parsed = parse_nccl_tests("\n".join(lines[:70] + crash + lines[70:]) + "\n")
    assert parsed["failed"] and "Test NCCL failure common.cu:392" in parsed["failure"]


class ReplayContext:
    """The module Context's run(): one recorded output for every command."""

    timeout = 600

    def __init__(self, text, rc=0):
        self.text, self.rc = text, rc

    def run(self, argv, env=None):
        return self.rc, self.text, ""


def run_suite(text, rc=0):
    # both captures are 2-node runs: 2 x 1 T4 (mpirun) and 2 x 8 H100 (srun)
    gpus = 8 if "<stdout>" not in text else 1
    launch = nccl_launch.plan(
        "mpirun", "all_reduce_perf", ["-b", "8", "-e", "1G"], gpus, ["n1", "n2"], hostfile="/tmp/hf"
    )
    return suite_nccl.run(ReplayContext(text, rc), "all_reduce_perf", ["Ring"], launch, 1, {}, 3.0)


def test_the_suite_fails_a_run_cut_short():
    cut = "\n".join(fixture_text(T4_TAG_OUTPUT).splitlines()[:70]) + "\n"
    with pytest.raises(CollectorError, match="Avg bus bandwidth"):
        run_suite(cut, rc=137)


def test_the_suite_records_an_unchecked_run_as_not_validated():
    _bench, _rows, _stability, detail = run_suite(fixture_text(H100_SRUN_LABEL))
    assert detail["runs"][0]["validated"] is False and detail["runs"][0]["wrong"] is None
