# Copyright: stethoscope developers
# Apache License 2.0
"""Where a node's NVMe drives are in sysfs, seen under a root prefix (as the modules take it: the lab's
nodes are folders). One discovery for the modules and the push agent: the push_agent role copies this
file beside agent.py, so it imports nothing but the standard library and stays Python 3.8."""

from __future__ import annotations

import os
import re

NVME_CLASS = "/sys/class/nvme"
_CONTROLLER = re.compile(r"nvme\d+$")
# Where the kernel puts a controller's hwmon (its temperatures), relative to the controller: under the
# controller itself, or, on the first kernels with NVMe hwmon (5.5), under its PCI function.
_NVME_HWMON_PARENTS = ("", "device/hwmon/")
_COMPOSITE = "temp1_input"  # the drive's composite temperature, millidegrees Celsius


def under(root, absolute):
    """`absolute`, a path as on the node, under the root prefix."""
    return os.path.join(root or "/", absolute.lstrip("/"))


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def nvme_controllers(root="/"):
    """The NVMe controllers (nvme0, nvme1, ...), sorted."""
    return [name for name in _listdir(under(root, NVME_CLASS)) if _CONTROLLER.match(name)]


def nvme_temperature_inputs(root="/"):
    """[(controller, path of its composite temperature)] for each controller that has one."""
    found = []
    for controller in nvme_controllers(root):
        path = _composite(under(root, "%s/%s/" % (NVME_CLASS, controller)))
        if path is not None:
            found.append((controller, path))
    return found


def _composite(controller_dir):
    for parent in _NVME_HWMON_PARENTS:
        folder = controller_dir + parent
        for hwmon in _listdir(folder):
            path = os.path.join(folder, hwmon, _COMPOSITE)
            if hwmon.startswith("hwmon") and os.path.isfile(path):
                return path
    return None
