#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_storage
short_description: fio 4k random read IOPS and latency percentiles, and a sustained-write latency cliff
version_added: "0.1.0"
description:
  - C(mode=burst) runs fio 4k random read, iodepth 64, libaio, direct I/O, JSON output, I(repetitions) times;
    reports IOPS and completion-latency p50/p99/p99.9 (fio's own percentiles; none where C(gtod_reduce)
    measured none).
  - 'C(mode=sustained) writes 4k blocks at random for I(runtime) seconds with a latency log, and always reports
    the cliff, once per run: C(bench_fio_latency_jump_seconds) is the time at which latency stays above
    I(jump_factor) times its first minute (the seed''s 120 µs to 8 ms after 30 minutes), or I(runtime) when it
    never does within the run; C(bench_fio_latency_jumped) is 1 or 0 accordingly. Labels C(mode), C(bs),
    C(iodepth) and C(runtime) keep runs of another shape apart. It writes to I(filename), so it refuses a
    block device, also one reached through a symlink (it would destroy the drive''s data); C(mode=burst)
    only reads and may read one.'
  - The command's time limit is at least I(runtime) plus 300 seconds (fio runs for I(runtime) by design).
extends_documentation_fragment:
  - aicluster.stethoscope.bench
  - aicluster.stethoscope.node
options:
  filename:
    description: File or block device to test.
    type: path
    required: true
  mode:
    description: C(burst) random read or C(sustained) write.
    type: str
    choices: [burst, sustained]
    default: burst
  size:
    description: fio C(--size).
    type: str
    default: 1G
  runtime:
    description: Seconds per run.
    type: int
    default: 30
  iodepth:
    description: Queue depth.
    type: int
    default: 64
  block_size:
    description: Block size.
    type: str
    default: 4k
  direct:
    description: O_DIRECT (bypass the page cache).
    type: bool
    default: true
  ioengine:
    description: fio I/O engine.
    type: str
    default: libaio
  log_dir:
    description: Where the sustained run's latency log is written.
    type: path
    default: /var/lib/stethoscope
  jump_factor:
    description: How many times the first minute's median latency counts as the cliff.
    type: float
    default: 10
  device_label:
    description: Device name in the results (default the file's or device's base name).
    type: str
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Random read on a scratch file
  aicluster.stethoscope.bench_storage:
    filename: /scratch/stethoscope.fio
    size: 8G
"""

RETURN = r"""
stethoscope_bench:
  description: Suite C(storage), fingerprints and every repetition's results.
  returned: success
  type: dict
stethoscope_metrics:
  description: Median over repetitions per metric (C(mode=sustained) runs once, its values as they are).
  returned: success
  type: list
  elements: dict
sustained:
  description: C(mode=sustained) only. The latency log's number of points, its path and the jump found
    (C(at_seconds), C(baseline_us), C(after_us), C(factor)), or null when latency never jumped within the run.
  returned: when mode is sustained
  type: dict
stability:
  description: Per metric the repetitions, median, relative standard deviation and the unstable flag.
  returned: success
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import suite_storage
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    BENCH_ARGUMENT_SPEC,
    argument_spec,
    run_bench,
)

FIO_SETUP_SECONDS = 300


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            filename={"type": "path", "required": True},
            mode={"type": "str", "choices": ["burst", "sustained"], "default": "burst"},
            size={"type": "str", "default": "1G"},
            runtime={"type": "int", "default": 30},
            iodepth={"type": "int", "default": 64},
            block_size={"type": "str", "default": "4k"},
            direct={"type": "bool", "default": True},
            ioengine={"type": "str", "default": "libaio"},
            log_dir={"type": "path", "default": "/var/lib/stethoscope"},
            jump_factor={"type": "float", "default": 10.0},
            device_label={"type": "str"},
            **BENCH_ARGUMENT_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    # fio runs for `runtime` by design (time_based): its limit is that plus laying out the file
    p["timeout"] = max(p["timeout"], p["runtime"] + FIO_SETUP_SECONDS)
    label = p["device_label"] or os.path.basename(p["filename"])
    job = suite_storage.FioJob(
        p["filename"], p["size"], p["runtime"], p["iodepth"], p["block_size"], p["direct"], p["ioengine"]
    )
    if p["mode"] == "sustained":
        if suite_storage.is_block_device(p["filename"]):
            module.fail_json(
                msg="refusing a sustained write on %s: it is a block device (%s) and the write would destroy "
                "its data; point filename at a file on the filesystem under test"
                % (p["filename"], os.path.realpath(p["filename"]))
            )
        run_bench(
            module,
            lambda ctx: suite_storage.run_sustained(
                ctx, job, p["log_dir"], p["fingerprint"], label, p["jump_factor"]
            ),
            "a %ss sustained write on %s" % (p["runtime"], p["filename"]),
            tool="fio",
        )
    run_bench(
        module,
        lambda ctx: suite_storage.run_randread(
            ctx, job, p["repetitions"], p["fingerprint"], p["max_rsd_percent"], label
        ),
        "fio randread on %s, %d x %ss" % (p["filename"], p["repetitions"], p["runtime"]),
        tool="fio",
    )


if __name__ == "__main__":
    main()
