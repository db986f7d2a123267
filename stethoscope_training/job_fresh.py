"""The job scenes' clean hold-out (issue 21, set "jobs-1"): variants written before the job-relative
detector's constants were chosen on job_families.py's validation scenes, and never used to choose
them. Same simulation (stethoscope_training/jobs.py), other conditions: what a straggler, an input
stall and a congested switch also look like in a real fleet, and healthy work that a job-relative
view might take for a fault. Scored by benchmarks/model_jobs.py and `stethoscope model evaluate`.

- straggler_hot: the straggler's GPUs also run hot and clock lower (a failing fan), so the graphs
  see it too;
- straggler_in_small_jobs / straggler_in_large_jobs: the culprit in a job of 4 ranks (3 peers
  to compare with) or of 32-64;
- input_stall_bursty: the stall on 50-85 % of the steps after its onset (a flaky NFS mount);
- input_stall_mild: 8-30 % of the step (a slow local cache);
- congestion_slow_ramp: the waits climb over 3-7 minutes to 3-10 times (a link slowly degrading
  its credits), onset early;
- congestion_behind_packed_jobs: every job placed on the next free block, so most jobs sit behind
  one switch and their peers elsewhere are few;
- healthy_pipeline_stages: half the jobs of 8 ranks or more compute in 2 or 4 pipeline stages of
  unequal length (+-8 %);
- healthy_input_heavy: jobs that wait 5-30 % of the step for input, widely varying step to step;
- healthy_neighbour_spells: one switch's traffic comes in spells of 1-3 steps every ~10 (an
  all-to-all job next door), waits 3-20 times as long during a spell;
- healthy_restarts: most jobs start, end or restart in the window, most checkpoint."""

from __future__ import annotations

from stethoscope_training.job_families import SceneSet, generate
from stethoscope_training.jobs import Options

SET = "jobs-1"
SALT = 2101
SPLIT = "fresh"

FAMILIES: dict[str, tuple[str, Options]] = {
    "fresh.straggler_hot": ("straggler", Options(severity=(0.06, 0.5), hot_culprit=True)),
    "fresh.straggler_in_small_jobs": (
        "straggler",
        Options(severity=(0.06, 0.5), sizes=(4, 8), size_weights=(0.7, 0.3), fault_job_sizes=(4,)),
    ),
    "fresh.straggler_in_large_jobs": (
        "straggler",
        Options(severity=(0.06, 0.5), size_weights=(0.1, 0.1, 0.2, 0.3, 0.3), fault_job_sizes=(32, 64)),
    ),
    "fresh.input_stall_bursty": ("input_stall", Options(severity=(0.1, 2.0), duty=(0.5, 0.85))),
    "fresh.input_stall_mild": ("input_stall", Options(severity=(0.08, 0.3))),
    "fresh.congestion_slow_ramp": (
        "switch_congestion",
        Options(onset=(10, 40), ramp=(36, 84), waits=(3.0, 10.0)),
    ),
    "fresh.congestion_behind_packed_jobs": (
        "switch_congestion",
        Options(onset=(30, 80), ramp=(6, 40), packed=1.0),
    ),
    "fresh.healthy_pipeline_stages": ("healthy", Options(pipeline=0.5)),
    "fresh.healthy_input_heavy": ("healthy", Options(data_share=(0.05, 0.3), data_sigma=0.7)),
    "fresh.healthy_neighbour_spells": ("healthy", Options(bursts=True)),
    "fresh.healthy_restarts": ("healthy", Options(lifecycle=0.9, checkpoint=0.9)),
}


def scenes(seed: int = 2026, per_family: int = 40) -> SceneSet:
    return generate(FAMILIES, seed, per_family, salt=SALT, split=SPLIT)
