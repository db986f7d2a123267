"""Fingerprints that see a like-for-like swap: HCA GUIDs and board serial (PCI VPD), permanent Ethernet
addresses and SATA/SAS disk serials (SCSI VPD page 0x80) are node identity; models and firmware are
the class. The VPD decoders are checked on the real VPD of a ConnectX-7 (as lspci decoded it) and on
truncated and garbage bytes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fingerprint import fingerprint
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.vpd import (
    parse_pci_vpd,
    parse_scsi_unit_serial,
)

from conftest import PUBLIC, fixture_text

CX7_LSPCI = "public/lspci/lspci_vvv_ConnectX-7_MT2910.txt"
GPUD_HCAS = PUBLIC / "sysfs/sys-class-infiniband-h100_gpud"


def vpd_from_lspci(text: str) -> bytes:
    """The PCI VPD bytes lspci decoded into `text` (PCI 3.0 section 6.4: an Identifier String resource,
    a VPD-R resource of keywords ending with RV, whose first byte makes the sum 0, and the End tag).
    Values keep the padding lspci printed; only the bytes' layout is rebuilt here."""
    name = re.search(r"Product Name: (.*)$", text, re.M).group(1).encode()
    section = text.split("Read-only fields:")[1].split("\n\t\tEnd")[0]
    keywords = b""
    reserved = 0
    for keyword, value in re.findall(r"\[(\w\w)\] [^:]+: (.*)$", section, re.M):
        if keyword == "RV":
            reserved = int(re.search(r"(\d+) byte\(s\) reserved", value).group(1))
            continue
        keywords += keyword.encode() + bytes([len(value)]) + value.encode()
    head = bytes([0x82]) + len(name).to_bytes(2, "little") + name
    readonly_length = len(keywords) + 3 + 1 + reserved
    readonly = bytes([0x90]) + readonly_length.to_bytes(2, "little") + keywords
    body = head + readonly + b"RV" + bytes([1 + reserved])
    checksum = (-sum(body)) % 256
    return body + bytes([checksum]) + bytes(reserved) + bytes([0x78])


def page80(serial: str) -> bytes:
    """SCSI VPD page 0x80 as the kernel stores it in vpd_pg80 (SPC-4 7.8.15): peripheral byte, page code,
    2-byte page length, then the unit serial number in ASCII."""
    data = serial.encode()
    return bytes([0x00, 0x80]) + len(data).to_bytes(2, "big") + data


# -- PCI VPD ------------------------------------------------------------------------------------------


def test_pci_vpd_of_a_real_connectx7_gives_its_serial_and_part_number():
    text = fixture_text(CX7_LSPCI)
    vpd = parse_pci_vpd(vpd_from_lspci(text))
    assert vpd["complete"] is True
    assert vpd["name"].startswith("NVIDIA ConnectX-7 HHHL Adapter card, 400GbE / NDR IB")
    # the card pads its keywords with spaces; a serial is compared without them
    assert vpd["fields"]["SN"] == "MT2340J88735"
    assert vpd["fields"]["PN"] == "MCX75310AAS-NEAT"
    assert vpd["fields"]["EC"] == "AA"
    assert "RV" not in vpd["fields"]


def test_pci_vpd_cut_short_keeps_the_keywords_read_whole():
    data = vpd_from_lspci(fixture_text(CX7_LSPCI))
    after_serial = data.index(b"MT2340J88735") + len("MT2340J88735   ")
    partial = parse_pci_vpd(data[: after_serial + 2])
    assert partial["complete"] is False and partial["fields"]["SN"] == "MT2340J88735"
    cut_in_serial = parse_pci_vpd(data[: data.index(b"MT2340J88735") + 4])
    assert cut_in_serial["complete"] is False and "SN" not in cut_in_serial["fields"]
    header_only = parse_pci_vpd(data[:2])
    assert header_only == {"name": None, "fields": {}, "complete": False}


@pytest.mark.parametrize(
    "garbage",
    [b"\xff" * 64, b"\x00" * 16, b"MT2340J88735", b""],
    ids=["unprogrammed-eeprom", "zeros", "text", "empty"],
)
def test_pci_vpd_garbage_is_a_parse_error_naming_the_offset(garbage):
    with pytest.raises(ParseError, match="pci vpd"):
        parse_pci_vpd(garbage)


def test_pci_vpd_keyword_that_is_not_ascii_is_a_parse_error():
    data = bytearray(vpd_from_lspci(fixture_text(CX7_LSPCI)))
    first_keyword = data.index(b"PN")
    data[first_keyword : first_keyword + 2] = b"\x01\xfe"
    with pytest.raises(ParseError, match="keyword"):
        parse_pci_vpd(bytes(data))


