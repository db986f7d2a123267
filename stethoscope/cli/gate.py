"""`stethoscope gate`: the node's Slurm health check (telemetry/gate.py, which nodes run as gate.py), run
here: it asks serve for the node's verdict and never reaches the database."""

from __future__ import annotations

import argparse

from stethoscope.cli.common import Subcommands
from stethoscope.telemetry import gate as slurm_gate


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    gate = commands.add_parser(
        "gate",
        help="Slurm's health check: exit 1 and drain when the node's verdict fails (no verdict: said)",
        parents=parents,
    )
    slurm_gate.add_arguments(gate)
    gate.set_defaults(func=slurm_gate.run)
