# Copyright: stethoscope developers
# Apache License 2.0
"""Runs a benchmark tool through the module's Context and parses it, failures named by the tool."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError


def run_and_parse(ctx, argv, parser, label=None, env=None):
    """(parsed, stdout): a timeout or a parse error is a CollectorError; the exit code is returned in
    parsed["rc"] for the caller to judge (nccl-tests and perftest print their failures)."""
    rc, out, err = ctx.run(argv, env)
    name = label or argv[0]
    if rc == 124:
        raise CollectorError("%s: timed out after %ss" % (name, ctx.timeout), argv, rc, out, err)
    if rc == 127:
        raise CollectorError("%s: command not found" % name, argv, rc, out, err)
    try:
        parsed = parser(out + ("\n" + err if err else ""))
    except ParseError as exc:
        raise CollectorError(str(exc), argv, rc, out, err) from None
    parsed["rc"] = rc
    return parsed, out