@given(st.data())
def test_pci_vpd_cut_and_corrupted_is_data_or_a_parse_error(data):
    real = vpd_from_lspci(fixture_text(CX7_LSPCI))
    start = data.draw(st.integers(0, len(real)))
    end = data.draw(st.integers(start, len(real)))
    mutated = real[:start] + data.draw(st.binary(max_size=16)) + real[end:]
    try:
        vpd = parse_pci_vpd(mutated)
    except ParseError:
        return
    assert set(vpd) == {"name", "fields", "complete"}


@given(st.binary(max_size=64))
def test_unit_serial_of_any_bytes_is_text_none_or_a_parse_error(data):
    try:
        serial = parse_scsi_unit_serial(data)
    except ParseError:
        return
    assert serial is None or (isinstance(serial, str) and serial == serial.strip(" \t\r\n\x00") != "")


# -- SCSI VPD page 0x80 -------------------------------------------------------------------------------


def test_unit_serial_strips_the_padding_and_keeps_inner_spaces():
    # an HGST SAS drive's unit serial as sginfo printed it (nwipe issue #547): spaces inside are part of it
    assert parse_scsi_unit_serial(page80("001619PENBJV        VKJENBJV")) == "001619PENBJV        VKJENBJV"
    # libata answers page 0x80 with the ATA serial field: 20 characters, right-aligned by some drives
    assert parse_scsi_unit_serial(page80("     WD-WCC4N1234567")) == "WD-WCC4N1234567"
    assert parse_scsi_unit_serial(page80("S3Z2NB0K123456X\x00\x00")) == "S3Z2NB0K123456X"
    assert parse_scsi_unit_serial(page80("")) is None  # a page with no serial in it


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x00\x80\x00", "header"),
        (bytes([0x00, 0x83, 0x00, 0x04]) + b"abcd", "page 0x83"),
        (page80("S3Z2NB0K123456X")[:10], "truncated"),
    ],
    ids=["short-header", "other-page", "short-serial"],
)
def test_unit_serial_malformed_is_a_parse_error(data, message):
    with pytest.raises(ParseError, match=message):
        parse_scsi_unit_serial(data)


# -- the node seen through sysfs ----------------------------------------------------------------------


def write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


# Node/system-image/port GUIDs of two ConnectX-7 HCAs of a real H100 node
# (public/infiniband/ibstat_h100_cx7_ndr_all_active.txt, CA mlx5_0 and mlx5_10), in sysfs' notation.
HCA_A = {"node_guid": "a088:c203:00e3:142a", "port_guid": "a288:c2ff:fee3:142a"}
HCA_B = {"node_guid": "a088:c203:00e3:13fa", "port_guid": "a288:c2ff:fee3:13fa"}


def install_hca(root: Path, ids: dict[str, str], vpd: bytes | None) -> None:
    """mlx5_0 of the real gpud sysfs capture (model, firmware, PSID, port state) with the identity files
    that capture lacks: GUIDs, GID 0 of the InfiniBand port and, through `device`, the PCI VPD."""
    hca = root / "sys/class/infiniband/mlx5_0"
    shutil.rmtree(hca, ignore_errors=True)
    shutil.copytree(GPUD_HCAS / "mlx5_0", hca)
    write(hca / "node_guid", ids["node_guid"] + "\n")
    write(hca / "sys_image_guid", ids["node_guid"] + "\n")
    write(hca / "ports/1/gids/0", "fe80:0000:0000:0000:" + ids["port_guid"] + "\n")
    if vpd is not None:
        write(hca / "device/vpd", vpd)


def install_disk(root: Path, name: str, serial: str, rev: str = "3B6Q", **extra: str) -> None:
    base = root / "sys/block" / name
    write(base / "removable", extra.get("removable", "0") + "\n")
    write(base / "device/vendor", "ATA     \n")
    write(base / "device/model", "SAMSUNG MZ7LH960\n")
    write(base / "device/rev", rev + "\n")
    write(base / "device/vpd_pg80", page80(serial))


def install_ethernet(root: Path, name: str, address: str, assign_type: str = "0") -> None:
    base = root / "sys/class/net" / name
    write(base / "type", "1\n")
    write(base / "address", address + "\n")
    write(base / "addr_assign_type", assign_type + "\n")
    (base / "device").mkdir(parents=True, exist_ok=True)


