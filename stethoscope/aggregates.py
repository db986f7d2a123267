"""The aggregates a rule condition may apply over its window: one registry that the rule loader
(which names it accepts), the catalog (which apply to which metric kind, and the default), the
compiler (the SQL of each) and the outcome report (which a single sample can show) all read. A new
aggregate is one entry here; `aggregate: any` and the increases (delta, rate) are compiled by their
own code in diagnosis/engine.py (`any_sample`, `increase`), the others by their `sql` over the
window's (value, timestamp) rows."""

from __future__ import annotations

from dataclasses import dataclass

GAUGE, COUNTER, EVENTS = "gauge", "counter", "events"
CUMULATIVE = (COUNTER, EVENTS)
_STEPS = "arrayPopBack({s}), arrayPopFront({s})".format(
    s="arrayMap(t -> t.2, arraySort(groupArray((timestamp, value))))"
)
_FIRST, _LAST = "argMin(value, timestamp)", "argMax(value, timestamp)"


@dataclass(frozen=True)
class Aggregate:
    name: str
    kinds: tuple[str, ...]  # the metric kinds it applies to
    sql: str = ""  # over the window's rows (value, timestamp); "" where engine.py compiles it itself
    increase: bool = False  # a counter's increase over the window, resets counted (engine.increase)
    sample_evidence: bool = False  # one sample past the threshold shows it (outcomes: first evidence)


REGISTRY: dict[str, Aggregate] = {
    a.name: a
    for a in (
        Aggregate("avg", (GAUGE,), "avg(value)", sample_evidence=True),
        Aggregate("max", (GAUGE,), "max(value)", sample_evidence=True),
        Aggregate("min", (GAUGE,), "min(value)", sample_evidence=True),
        Aggregate("last", (GAUGE, *CUMULATIVE), _LAST, sample_evidence=True),
        Aggregate("p99", (GAUGE,), "quantile(0.99)(value)", sample_evidence=True),
        Aggregate("delta", CUMULATIVE, increase=True),
        Aggregate("rate", CUMULATIVE, increase=True),
        Aggregate("stddev", (GAUGE,), "stddevSamp(value)"),
        Aggregate("cv", (GAUGE,), "if(avg(value) = 0, 0, stddevSamp(value) / abs(avg(value)))"),
        # units per hour, least squares over the window; hours before the instant, not since the
        # epoch: at ~5e5 epoch hours the regression's sums cancel and a 2-minute slope's sign is noise
        Aggregate(
            "slope",
            (GAUGE, *CUMULATIVE),
            "if(count() < 2, 0, tupleElement(simpleLinearRegression("
            "toFloat64(toUnixTimestamp64Milli(timestamp) - {at:Int64}) / 3600000, value), 1))",
        ),
        Aggregate(
            "rising_fraction",
            (GAUGE,),
            f"if(count() < 2, 0, arrayCount((a, b) -> b > a, {_STEPS}) / (count() - 1))",
        ),
        # relative to max(first, 1): counters that start at 0 grow by their new value in percent
        Aggregate("growth_percent", CUMULATIVE, f"({_LAST} - {_FIRST}) / greatest(abs({_FIRST}), 1) * 100"),
        Aggregate("any", (GAUGE,), sample_evidence=True),  # each sample compared (engine.any_sample)
    )
}
NAMES = tuple(REGISTRY)
DEFAULTS = {GAUGE: "avg", COUNTER: "delta", EVENTS: "delta"}
INCREASES = tuple(name for name, a in REGISTRY.items() if a.increase)


def for_kind(kind: str) -> tuple[str, ...]:
    """The aggregates a metric of `kind` allows, its default first."""
    default = DEFAULTS[kind]
    return (default, *(name for name, a in REGISTRY.items() if kind in a.kinds and name != default))
