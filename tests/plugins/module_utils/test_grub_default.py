"""env_lock's persistent C-state edit of /etc/default/grub over real distribution files and every
quoting style the shell reads: lock adds exactly the missing arguments to the right variable, a second
lock changes nothing, restore gives back the original bytes; what cannot be edited safely fails,
naming the file and the line. The module's own lock/restore code runs on a node root in a temp dir;
bash itself checks that the values read are the values the shell reads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.aicluster.stethoscope.plugins.module_utils import grub_default
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    Context,
)
from ansible_collections.aicluster.stethoscope.plugins.modules import env_lock

from conftest import PUBLIC

GRUB = PUBLIC / "grub"
ADDED = "intel_idle.max_cstate=1 processor.max_cstate=1"
PARAMS = {
    "governor": "performance",
    "keep_cstates": 1,
    "numa_balancing": True,
    "mtu": {},
    "nvme_write_cache_off": True,
    "persistent_cstates": True,
    "bootloader": "auto",
    "hold_cpu_dma_latency": False,
}

# fixture -> the one line lock leaves changed (line number, new content)
REAL_FILES = {
    # RHEL/CentOS layout: only GRUB_CMDLINE_LINUX; edited there, no _DEFAULT line added
    "rhel7_cloud_image": (
        6,
        'GRUB_CMDLINE_LINUX="console=tty0 crashkernel=auto console=ttyS0,115200n8 no_timer_check '
        'net.ifnames=0 %s"' % ADDED,
    ),
    "rhel7_cloud_image_no_final_newline": (
        6,
        'GRUB_CMDLINE_LINUX="console=tty0 crashkernel=auto console=ttyS0,115200n8 no_timer_check '
        'net.ifnames=0 %s"' % ADDED,
    ),
    "rhel7_trailing_space_no_final_newline": (
        2,
        'GRUB_CMDLINE_LINUX="console=tty0 crashkernel=auto console=ttyS0,115200n8 no_timer_check '
        'net.ifnames=0 %s" ' % ADDED,
    ),
    "centos_puppet_managed": (12, 'GRUB_CMDLINE_LINUX="elevator=noop %s"' % ADDED),
    # both variables: _DEFAULT is edited (normal entries, not recovery)
    "fedora_both_variables_EDITED": (7, 'GRUB_CMDLINE_LINUX_DEFAULT="rhgb nohz=on %s"' % ADDED),
    "ubuntu_ipv6_disabled_role": (11, 'GRUB_CMDLINE_LINUX_DEFAULT="%s"' % ADDED),
    "arch_grapheneos_servers": (6, 'GRUB_CMDLINE_LINUX_DEFAULT="loglevel=3 quiet %s"' % ADDED),
    # Azure Linux: a $kernelopts reference kept as written, a loop over grub.d after it
    "azurelinux2_kernelopts_reference": (6, 'GRUB_CMDLINE_LINUX_DEFAULT=" $kernelopts %s"' % ADDED),
    "azurelinux3_kernelopts_reference": (6, 'GRUB_CMDLINE_LINUX_DEFAULT=" $kernelopts %s"' % ADDED),
    "azurelinux4_bls_default_only": (1, 'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0 rd.shell=0 %s"' % ADDED),
}

# the quoting styles: file text -> (line lock edits, its new content, value the shell then reads)
QUOTING = {
    "double quotes": (
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX=""\n',
        2,
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash %s"' % ADDED,
        "quiet splash " + ADDED,
    ),
    "single quotes": (
        "GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT='quiet splash'\n",
        2,
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash %s'" % ADDED,
        "quiet splash " + ADDED,
    ),
    "unquoted word": (
        "GRUB_CMDLINE_LINUX_DEFAULT=quiet\n",
        1,
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet %s"' % ADDED,
        "quiet " + ADDED,
    ),
    "unquoted empty": (
        "GRUB_CMDLINE_LINUX_DEFAULT=\nGRUB_TIMEOUT=5\n",
        1,
        'GRUB_CMDLINE_LINUX_DEFAULT="%s"' % ADDED,
        ADDED,
    ),
    "empty double quotes": (
        'GRUB_CMDLINE_LINUX_DEFAULT=""\n',
        1,
        'GRUB_CMDLINE_LINUX_DEFAULT="%s"' % ADDED,
        ADDED,
    ),
    "empty single quotes": (
        "GRUB_CMDLINE_LINUX_DEFAULT=''\n",
        1,
        "GRUB_CMDLINE_LINUX_DEFAULT='%s'" % ADDED,
        ADDED,
    ),
    "reference to itself": (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT splash"\n',
        2,
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT splash %s"' % ADDED,
        "quiet splash " + ADDED,
    ),
    "braced reference": (
        'GRUB_CMDLINE_LINUX="rhgb"\nGRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} quiet"\n',
        2,
        'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} quiet %s"' % ADDED,
        "rhgb quiet " + ADDED,
    ),
    "commented-out assignment": (
        '#GRUB_CMDLINE_LINUX_DEFAULT="nomodeset"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
        2,
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet %s"' % ADDED,
        "quiet " + ADDED,
    ),
    "trailing comment": (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"  # set by the installer\n',
        1,
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet %s"  # set by the installer' % ADDED,
        "quiet " + ADDED,
    ),
    "escaped quotes": (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet acpi_osi=\\"Windows 2015\\""\n',
        1,
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet acpi_osi=\\"Windows 2015\\" %s"' % ADDED,
        'quiet acpi_osi="Windows 2015" ' + ADDED,
    ),
    "multiple assignments, last wins": (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="splash"\n',
        3,
        'GRUB_CMDLINE_LINUX_DEFAULT="splash %s"' % ADDED,
        "splash " + ADDED,
    ),
    "exported": (
        "export GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n",
        1,
        "export GRUB_CMDLINE_LINUX_DEFAULT='quiet %s'" % ADDED,
        "quiet " + ADDED,
    ),
    "mixed quoting ending unquoted": (
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet '\\$x\n",
        1,
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet '\\$x\" %s\"" % ADDED,
        "quiet $x " + ADDED,
    ),
    "reference alone, empty": (
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT"\n',
        1,
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT %s"' % ADDED,
        " " + ADDED,
    ),
    "single-quoted backslash at the end": (
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet\\'\n",
        1,
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet\\ %s'" % ADDED,
        "quiet\\ " + ADDED,
    ),
    "only GRUB_CMDLINE_LINUX": (
        'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX="rhgb quiet"\nGRUB_DISABLE_RECOVERY="true"\n',
        2,
        'GRUB_CMDLINE_LINUX="rhgb quiet %s"' % ADDED,
        "rhgb quiet " + ADDED,
    ),
    "neither variable": ("GRUB_TIMEOUT=5", 2, 'GRUB_CMDLINE_LINUX_DEFAULT="%s"' % ADDED, ADDED),
}

# what cannot be edited safely: file text -> (line named, words of the message)
UNSAFE = {
    "command substitution": (
        'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX="$(cat /etc/cmdline)"\n',
        2,
        "command substitution",
    ),
    "backticks": ("GRUB_CMDLINE_LINUX_DEFAULT=`cat /etc/cmdline`\n", 1, "command substitution"),
    "line continuation": (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet \\\nsplash"\n',
        1,
        "line continuation",
    ),
    "quote closed on a later line": ('GRUB_CMDLINE_LINUX_DEFAULT="quiet\nsplash"\n', 1, "not closed"),
    "parameter expansion with a default": (
        'GRUB_CMDLINE_LINUX_DEFAULT="${EXTRA:-quiet}"\n',
        1,
        "parameter expansion",
    ),
    "inside an if block": (
        'if [ -e /x ]; then\n  GRUB_CMDLINE_LINUX="quiet"\nfi\n',
        2,
        "indented assignment",
    ),
    "inside an if block, not indented": (
        'if [ -e /x ]; then\nGRUB_CMDLINE_LINUX="quiet"\nfi\n',
        2,
        "inside if/case",
    ),
    "an append": ('GRUB_CMDLINE_LINUX="quiet"\nGRUB_CMDLINE_LINUX+=" splash"\n', 2, "append (+=)"),
    "a DOS file": ('GRUB_TIMEOUT=5\r\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\r\n', 1, "carriage return"),
    "two assignments on one line": (
        'GRUB_TERMINAL_OUTPUT="console" GRUB_CMDLINE_LINUX="quiet"\n',
        1,
        "compound line",
    ),
}


def node(tmp_path: Path, content: bytes) -> tuple[Context, Path]:
    root = tmp_path / "root"
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/grub").write_bytes(content)
    ctx = Context(
        lambda argv, timeout, env=None: (127, "", "not here"),
        lambda name: None,
        root=str(root),
        state_dir=str(tmp_path / "state"),
    )
    return ctx, root / "etc/default/grub"


def lock(ctx: Context) -> list[dict]:
    module = SimpleNamespace(check_mode=False)
    changes, _skipped = env_lock.lock(module, ctx, PARAMS, ctx.load_state(env_lock.STATE))
    return changes


def restore(ctx: Context) -> list[dict]:
    return env_lock.restore(SimpleNamespace(check_mode=False), ctx, ctx.load_state(env_lock.STATE))


def changed_lines(before: bytes, after: bytes) -> dict[int, str]:
    old, new = before.decode().splitlines(), after.decode().splitlines()
    return {n: line for n, line in enumerate(new, start=1) if n > len(old) or old[n - 1] != line}


def shell_reads(path: Path, name: str) -> str:
    """What bash holds in `name` after sourcing the file, as grub-mkconfig does."""
    script = '. "$1" >/dev/null 2>&1; printf %s "${!2}"'
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script, "bash", str(path), name],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    return out.stdout


def round_trip(tmp_path: Path, original: bytes) -> tuple[Path, dict, bytes]:
    """Lock, lock again, restore, restore again; (file, the grub change, the locked bytes)."""
    ctx, path = node(tmp_path, original)
    changes = [c for c in lock(ctx) if c["knob"] == "grub"]
    assert len(changes) == 1, changes
    locked = path.read_bytes()
    assert locked != original
    assert lock(ctx) == [], "a second lock changes nothing"
    assert path.read_bytes() == locked
    restored = restore(ctx)
    assert [c["knob"] for c in restored] == ["grub"]
    assert path.read_bytes() == original, "restore gives back the original bytes"
    assert restore(ctx) == []
    return path, changes[0], locked


@pytest.mark.parametrize("fixture", sorted(REAL_FILES))
def test_real_distribution_file_locked_on_one_line_and_restored_byte_exact(tmp_path, fixture):
    original = (GRUB / fixture).read_bytes()
    line_no, expected = REAL_FILES[fixture]
    path, change, locked = round_trip(tmp_path, original)
    assert changed_lines(original, locked) == {line_no: expected}
    variable = expected.split("=", 1)[0]
    assert change["variable"] == variable and change["added"] == ADDED.split()
    if "/etc/default/grub.d" in original.decode() and Path("/etc/default/grub.d").is_dir():
        return  # the Azure Linux files source this host's grub.d: bash would read this host's settings
    path.write_bytes(locked)
    assert shell_reads(path, variable) == change["after"]
    path.write_bytes(original)
    assert shell_reads(path, variable) == change["before"]


@pytest.mark.parametrize("case", sorted(QUOTING))
def test_each_quoting_style_edited_in_its_own_style_and_restored_byte_exact(tmp_path, case):
    text, line_no, expected, value = QUOTING[case]
    path, change, locked = round_trip(tmp_path, text.encode())
    assert changed_lines(text.encode(), locked) == {line_no: expected}
    assert change["after"] == value
    path.write_bytes(locked)
    assert shell_reads(path, change["variable"]) == value


def test_arguments_already_on_the_kernel_line_are_not_added_again(tmp_path):
    # processor.max_cstate=1 already in GRUB_CMDLINE_LINUX: the default entry gets it from there
    text = "GRUB_CMDLINE_LINUX='processor.max_cstate=1'\nGRUB_CMDLINE_LINUX_DEFAULT='quiet'\n"
    _path, change, locked = round_trip(tmp_path, text.encode())
    assert change["added"] == ["intel_idle.max_cstate=1"]
    assert changed_lines(text.encode(), locked) == {
        2: "GRUB_CMDLINE_LINUX_DEFAULT='quiet intel_idle.max_cstate=1'"
    }
    ctx, _path = node(tmp_path / "again", ("GRUB_CMDLINE_LINUX_DEFAULT='quiet %s'\n" % ADDED).encode())
    assert [c for c in lock(ctx) if c["knob"] == "grub"] == []


def test_a_value_changed_after_lock_loses_only_the_added_arguments(tmp_path):
    ctx, path = node(tmp_path, b"GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n")
    lock(ctx)
    path.write_bytes(b"GRUB_CMDLINE_LINUX_DEFAULT='quiet nomodeset %s'\n" % ADDED.encode())
    restore(ctx)
    assert path.read_bytes() == b"GRUB_CMDLINE_LINUX_DEFAULT='quiet nomodeset'\n"


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_what_cannot_be_edited_safely_fails_naming_file_and_line(tmp_path, case):
    text, line_no, words = UNSAFE[case]
    ctx, path = node(tmp_path, text.encode())
    with pytest.raises(CollectorError) as failure:
        lock(ctx)
    assert path.read_bytes() == text.encode(), "nothing written"
    message = str(failure.value)
    assert str(path) in message and "at line %d" % line_no in message and words in message


def test_a_real_broken_file_fails_naming_the_line(tmp_path):
    # the RHEL file leapp-repository detects: words after the closing quote run as a command
    original = (GRUB / "rhel7_BROKEN_words_after_closing_quote").read_bytes()
    ctx, path = node(tmp_path, original)
    with pytest.raises(CollectorError, match=r"words after the value .* at line 6"):
        lock(ctx)
    assert path.read_bytes() == original


def test_the_parser_reads_each_real_file_as_bash_does():
    for fixture in sorted(REAL_FILES):
        text = grub_default.decode((GRUB / fixture).read_bytes())
        found = grub_default.assignments(text, fixture)
        if "/etc/default/grub.d" in text and Path("/etc/default/grub.d").is_dir():
            continue
        for name in grub_default.CMDLINE_NAMES:
            assert grub_default.value_of(found, name) == shell_reads(GRUB / fixture, name), (fixture, name)


def test_a_file_with_a_non_utf8_comment_round_trips(tmp_path):
    original = b'# Ger\xe4t\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    round_trip(tmp_path, original)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet="ab =#$\\'\"{}:-._0~\t", max_size=14))
def test_any_value_is_read_as_bash_reads_it_or_refused(tmp_path, value):
    """Never silently wrong: a value is either refused, or read, edited and restored as bash reads it."""
    text = "GRUB_CMDLINE_LINUX_DEFAULT=%s\n" % value
    try:
        locked, record = grub_default.add_args(text, ADDED.split())
    except grub_default.GrubDefaultError:
        return
    path = tmp_path / "grub"
    path.write_text(text)
    assert record is not None and record["before"] == shell_reads(path, "GRUB_CMDLINE_LINUX_DEFAULT")
    path.write_text(locked)
    assert record["after"] == shell_reads(path, "GRUB_CMDLINE_LINUX_DEFAULT")
    assert grub_default.remove_args(locked, record) == text


def test_a_grub_d_snippet_that_sets_the_command_line_is_the_file_edited(tmp_path):
    """Debian's grub-mkconfig sources /etc/default/grub.d/*.cfg after /etc/default/grub; Ubuntu cloud
    images set GRUB_CMDLINE_LINUX_DEFAULT there, so an edit of /etc/default/grub alone would be lost.
    The snippet is written here (not a capture): one assignment, as those images carry."""
    main = (GRUB / "ubuntu_ipv6_disabled_role").read_bytes()
    snippet = b'# Set the default commandline\nGRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n'
    ctx, path = node(tmp_path, main)
    cfg = path.parent / "grub.d/50-cloudimg-settings.cfg"
    cfg.parent.mkdir()
    cfg.write_bytes(snippet)
    changes = [c for c in lock(ctx) if c["knob"] == "grub"]
    assert [c["target"] for c in changes] == ["/etc/default/grub.d/50-cloudimg-settings.cfg"]
    assert path.read_bytes() == main
    assert changed_lines(snippet, cfg.read_bytes()) == {
        2: 'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0 %s"' % ADDED
    }
    both = tmp_path / "both"
    both.write_bytes(main + cfg.read_bytes())
    assert shell_reads(both, "GRUB_CMDLINE_LINUX_DEFAULT") == changes[0]["after"]
    assert lock(ctx) == []
    restore(ctx)
    assert path.read_bytes() == main and cfg.read_bytes() == snippet
