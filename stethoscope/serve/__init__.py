"""`stethoscope serve`, the one long-running controller: the stream's collector, the sweeps, the
diagnosis cycle and the board, and an HTTP endpoint on loopback (docs/design.md "Telemetry")."""

from stethoscope.serve.server import CycleState, Server

__all__ = ["CycleState", "Server"]
