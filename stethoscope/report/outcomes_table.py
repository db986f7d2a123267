"""The terminal table of `stethoscope outcomes`: per ISO week and layer the medians (and 90th
percentiles) in minutes, the counts, the seed's figures beside them and, in a footer, what the numbers
mean."""

from __future__ import annotations

from stethoscope.report.outcomes import DEFINITION, REFERENCE, OutcomeRow, Outcomes, Spread
from stethoscope.terminal import terminal_safe
from stethoscope.timeutil import iso

EMPTY = "no incidents in the window"
HEAD = (
    f"{'WEEK':<9} {'LAYER':<14} {'INCIDENTS':>9}  {'MTTD min':<18} {'ISOLATION min':<18} "
    f"{'TICKET min':<18} {'L4 TICKET min':<18} {'REPAIRS':>7} {'RESUMED-UNREPAIRED':>18} "
    f"{'NEEDS-PERSON':>12} {'REFUSED':>7}"
)


def _spread(spread: Spread) -> str:
    """'12.0 / 20.5 (3)': median / p90 (incidents measured); '-' for none."""
    if spread.median is None or spread.p90 is None:
        return "-"
    return f"{spread.median:.1f} / {spread.p90:.1f} ({spread.n})"


def _line(row: OutcomeRow) -> str:
    return (
        f"{row.week:<9} {row.layer:<14} {row.incidents:>9}  {_spread(row.mttd):<18} "
        f"{_spread(row.isolation):<18} {_spread(row.ticket):<18} {_spread(row.l4_ticket):<18} "
        f"{row.repairs:>7} "
        f"{row.resumed_without_repair:>18} {row.needs_person:>12} {row.refused_by_breaker:>7}"
    )


def render(result: Outcomes) -> str:
    window = f"incidents begun {iso(result.since_ms)} .. {iso(result.until_ms)}"
    if not result.rows:
        return f"{EMPTY} ({window})"
    lines = [HEAD]
    lines += [terminal_safe(_line(row)) for row in result.rows]
    seed = f"{REFERENCE['mttd_minutes']:.1f}"
    handling = f"{REFERENCE['l4_handling_minutes']:.1f}"
    # each seed figure under its like: the L4 handling beside the L4 incidents' ticket times alone
    lines.append(f"{'seed':<9} {'reference':<14} {'':>9}  {seed:<18} {'':<18} {'':<18} {handling}")
    lines += [
        "",
        window,
        "minutes: median / 90th percentile (incidents measured); isolation and ticket from the finding "
        "to the drain's and the ticket's ok; L4 ticket: the ticket of L4 incidents alone",
        DEFINITION,
        f"seed reference: MTTD {REFERENCE['mttd_minutes']:.0f} min, L4 handling (finding to ticket) "
        f"{REFERENCE['l4_handling_minutes']:.0f} min",
    ]
    return "\n".join(lines)
