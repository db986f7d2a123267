#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_nccl
short_description: NCCL all-reduce bus bandwidth and latency per size, Ring and Tree
version_added: "0.1.0"
description:
  - Runs nccl-tests (C(all_reduce_perf -b 8 -e 2G -f 2) by default) once per algorithm with C(NCCL_ALGO=Ring)
    and C(Tree), I(repetitions) times, with one rank per GPU.
  - With I(launcher=none) one process drives the node's I(gpus_per_node) GPUs (C(-g N)); with C(mpirun) (a
    hostfile of I(hosts), C(--tag-output)) or C(srun) (C(--nodelist), C(--label)) one process per GPU on every
    node of I(hosts), the argv built as a list.
  - A run of one rank is refused before it starts (its bus bandwidth is 0 by definition), and so are several
    I(hosts) without a launcher and I(args) that carry C(-g); a run whose output lists another rank count than
    asked, or whose average bus bandwidth is 0, fails the task naming the run.
  - Every result carries the labels C(ranks) and C(topology) (nodes x GPUs per node, C(2x8)), so the baseline
    compares only like runs.
  - With I(record), runs nothing and returns that result (a multi-node run's, made on the batch's first node)
    with this node's fingerprints, so every participating node stores it.
  - Reports bus and algorithm bandwidth per size and placement (C(placement) C(oop) out of place, C(ip) in place)
    and the average bus bandwidth (C(bench_allreduce_busbw_gb_per_s), labels algo and size C(avg)), and the
    time per size and placement as the median and max over repetitions (C(bench_allreduce_latency_us), label
    stat). nccl-tests prints one time per size, the mean of its iterations, so there is no per-collective
    p99; a rule's C(p99) aggregate reads every stored repetition across runs.
  - Results with C(#wrong) above zero fail the task (data corruption on the path); MPI and NCCL launch failures
    fail it with the line that says what happened, and so does a run cut short (C(Test NCCL failure) after
    some sizes, or a table without its C(Avg bus bandwidth) summary).
  - Reads output behind C(mpirun --tag-output) and C(srun --label) prefixes; a run with validation off (C(-c 0))
    is recorded as not validated, its wrong results as unknown, never 0.
extends_documentation_fragment:
  - aicluster.stethoscope.bench
  - aicluster.stethoscope.node
options:
  binary:
    description: The nccl-tests program.
    type: str
    default: all_reduce_perf
  args:
    description: Its arguments.
    type: list
    elements: str
    default: ["-b", "8", "-e", "2G", "-f", "2"]
  algos:
    description: Values of C(NCCL_ALGO), one run each.
    type: list
    elements: str
    default: [Ring, Tree]
  launcher:
    description: How the ranks start.
    type: str
    choices: [none, mpirun, srun]
    default: none
  launcher_args:
    description: Extra launcher options before the program (C(--mpi=pmix), C(--mca btl ^openib)).
    type: list
    elements: str
    default: []
  gpus_per_node:
    description: GPUs per node, one rank each (the fingerprint's GPU count).
    type: int
    default: 0
  hosts:
    description: Nodes of the run, for C(mpirun) and C(srun) (this node alone within a node).
    type: list
    elements: str
    default: []
  record:
    description: A bench_nccl result registered on another node of the same run, to store on this node.
    type: dict
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: All-reduce on the node's 8 GPUs
  aicluster.stethoscope.bench_nccl:
    gpus_per_node: 8
    fingerprint: "{{ __fingerprint.stethoscope_fingerprint }}"

- name: All-reduce over two nodes of 8 GPUs through Slurm
  aicluster.stethoscope.bench_nccl:
    launcher: srun
    launcher_args: ["--mpi=pmix"]
    hosts: [gpu-a01-01, gpu-a01-02]
    gpus_per_node: 8
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
  description: Per run the algorithm, exit code, wrong results (null when the run did not check them, C(-c 0)),
    whether it validated, average bus bandwidth, NCCL version, rank count, topology and the hosts its ranks
    ran on.
  returned: success
  type: list
  elements: dict
recorded_from_run:
  description: True where the result is another node's run stored on this node (I(record)).
  returned: when I(record) is set
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import nccl_launch, suite_nccl
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
                "default": ["-b", "8", "-e", "2G", "-f", "2"],
            },
            algos={"type": "list", "elements": "str", "default": ["Ring", "Tree"]},
            launcher={"type": "str", "default": "none", "choices": list(nccl_launch.LAUNCHERS)},
            launcher_args={"type": "list", "elements": "str", "default": []},
            gpus_per_node={"type": "int", "default": 0},
            hosts={"type": "list", "elements": "str", "default": []},
            record={"type": "dict"},
            **BENCH_ARGUMENT_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["record"] is not None:
        run_bench(
            module, lambda ctx: suite_nccl.recorded(p["record"], p["fingerprint"]), "store a recorded run"
        )
    hostfile = None
    if p["launcher"] == "mpirun":
        hostfile = os.path.join(module.tmpdir, "nccl-hostfile")
        with open(hostfile, "w") as handle:
            handle.write(nccl_launch.hostfile_text(p["hosts"], p["gpus_per_node"]))
    try:
        launch = nccl_launch.plan(
            p["launcher"],
            p["binary"],
            p["args"],
            p["gpus_per_node"],
            p["hosts"],
            p["launcher_args"],
            hostfile,
        )
    except nccl_launch.LaunchRefused as exc:
        module.fail_json(msg=str(exc))
    run_bench(
        module,
        lambda ctx: suite_nccl.run(
            ctx, p["binary"], p["algos"], launch, p["repetitions"], p["fingerprint"], p["max_rsd_percent"]
        ),
        "%s with NCCL_ALGO in %s" % (" ".join(launch["argv"]), p["algos"]),
        tool=launch["argv"][0],
    )


if __name__ == "__main__":
    main()
