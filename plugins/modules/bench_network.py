#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_network
short_description: RDMA latency and bandwidth to a peer with perftest
version_added: "0.1.0"
description:
  - Runs perftest clients (C(ib_write_lat), C(ib_read_lat), C(ib_write_bw)) against a server started on the peer
    (the C(bench_network) role starts it), I(repetitions) times.
  - Reports typical, p99 and p99.9 latency (perftest's own percentiles) and average bandwidth in Gbit/s; a run
    that ends in C(Failed status) fails the task with that line, and so does a run whose result table lacks
    its closing line (stopped by ^C or killed mid-sweep), which is incomplete, never a result.
extends_documentation_fragment:
  - aicluster.stethoscope.bench
  - aicluster.stethoscope.node
options:
  server:
    description: Address of the peer running the perftest servers.
    type: str
    required: true
  peer:
    description: Inventory name of the peer, for the results' labels (default I(server)).
    type: str
  tests:
    description: perftest programs to run, in order.
    type: list
    elements: str
    choices: [ib_write_lat, ib_read_lat, ib_send_lat, ib_write_bw, ib_read_bw, ib_send_bw]
    default: [ib_write_lat, ib_read_lat, ib_write_bw]
  rdma_device:
    description: HCA to use (C(-d)).
    type: str
    default: mlx5_0
  size:
    description: Message size in bytes (C(-s)).
    type: int
    default: 2
  iterations:
    description: Iterations per test (C(-n)).
    type: int
    default: 1000
  repetition_number:
    description: Run once and record it as this repetition (the role loops, starting a server before each client).
    type: int
  port:
    description: TCP port of the peer's perftest server (C(-p)); perftest's own 18515 when not given.
    type: int
  hca_port:
    description: Port of I(rdma_device) whose RC counters (C(hw_counters/local_ack_timeout_err),
      C(rnr_nak_retry_err), C(packet_seq_err), C(out_of_sequence)) are read before and after each client
      run, their increase reported per pair (C(bench_rdma_rc_local_ack_timeouts), C(bench_rdma_rc_rnr_nak_retries),
      C(bench_rdma_rc_packet_seq_errors), C(bench_rdma_rc_out_of_sequence)); none where the HCA has no such counters.
    type: int
    default: 1
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Latency and bandwidth to the next node
  aicluster.stethoscope.bench_network:
    server: 10.0.0.12
    peer: gpu-a01-02
"""

RETURN = r"""
stethoscope_bench:
  description: Suite C(network), fingerprints and every repetition's results.
  returned: success
  type: dict
stethoscope_metrics:
  description: Median over repetitions per metric.
  returned: success
  type: list
  elements: dict
stability:
  description: Per metric the repetitions, median, relative standard deviation and the unstable flag.
  returned: success
  type: list
  elements: dict
runs:
  description: Per client run the test, repetition, exit code, whether its output was incomplete, the failure
    line and the increase of each RC counter during it (null where the HCA has none).
  returned: success
  type: list
  elements: dict
ansible_facts:
  description: C(stethoscope_rdma_pair), the pair measured (peer, server address, port, HCA and its port); the
    results carry no peer label, so that a pair is compared with its class's other pairs.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import suite_network
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    BENCH_ARGUMENT_SPEC,
    argument_spec,
    run_bench,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            server={"type": "str", "required": True},
            peer={"type": "str"},
            tests={
                "type": "list",
                "elements": "str",
                "default": ["ib_write_lat", "ib_read_lat", "ib_write_bw"],
                "choices": [
                    "ib_write_lat",
                    "ib_read_lat",
                    "ib_send_lat",
                    "ib_write_bw",
                    "ib_read_bw",
                    "ib_send_bw",
                ],
            },
            rdma_device={"type": "str", "default": "mlx5_0"},
            size={"type": "int", "default": 2},
            iterations={"type": "int", "default": 1000},
            repetition_number={"type": "int"},
            port={"type": "int"},
            hca_port={"type": "int", "default": 1},
            **BENCH_ARGUMENT_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    run_bench(
        module,
        lambda ctx: suite_network.run(
            ctx,
            p["tests"],
            p["server"],
            p["peer"] or p["server"],
            p["rdma_device"],
            p["size"],
            p["iterations"],
            p["repetitions"],
            p["fingerprint"],
            p["max_rsd_percent"],
            repetition_number=p["repetition_number"],
            port=p["port"],
            hca_port=p["hca_port"],
        ),
        "%s against %s" % (", ".join(p["tests"]), p["server"]),
        tool=p["tests"][0] if p["tests"] else None,
    )


if __name__ == "__main__":
    main()
