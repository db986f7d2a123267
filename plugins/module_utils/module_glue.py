# Copyright: stethoscope developers
# Apache License 2.0
"""Adapts AnsibleModule to collectors: argv-only commands with a time limit, C locale, one result shape."""

from __future__ import annotations

import os

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collector_failure
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bounded_run import run_bounded
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    Context,
)

COMMON_ARGUMENT_SPEC = {
    "root": {"type": "path", "default": "/"},
    "state_dir": {"type": "path", "default": "/var/lib/stethoscope"},
    "timeout": {"type": "int", "default": 30},
}
C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C", "LANG": "C"}


def argument_spec(**extra):
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(extra)
    return spec


def make_context(module):
    def which(name):
        return module.get_bin_path(name)

    def runner(argv, timeout, env=None):
        path = module.get_bin_path(argv[0])
        if path is None:
            return 127, "", "%s: command not found" % argv[0]
        # not module.run_command under timeout(1): bounded_run says why
        environ = dict(os.environ, **C_LOCALE)
        environ.update(env or {})
        return run_bounded([path, *list(argv[1:])], timeout, environ)

    params = module.params
    return Context(
        runner,
        which,
        root=params["root"],
        state_dir=params["state_dir"],
        check_mode=module.check_mode,
        timeout=params["timeout"],
    )


# Every failure series a collector has had, per collector: each later sweep sends them again, at 0
# while it answers, so a cleared series never falls silent (UNKNOWN) after a repair; a day and an hour
# after it cleared (UNKNOWN looks back 24 h) it is forgotten, so that the state stays small.
FAILURE_STATE = "collector_failures"
FORGET_CLEARED_AFTER = 25 * 3600


def run_collectors(module, collectors):
    """collectors: [(name, callable(ctx, previous_results) -> result dict)]. Each runs even if another
    failed. A failure (a CollectorError, or a result's `failures` beside the rows it could still
    read) is stored like any reading: `collector_failed` rows and a fact with the tool's first line;
    the series are 0 from when the collector answers again. The module fails afterwards, naming every
    collector that could not answer, and still returns every row. A result may give its whole `fact`
    (beside `present`, instead of `facts`) and `returns`, values returned beside the facts."""
    ctx = make_context(module)
    previous = ctx.load_state(FAILURE_STATE)
    known = dict(previous)
    facts, metrics, failures, done, returns = {}, [], [], {}, {}
    for name, collect in collectors:
        try:
            outcome = collect(ctx, done)
        except CollectorError as exc:
            outcome = {"present": None, "facts": {}, "metrics": [], "warnings": []}
            outcome["failures"] = [collector_failure.from_error(name, exc)]
        items = outcome.get("failures") or []
        fact = {"present": outcome["present"]}
        fact.update(outcome.get("fact") or {})
        fact.update(outcome.get("facts") or {})
        returns.update(outcome.get("returns") or {})
        metrics.extend(outcome["metrics"])
        rows = [row for item in items for row in collector_failure.failure_rows(item)]
        missed = _still_missed(previous.get(name, []), rows, ctx.now())
        metrics.extend(rows + collector_failure.cleared(missed))
        if missed or rows:
            known[name] = missed + rows
        else:
            known.pop(name, None)
        if items:
            failures.extend(items)
            fact["failures"] = [collector_failure.fact(item) for item in items]
        else:
            done[name] = outcome
        facts["stethoscope_%s" % name] = fact
        for warning in outcome["warnings"]:
            module.warn("%s: %s" % (name, warning))
    if known != previous:
        ctx.save_state(FAILURE_STATE, known)
    if failures:
        first = failures[0]
        module.fail_json(
            msg="; ".join(item["msg"] for item in failures),
            failed_collectors=_unique(item["collector"] for item in failures),
            cmd=first["cmd"],
            rc=first["rc"],
            stdout=first["stdout"],
            stderr=first["stderr"],
            ansible_facts=facts,
            stethoscope_metrics=metrics,
            **returns,
        )
    module.exit_json(changed=False, ansible_facts=facts, stethoscope_metrics=metrics, **returns)


def _still_missed(before, now, at):
    """The known failure series that this sweep does not repeat, each with when it cleared, less those
    cleared FORGET_CLEARED_AFTER ago."""
    repeated = {_series(row) for row in now}
    kept = []
    for row in before:
        if _series(row) in repeated:
            continue
        cleared_at = row.get("cleared_at", at)
        if at - cleared_at < FORGET_CLEARED_AFTER:
            kept.append(dict(row, cleared_at=cleared_at))
    return kept


def _unique(names):
    seen = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen


def _series(row):
    return row["name"], row["device"], tuple(sorted(row["labels"].items()))


BENCH_ARGUMENT_SPEC = {
    "repetitions": {"type": "int", "default": 3},
    "max_rsd_percent": {"type": "float", "default": 3.0},
    "fingerprint": {"type": "dict", "default": {}},
}


def run_bench(module, suite, describe, tool=None):
    """suite(ctx) -> (stethoscope_bench, metric rows, stability, extra). Benchmarks change nothing
    on the node, but they do run: in check mode only `describe` is returned. A suite whose `tool` is
    not installed is skipped with the reason (the other suites of the play still run)."""
    if tool and not module.get_bin_path(tool):
        module.exit_json(
            changed=False,
            skipped=True,
            present=False,
            msg="%s is not installed on this node (not on PATH): suite skipped" % tool,
        )
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: would run %s" % describe)
    ctx = make_context(module)
    try:
        bench, rows, stability, extra = suite(ctx)
    except CollectorError as exc:
        module.fail_json(msg=exc.msg, cmd=exc.cmd, rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    unstable = [s for s in stability if s["unstable"]]
    for item in unstable:
        module.warn(
            "%s %s %s: repetitions spread %.2f %% (> %s %%): stored and flagged unstable"
            % (
                item["metric_name"],
                item["device"],
                item["labels"],
                item["rsd_percent"],
                module.params["max_rsd_percent"],
            )
        )
    module.exit_json(
        changed=False, stethoscope_bench=bench, stethoscope_metrics=rows, stability=stability, **extra
    )
