"""Every parser, fed arbitrary text, returns data or raises its own ParseError: never anything else."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.aicluster.stethoscope.plugins.module_utils import (
    infiniband,
    kernel_log,
    nvidia_smi,
    nvlink,
    nvme_feature,
    pcie,
    slurm,
    smartctl,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

from conftest import fixture_text

PARSERS = {
    "nvidia-smi -q -x": nvidia_smi.parse_query_xml,
    "nvidia-smi dmon": nvidia_smi.parse_dmon,
    "kernel log": kernel_log.parse_xid_events,
    "nvlink -s": nvlink.parse_status,
    "nvlink -e": nvlink.parse_errors,
    "nvlink -gt d": nvlink.parse_throughput,
    "aer file": lambda text: pcie.parse_aer_file("aer_dev_fatal", text),
    "lspci -vvv": pcie.parse_lspci_vvv,
    "ibv_devinfo": infiniband.parse_ibv_devinfo,
    "ibstat": infiniband.parse_ibstat,
    "rdma qp": infiniband.parse_rdma_qp_json,
    "sysfs state": lambda text: infiniband.parse_numbered_state("state", text),
    "sysfs rate": lambda text: infiniband.parse_rate("rate", text),
    "sysfs counter": lambda text: infiniband.parse_counter("counter", text),
    "smartctl -j": smartctl.parse_smartctl_json,
    "nvme get-feature": nvme_feature.parse_get_feature,
    "scontrol -o show node": slurm.parse_show_node,
}
SEEDS = {
    "nvidia-smi -q -x": "real/h200-vm/commands/nvidia-smi_-q_-x.xml",
    "nvidia-smi dmon": "real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt",
    "nvlink -s": "public/nvidia-smi/nvlink_status_h100_590.48.01.txt",
    "lspci -vvv": "public/lspci/lspci_vvv_H100-SXM5_10de-2330_AER_CESta_RxErr_BadTLP.txt",
    "ibstat": "public/infiniband/ibstat_h100_cx7_ndr_all_active.txt",
    "smartctl -j": "public/smartctl/nvme_intel_p4500_worn_pctused75.json",
    "scontrol -o show node": "real/slurm/scontrol_-o_show_node_drained.txt",
}


def mutate(seed: str, data: st.DataObject) -> str:
    """Cut, splice and corrupt a real output: closer to a broken tool than random noise."""
    start = data.draw(st.integers(0, len(seed)))
    end = data.draw(st.integers(start, len(seed)))
    junk = data.draw(st.text(max_size=40))
    return seed[:start] + junk + seed[end:]


def call(name, text):
    try:
        PARSERS[name](text)
    except ParseError as exc:
        assert exc.tool and str(exc)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=400))
def test_random_text(name, text):
    call(name, text)


@pytest.mark.parametrize("name", sorted(SEEDS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_real_output(name, data):
    call(name, mutate(fixture_text(SEEDS[name]), data))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
SMARTCTL_KEYS = st.sampled_from(
    [
        "smartctl",
        "device",
        "ata_smart_attributes",
        "table",
        "raw",
        "string",
        "value",
        "name",
        "smart_status",
        "passed",
        "temperature",
        "current",
        "nvme_smart_health_information_log",
        "messages",
        "exit_status",
    ]
)
SHAPED = st.recursive(
    st.none() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(SMARTCTL_KEYS, children, max_size=5),
    max_leaves=25,
)


@pytest.mark.parametrize("name", ["smartctl -j", "rdma qp"])
@settings(max_examples=300, deadline=None)
@given(value=st.one_of(JSON_VALUES, SHAPED))
def test_json_of_the_wrong_shape(name, value):
    import json

    call(name, json.dumps(value))


@pytest.mark.parametrize(
    "name, text",
    [
        ("ibv_devinfo", "hca_id: mlx5_0\n\tport: one\n"),
        ("ibstat", "CA 'mlx5_0'\n\tPort x:\n"),
        ("nvidia-smi dmon", "# gpu pwr\n# Idx W\n 0 x\n"),
        ("nvlink -e", "GPU 0: X\n\t Link 0: CRC Errors: 9999999999999999999999\n"),
        ("nvlink -s", "GPU 0: X\n\t Link 0: 26..562 GB/s\n"),
        ("smartctl -j", '{"smartctl": {"exit_status": "x"}, "ata_smart_attributes": {"table": [1]}}'),
    ],
)
def test_regressions_found_by_fuzzing(name, text):
    call(name, text)
