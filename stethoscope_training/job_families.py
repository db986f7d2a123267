"""The job scenes' families (stethoscope_training/jobs.py): what the job-relative detector's
constants were chosen on (split "validation", `scenes(seed)`), beside job_fresh.py's sets (split
"fresh": jobs-1, written before the constants were first chosen and read since; jobs-2, the
hold-out). One fault a scene, or none.

The ranges: a straggler computes 6-50 % longer (the episode generator's straggler GPU: 8-48 %), at
its normal clock and power; an input stall adds 10-200 % of the step to one rank's input wait; a
congested switch's nodes wait 3-40 times as long to transmit (the congested neighbour's 4-43), the
transfers of the jobs crossing it 0.3-2.5 times longer once the waits pass a third of their rise.

MULTI_RANK (`multi_rank_scenes`): the same faults in jobs of 2-8 ranks a node (an 8-GPU node runs
8), an input stall holding every rank of its node, in jobs of 2 nodes and more. Written after the
detector's constants were chosen, with the change that judges a rank against the ranks on other
nodes; not part of the validation split (its data hash is unchanged) nor of the hold-out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from stethoscope_training.episodes import hardware
from stethoscope_training.jobs import Options, Scene, simulate

FAMILIES: dict[str, tuple[str, Options]] = {
    "jobs.healthy": ("healthy", Options()),
    "jobs.healthy_lifecycle": ("healthy", Options(lifecycle=0.7, checkpoint=0.7)),
    "jobs.straggler": ("straggler", Options(severity=(0.06, 0.5))),
    "jobs.input_stall": ("input_stall", Options(severity=(0.1, 2.0))),
    "jobs.switch_congestion": ("switch_congestion", Options(onset=(30, 80), ramp=(6, 40))),
}

MULTI = (2, 8)
MULTI_RANK: dict[str, tuple[str, Options]] = {
    "jobs.multi_rank.healthy": ("healthy", Options(ranks_per_node=MULTI, lifecycle=0.5, checkpoint=0.5)),
    "jobs.multi_rank.straggler": ("straggler", Options(ranks_per_node=MULTI, severity=(0.06, 0.5))),
    "jobs.multi_rank.input_stall": ("input_stall", Options(ranks_per_node=MULTI, severity=(0.1, 2.0))),
    "jobs.multi_rank.input_stall_2x8": (
        "input_stall",
        Options(
            ranks_per_node=(8, 8),
            sizes=(2, 4, 8),
            size_weights=(0.5, 0.3, 0.2),
            fault_job_sizes=(2,),
            severity=(0.1, 2.0),
        ),
    ),
    "jobs.multi_rank.switch_congestion": (
        "switch_congestion",
        Options(ranks_per_node=MULTI, onset=(30, 80), ramp=(6, 40)),
    ),
}


@dataclass
class SceneSet:
    scenes: list[Scene]
    split: str
    seed: int
    per_family: int
    families: list[str]

    def data_hash(self) -> str:
        digest = hashlib.sha256()
        for scene in self.scenes:
            digest.update(scene.family.encode())
            for array in (scene.values, scene.rank_values):
                digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()


def generate(
    families: dict[str, tuple[str, Options]], seed: int, per_family: int, salt: int, split: str
) -> SceneSet:
    """per_family scenes of each family, each from its own stream (seed, salt, family, scene)."""
    _, _, hw = hardware("h200", 1)
    root = np.random.SeedSequence([seed, salt])
    scenes = []
    for stream, (name, (kind, options)) in zip(root.spawn(len(families)), families.items(), strict=True):
        for child in stream.spawn(per_family):
            scenes.append(simulate(np.random.default_rng(child), hw, kind, name, options))
    return SceneSet(scenes, split, seed, per_family, list(families))


def scenes(seed: int = 7, per_family: int = 60) -> SceneSet:
    return generate(FAMILIES, seed, per_family, salt=21, split="validation")


def multi_rank_scenes(seed: int = 7, per_family: int = 20) -> SceneSet:
    return generate(MULTI_RANK, seed, per_family, salt=2102, split="multi_rank")
