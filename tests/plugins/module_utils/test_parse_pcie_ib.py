"""PCIe AER, lspci and InfiniBand parsers on real captures."""

from __future__ import annotations

import json

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.infiniband import (
    parse_counter,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_numbered_state,
    parse_rate,
    parse_rdma_qp_json,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.pcie import (
    aer_total,
    link_degraded,
    parse_aer_file,
    parse_link_speed,
    parse_lspci_vvv,
)

from conftest import PUBLIC, fixture_text

GPUD = PUBLIC / "sysfs/sys-class-infiniband-h100_gpud"


@pytest.mark.parametrize(
    "name, fixture, total",
    [
        ("aer_dev_correctable", "aer_dev_correctable_zero.txt", 0),
        ("aer_dev_fatal", "aer_dev_fatal_zero.txt", 0),
        ("aer_dev_nonfatal", "aer_dev_nonfatal_zero.txt", 0),
        ("aer_dev_correctable", "aer_dev_correctable_SYNTHETIC_nonzero.txt", None),
    ],
)
def test_aer_files(name, fixture, total):
    counts = parse_aer_file(name, fixture_text(f"public/sysfs/aer/{fixture}"))
    if total is None:  # the procfs maintainers' numbered sample: the kernel's own total is kept
        assert counts["RxErr"] == 1 and aer_total(name, counts) == counts["TOTAL_ERR_COR"]
    else:
        assert aer_total(name, counts) == total


def test_aer_garbage():
    with pytest.raises(ParseError) as caught:
        parse_aer_file("aer_dev_fatal", "RxErr 0\nBadTLP lots\n")
    assert caught.value.line_no == 2


def test_lspci_h100_correctable_status_bits():
    (device,) = parse_lspci_vvv(
        fixture_text("public/lspci/lspci_vvv_H100-SXM5_10de-2330_AER_CESta_RxErr_BadTLP.txt")
    )
    assert device["bdf"] == "0000:19:00.0"
    assert device["cesta"] == ["RxErr", "BadTLP", "Timeout"] and device["uesta"] == []
    assert (device["lnk_sta_speed"], device["lnk_sta_width"]) == (32.0, 16)


def test_lspci_switch_uncorrectable_status_bits():
    (device,) = parse_lspci_vvv(fixture_text("public/lspci/lspci_vvv_PEX890xx_switch_AER_UESta_UnsupReq.txt"))
    assert device["uesta"] == ["UnsupReq"]


@pytest.mark.parametrize(
    "width, max_width, speed, max_speed, busy, degraded",
    [
        (8, 16, 8.0, 8.0, False, 1),
        (16, 16, 2.5, 32.0, False, 0),
        (16, 16, 2.5, 32.0, True, 1),
        (16, 16, 32, 32, True, 0),
    ],
)
def test_link_degradation_rule(width, max_width, speed, max_speed, busy, degraded):
    assert link_degraded(width, max_width, speed, max_speed, busy) == degraded


def test_real_h200_sysfs_link_speed():
    assert (
        parse_link_speed(
            fixture_text("real/h200-vm/root/sys/bus/pci/devices/0000:00:06.0/current_link_speed")
        )
        == 32.0
    )


def test_gpud_sysfs_port_attributes():
    port = GPUD / "mlx5_1/ports/1"
    assert parse_numbered_state("state", (port / "state").read_text()) == (4, "ACTIVE")
    assert parse_rate("rate", (port / "rate").read_text()) == 400.0
    assert parse_counter("link_downed", (port / "counters/link_downed").read_text()) == 255


def test_i40iw_counter_without_pma_is_unknown():
    assert parse_counter("c", "N/A (no PMA)") is None


def test_ibv_devinfo_cx7():
    ports = parse_ibv_devinfo(fixture_text("public/infiniband/ibv_devinfo_cx7_mt4129_ethernet_stelline.txt"))
    assert ports == {
        ("mlx5_1", 1): {"state": 4, "max_mtu": 4096, "active_mtu": 4096, "link_layer": "Ethernet"}
    }


def test_ibstat_all_active():
    ports = parse_ibstat(fixture_text("public/infiniband/ibstat_h100_cx7_ndr_all_active.txt"))
    assert ports[("mlx5_0", 1)]["state"] == 4 and ports[("mlx5_0", 1)]["rate"] == 400


def test_ibstat_ibpanic_is_a_failure_naming_the_line():
    text = fixture_text("public/infiniband/ibstat_a100_azure_cx6vf_ibpanic_exit255.txt")
    with pytest.raises(ParseError) as caught:
        parse_ibstat(text)
    assert "ibpanic" in str(caught.value)


def test_rdma_qp_json_counts_err_state():
    # iproute2 documents these keys; no permissively licensed capture exists (fixtures README).
    qps = [
        {"ifname": "mlx5_0", "port": 1, "lqpn": 1, "state": "RTS"},
        {"ifname": "mlx5_0", "port": 1, "state": "ERR"},
    ]
    assert parse_rdma_qp_json(json.dumps(qps)) == {"mlx5_0/1": {"total": 2, "error": 1}}
    with pytest.raises(ParseError):
        parse_rdma_qp_json('{"not": "a list"}')
