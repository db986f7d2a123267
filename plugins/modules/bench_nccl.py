#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_nccl
short_description: NCCL all-reduce bus bandwidth and latency per size, Ring and Tree
version_added: "0.1.0"
description:
  - Runs nccl-tests (C(all_reduce_perf -b 8 -e 2G -f 2) by default) once per algorithm with C(NCCL_ALGO=Ring) and C(Tree), I(repetitions) times.
  - Reports out-of-place bus bandwidth per size and the average (C(bench_allreduce_busbw_gb_per_s), labels algo and size), and the time per size as the median and max over repetitions (C(bench_allreduce_latency_us), label stat).
  - Results with C(#wrong) above zero fail the task (data corruption on the path); MPI and NCCL launch failures fail it with the line that says what happened, and so does a run cut short (C(Test NCCL failure) after some sizes, or a table without its C(Avg bus bandwidth) summary).
  - Reads output behind C(mpirun --tag-output) and C(srun --label) prefixes; a run with validation off (C(-c 0)) is recorded as not validated, its wrong results as unknown, never 0.
extends_documentation_fragment:
  - aicluster.stethoscope.node
  - aicluster.stethoscope.bench
options:
  binary:
    description: The nccl-tests program.
    type: str
    default: all_reduce_perf
  args:
    description: Its arguments.
    type: list
    elements: str
    default: ["-b", "8", "-e", "2G", "-f", "2", "-g", "1"]
  algos:
    description: Values of C(NCCL_ALGO), one run each.
    type: list
    elements: str
    default: [Ring, Tree]
  launcher:
    description: Launcher argv before the program (C(mpirun -np 16 -H a:8,b:8) for several nodes).
    type: list
    elements: str
    default: []
author:
  - stethoscope developers
"""

EXAMPLES = r"""
- name: All-reduce on the node's 8 GPUs
  aicluster.stethoscope.bench_nccl:
    args: ["-b", "8", "-e", "2G", "-f", "2", "-g", "8"]
    fingerprint: "{{ __fingerprint.stethoscope_fingerprint }}"
"""

RETURN = r"""
stethoscope_bench:
  description: Suite C(nccl), fingerprints and every repetition's results.
  returned: success
  type: dict
stethoscope_metrics:
  description: Median per metric (stat=median) and the latency maximum (stat=max).
  returned: success
  type: list
  elements: dict
stability:
  description: Per metric the repetitions, median, relative standard deviation and the unstable flag.
  returned: success
  type: list
  elements: dict
runs:
  description: Per run the algorithm, exit code, wrong results (null when the run did not check them, C(-c 0)), whether it validated, average bus bandwidth and NCCL version.
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import suite_nccl
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    BENCH_ARGUMENT_SPEC,
    argument_spec,
    run_bench,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            binary={"type": "str", "default": "all_reduce_perf"},
            args={
                "type": "list",
                "elements": "str",
                "default": ["-b", "8", "-e", "2G", "-f", "2", "-g", "1"],
            },
            algos={"type": "list", "elements": "str", "default": ["Ring", "Tree"]},
            launcher={"type": "list", "elements": "str", "default": []},
            **BENCH_ARGUMENT_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    run_bench(
        module,
        lambda ctx: suite_nccl.run(
            ctx,
            p["binary"],
            p["args"],
            p["algos"],
            p["launcher"],
            p["repetitions"],
            p["fingerprint"],
            p["max_rsd_percent"],
        ),
        "%s %s with NCCL_ALGO in %s" % (p["binary"], " ".join(p["args"]), p["algos"]),
        tool=(p["launcher"] or [p["binary"]])[0],
    )


if __name__ == "__main__":
    main()
