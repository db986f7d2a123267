# Copyright: stethoscope developers
# Apache License 2.0
"""Options shared by the benchmark modules."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  repetitions:
    description: How many times the suite runs; results are kept per repetition.
    type: int
    default: 3
  max_rsd_percent:
    description: A metric whose repetitions' relative standard deviation exceeds this is flagged C(unstable) (stored all the same).
    type: float
    default: 3.0
  fingerprint:
    description: The node's fingerprint (M(aicluster.stethoscope.fingerprint)'s C(stethoscope_fingerprint)), stored with every result.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: In check mode nothing runs; the module says what it would run.
  diff_mode:
    support: none
    description: A benchmark reports no change (C(changed=false)), so there is no diff to show.
  facts:
    support: none
    description: Results are returned as C(stethoscope_bench) and C(stethoscope_metrics), not as facts.
"""
