"""The executor runs each action type through its handler in one registry: every type a rule may name
has one, and nothing else does (a type added to the rule loader without a handler, or a handler no
rule can reach, fails here)."""

from __future__ import annotations

import pytest

from stethoscope.diagnosis.rules import ACTION_FIELDS
from stethoscope.remediation.actions.registry import HANDLERS, handler


def test_every_action_type_a_rule_may_name_has_a_handler_and_no_other():
    assert set(HANDLERS) == set(ACTION_FIELDS)
    assert all(handler(kind) is HANDLERS[kind] for kind in ACTION_FIELDS)


def test_an_unknown_type_is_named_with_the_known_ones():
    with pytest.raises(
        KeyError, match=r"no handler for action type 'page' \(known: log, alert, api_call, playbook\)"
    ):
        handler("page")
