# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parsers for `nvidia-smi nvlink -s`, `-e` and `-gt d` output.

A GPU without NVLink prints nothing (the H200 VM capture): that is "no NVLink", not an error.
"All links are inactive" is a fact about hardware that is there: links reported down.
"""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_LINK_STATUS = re.compile(r"^Link (\d+): (.+)$")
_LINK_COUNTER = re.compile(r"^Link (\d+): (.+?):\s*(\d+)(?:\s*(KiB|MiB|GiB|B))?\s*$")
ALL_INACTIVE = "all links are inactive"
_UNIT = {"B": 1 / 1024, "KiB": 1, "MiB": 1024, "GiB": 1024 * 1024, None: 1}


def _gpu_blocks(tool, text):
    """Yield (gpu index, name, uuid, [(line number, stripped line)]) per 'GPU N:' block."""
    current = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        match = _GPU.match(stripped)
        if match:
            if current:
                yield current
            current = (int(match.group(1)), match.group(2), match.group(3), [])
            continue
        if current is None:
            raise ParseError(tool, "expected a 'GPU N:' line", number, line)
        current[3].append((number, stripped))
    if current:
        yield current


def parse_status(text):
    """`nvlink -s` -> {gpu index: {"name", "uuid", "all_inactive", "links": {n: {"up", "speed_gb_s"}}}}."""
    tool = "nvidia-smi nvlink -s"
    gpus = {}
    for index, name, uuid, lines in _gpu_blocks(tool, text):
        entry = {"name": name, "uuid": uuid, "all_inactive": False, "links": {}}
        for number, line in lines:
            if ALL_INACTIVE in line:
                entry["all_inactive"] = True
                continue
            match = _LINK_STATUS.match(line)
            if not match:
                raise ParseError(tool, "expected 'Link N: <speed>'", number, line)
            state = match.group(2).strip()
            speed = re.match(r"(\d+(?:\.\d+)?) GB/s", state)
            entry["links"][int(match.group(1))] = {
                "up": 1 if speed else 0,
                "speed_gb_s": float(speed.group(1)) if speed else None,
                "state": state,
            }
        gpus[index] = entry
    return gpus


def _counters(tool, text, classify):
    gpus = {}
    for index, _name, _uuid, lines in _gpu_blocks(tool, text):
        links = gpus.setdefault(index, {})
        for number, line in lines:
            if ALL_INACTIVE in line:
                continue
            match = _LINK_COUNTER.match(line)
            if not match:
                raise ParseError(tool, "expected 'Link N: <counter>: <value>'", number, line)
            key = classify(match.group(2).lower())
            if key is None:
                continue
            value = int(match.group(3)) * _UNIT[match.group(4)]
            counters = links.setdefault(int(match.group(1)), {})
            counters[key] = counters.get(key, 0) + value
    return gpus


def _error_kind(label):
    for key in ("crc", "replay", "recovery"):
        if key in label:
            return key
    return None


def parse_errors(text):
    """`nvlink -e` -> {gpu: {link: {"crc", "replay", "recovery"}}} (CRC flit + data summed)."""
    return _counters("nvidia-smi nvlink -e", text, _error_kind)


def parse_throughput(text):
    """`nvlink -gt d` -> {gpu: {link: {"data_kib"}}}: Tx + Rx in KiB."""
    return _counters("nvidia-smi nvlink -gt d", text, lambda label: "data_kib" if "data" in label else None)