def node(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    install_hca(root, HCA_A, vpd_from_lspci(fixture_text(CX7_LSPCI)))
    install_disk(root, "sda", "S455NY0M123456")
    install_ethernet(root, "eno1", "3c:ec:ef:12:34:56")
    write(root / "sys/class/dmi/id/board_serial", "NM1234567890\n")
    return root


def take(root: Path) -> dict:
    def runner(argv, _timeout, _env=None):
        return 127, "", "%s: command not found" % argv[0]

    ctx = Context(runner, lambda name: None, root=str(root), state_dir=str(root.parent / "state"))
    return fingerprint(ctx)


def test_identities_of_hca_disk_and_ethernet_are_in_the_node_detail(tmp_path):
    result = take(node(tmp_path))
    serials = result["detail"]["serials"]
    assert serials["nic"] == [
        {
            "node_guid": "a088:c203:00e3:142a",
            "sys_image_guid": "a088:c203:00e3:142a",
            "port_guids": ["a288:c2ff:fee3:142a"],
        }
    ]
    assert result["detail"]["nic_boards"] == [
        {"node_guid": "a088:c203:00e3:142a", "serial": "MT2340J88735", "part": "MCX75310AAS-NEAT"}
    ]
    assert serials["disk"] == ["S455NY0M123456"]
    assert serials["ethernet"] == ["3c:ec:ef:12:34:56"]
    assert result["detail"]["disks"] == [{"vendor": "ATA", "model": "SAMSUNG MZ7LH960", "firmware": "3B6Q"}]
    assert result["warnings"] == []


def test_nic_swapped_for_the_same_model_changes_the_node_not_the_class(tmp_path):
    root = node(tmp_path)
    before = take(root)
    other_card = vpd_from_lspci(fixture_text(CX7_LSPCI)).replace(b"MT2340J88735", b"MT2340J88799")
    install_hca(root, HCA_B, other_card)
    after = take(root)
    assert after["class_fingerprint"] == before["class_fingerprint"]
    assert after["node_fingerprint"] != before["node_fingerprint"]


def test_hca_without_readable_vpd_is_still_told_apart_by_its_guids(tmp_path):
    root = node(tmp_path)
    install_hca(root, HCA_A, None)
    before = take(root)
    install_hca(root, HCA_B, None)
    after = take(root)
    assert before["detail"]["nic_boards"][0]["serial"] is None
    assert after["class_fingerprint"] == before["class_fingerprint"]
    assert after["node_fingerprint"] != before["node_fingerprint"]


def test_a_run_that_cannot_read_the_vpd_is_not_a_swap(tmp_path):
    # VPD is root-only on most kernels and read from the card each time: one run without it is no change
    root = node(tmp_path)
    as_root = take(root)
    install_hca(root, HCA_A, None)
    without_vpd = take(root)
    assert without_vpd["node_fingerprint"] == as_root["node_fingerprint"]


def test_hca_without_guids_is_told_apart_by_its_board_serial(tmp_path):
    root = node(tmp_path)
    hca = root / "sys/class/infiniband/mlx5_0"
    for name in ("node_guid", "sys_image_guid", "ports/1/gids/0"):
        (hca / name).unlink()
    before = take(root)
    other_card = vpd_from_lspci(fixture_text(CX7_LSPCI)).replace(b"MT2340J88735", b"MT2340J88799")
    write(hca / "device/vpd", other_card)
    after = take(root)
    assert before["detail"]["serials"]["nic"][0]["serial"] == "MT2340J88735"
    assert after["node_fingerprint"] != before["node_fingerprint"]
    assert after["class_fingerprint"] == before["class_fingerprint"]


def test_sata_ssd_swapped_for_the_same_model_changes_the_node_not_the_class(tmp_path):
    root = node(tmp_path)
    before = take(root)
    install_disk(root, "sda", "S455NY0M654321")
    after = take(root)
    assert after["class_fingerprint"] == before["class_fingerprint"]
    assert after["node_fingerprint"] != before["node_fingerprint"]


def test_disk_firmware_update_changes_the_class_as_nvme_firmware_does(tmp_path):
    root = node(tmp_path)
    before = take(root)
    install_disk(root, "sda", "S455NY0M123456", rev="4B7Q")
    after = take(root)
    assert after["class_fingerprint"] != before["class_fingerprint"]
    assert after["detail"]["serials"]["disk"] == before["detail"]["serials"]["disk"]


@pytest.mark.parametrize(
    "device_path",
    [
        "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block",
        "devices/platform/host7/session1/target7:0:0/7:0:0:0/block",  # iSCSI
        "devices/pci0000:80/0000:80:02.0/0000:82:00.0/host8/rport-8:0-0/target8:0:0/8:0:0:0/block",  # FC
    ],
    ids=["usb", "iscsi", "fibre-channel"],
)
def test_removable_usb_and_network_disks_are_not_the_node(tmp_path, device_path):
    root = node(tmp_path)
    before = take(root)
    install_disk(root, "sdb", "USBSTICK0001", removable="1")
    device = tmp_path / device_path
    install_disk(device, "sdc", "REMOTE0002")  # sysfs links /sys/block/sdc to the device's own folder
    (root / "sys/block/sdc").symlink_to(device / "sys/block/sdc")
    after = take(root)
    assert after["node_fingerprint"] == before["node_fingerprint"]
    assert after["detail"].get("disks") == before["detail"]["disks"]


def test_ethernet_identity_is_the_permanent_address(tmp_path):
    root = node(tmp_path)
    before = take(root)
    install_ethernet(root, "eno1", "02:00:00:aa:bb:cc", assign_type="3")  # set by an admin: not the card
    set_by_admin = take(root)
    install_ethernet(root, "eno1", "3c:ec:ef:12:34:99")  # another card
    swapped = take(root)
    assert set_by_admin["detail"]["serials"]["ethernet"] == []
    assert swapped["node_fingerprint"] != before["node_fingerprint"]
    assert swapped["class_fingerprint"] == before["class_fingerprint"]


def test_bond_member_identity_is_its_permanent_address(tmp_path):
    root = node(tmp_path)
    install_ethernet(root, "eno1", "3c:ec:ef:00:00:01", assign_type="3")  # the bond's address
    write(root / "sys/class/net/eno1/bonding_slave/perm_hwaddr", "3c:ec:ef:12:34:56\n")
    assert take(root)["detail"]["serials"]["ethernet"] == ["3c:ec:ef:12:34:56"]


def test_garbage_vpd_is_a_warning_and_the_guids_still_count(tmp_path):
    root = node(tmp_path)
    install_hca(root, HCA_A, b"\xff" * 64)
    result = take(root)
    board = result["detail"]["nic_boards"][0]
    assert board == {"node_guid": "a088:c203:00e3:142a", "serial": None, "part": None}
    assert result["detail"]["serials"]["nic"][0]["node_guid"] == "a088:c203:00e3:142a"
    assert len(result["warnings"]) == 1 and "mlx5_0" in result["warnings"][0]
    assert "pci vpd" in result["warnings"][0]


def test_the_first_sweep_after_an_upgrade_that_reads_more_identities_is_not_a_hardware_change(tmp_path):
    """A node whose last fingerprint was taken by a release that read fewer identities (no scheme in
    its state) gets a new fingerprint, but no change is counted: nothing was swapped, and a fleet-wide
    `hardware_changed_rebaseline` on upgrade would be a false alarm. A swap after it is counted."""
    import json

    from ansible_collections.aicluster.stethoscope.plugins.module_utils.fingerprint import (
        STATE,
        count_change,
    )

    root = node(tmp_path)
    ctx = Context(
        lambda *_: (127, "", ""), lambda name: None, root=str(root), state_dir=str(tmp_path / "state")
    )
    (tmp_path / "state").mkdir()
    older = {"node_fingerprint": "before-the-upgrade", "class_fingerprint": "c", "detail": {}, "changes": 3}
    (tmp_path / "state" / f"{STATE}.json").write_text(json.dumps(older))
    row, change = count_change(ctx, fingerprint(ctx))
    assert change is None and row["value"] == 3
    install_disk(root, "sda", "S455NY0M999999")
    row, change = count_change(ctx, fingerprint(ctx))
    assert change is not None and row["value"] == 4


def test_virtual_functions_usb_links_and_a_second_path_are_not_identities(tmp_path):
    """What comes and goes with no swap: an SR-IOV VF (HCA or Ethernet; host-set GUIDs and addresses),
    the USB link to the BMC, a dual-ported SAS disk's second path. The fingerprint is the same with
    and without them."""
    root = node(tmp_path)
    before = take(root)
    vf = root / "sys/class/infiniband/mlx5_1"
    shutil.copytree(GPUD_HCAS / "mlx5_0", vf)
    write(vf / "node_guid", "0000:0000:0000:0f01\n")
    (vf / "device/physfn").mkdir(parents=True)
    install_ethernet(root, "ens1f0v0", "02:00:00:00:00:01")
    (root / "sys/class/net/ens1f0v0/device/physfn").mkdir()
    usb = root / "sys/devices/pci0000:00/0000:00:14.0/usb1/1-3/1-3:2.0"
    usb.mkdir(parents=True)
    install_ethernet(root, "usb0", "3c:ec:ef:00:00:01")
    (root / "sys/class/net/usb0/device").rmdir()
    (root / "sys/class/net/usb0/device").symlink_to(usb)
    install_disk(root, "sdb", "S455NY0M123456")  # sda's second path: the same serial
    after = take(root)
    assert after["detail"]["serials"] == before["detail"]["serials"]
    assert (after["class_fingerprint"], after["node_fingerprint"]) == (
        before["class_fingerprint"],
        before["node_fingerprint"],
    )
