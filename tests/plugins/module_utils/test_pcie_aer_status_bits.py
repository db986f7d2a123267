"""`pcie_aer_status_flags` (the lspci fallback where sysfs has no AER counters) is the bitmask of the
AER status register, each flag at its bit (Linux pci_regs.h PCI_ERR_COR_* / PCI_ERR_UNC_*), not a count."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_pcie
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context

from conftest import fixture_text

H100 = "public/lspci/lspci_vvv_H100-SXM5_10de-2330_AER_CESta_RxErr_BadTLP.txt"
PEX_SWITCH = "public/lspci/lspci_vvv_PEX890xx_switch_AER_UESta_UnsupReq.txt"
CX7 = "public/lspci/lspci_vvv_ConnectX-7_MT2910.txt"
# older pciutils name CESta bit 13 NonFatalErr (newer ones AdvNonFatalErr)
OLD_PCIUTILS = "public/lspci/lspci_vv_RX580_old_pciutils_CESta_NonFatalErr_rocm-issue157.txt"


def status_rows(tmp_path, capture):
    """The collector on a node whose sysfs lists one device without AER files, lspci answering."""
    (tmp_path / "sys/bus/pci/devices/0000:19:00.0").mkdir(parents=True)
    ctx = Context(
        runner=lambda argv, timeout, env: (0, fixture_text(capture), ""),
        which=lambda name: "/usr/bin/" + name,
        root=str(tmp_path),
        state_dir=str(tmp_path / "state"),
    )
    collected = collect_pcie.collect(ctx)
    return {
        r["labels"]["kind"]: r["value"] for r in collected["metrics"] if r["name"] == "pcie_aer_status_flags"
    }


@pytest.mark.parametrize(
    "capture, expected",
    [
        # CESta RxErr+ BadTLP+ Timeout+: bits 0, 6 and 12
        (H100, {"correctable": 0x1 | 0x40 | 0x1000, "uncorrectable": 0}),
        # UESta UnsupReq+: bit 20
        (PEX_SWITCH, {"correctable": 0, "uncorrectable": 0x100000}),
        # CESta AdvNonFatalErr+: bit 13
        (CX7, {"correctable": 0x2000, "uncorrectable": 0}),
        # CESta BadTLP+ BadDLLP+ Timeout+ NonFatalErr+ (the older name): bits 6, 7, 12 and 13
        (OLD_PCIUTILS, {"correctable": 0x40 | 0x80 | 0x1000 | 0x2000, "uncorrectable": 0}),
    ],
)
def test_status_flags_are_the_register_bits(tmp_path, capture, expected):
    assert status_rows(tmp_path, capture) == expected
