"""`lspci` with 5-digit PCI domains (devices behind an Intel VMD, 10000:e0:06.0): each device is its
own, with its full domain, never merged into the device listed before it."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.pcie import parse_lspci_vvv

from conftest import fixture_text

SPDK_1408 = fixture_text("public/lspci/lspci_D_vmd_domains_10000_skylake-sp_spdk_issue1408.txt")
H100 = fixture_text("public/lspci/lspci_vvv_H100-SXM5_10de-2330_AER_CESta_RxErr_BadTLP.txt")
CX7 = fixture_text("public/lspci/lspci_vvv_ConnectX-7_MT2910.txt")


def test_vmd_domain_devices_are_listed_each_with_its_domain():
    devices = parse_lspci_vvv(SPDK_1408)
    assert len(devices) == len(SPDK_1408.splitlines()) == 19
    assert [d["bdf"] for d in devices[4:7]] == ["0000:d7:17.0", "10000:00:00.0", "10000:00:01.0"]
    assert devices[-1]["bdf"] == "10000:05:07.0"
    assert devices[-1]["description"] == "PCI bridge: PMC-Sierra Inc. Device 8533"
    assert (
        devices[5]["description"]
        == "PCI bridge: Intel Corporation Sky Lake-E PCI Express Root Port A (rev 04)"
    )


def test_a_vmd_stanza_after_another_keeps_its_own_link_and_aer_values():
    """The real H100 stanza, its header line given a VMD address (the derivation is here, not in a
    fixture): before the fix its link and AER lines overwrote the ConnectX-7's."""
    header, _newline, body = H100.partition("\n")
    bus = header.split(" ", 1)[0]
    moved = header.replace(bus, "10000:e0:06.0", 1) + "\n" + body
    cx7, vmd = parse_lspci_vvv(CX7 + moved)
    (alone,) = parse_lspci_vvv(H100)
    (cx7_alone,) = parse_lspci_vvv(CX7)
    assert cx7 == cx7_alone
    assert vmd["bdf"] == "10000:e0:06.0"
    assert {k: v for k, v in vmd.items() if k != "bdf"} == {k: v for k, v in alone.items() if k != "bdf"}
    assert (vmd["lnk_sta_speed"], vmd["lnk_sta_width"]) == (32.0, 16)
    assert vmd["cesta"] == ["RxErr", "BadTLP", "Timeout"]
