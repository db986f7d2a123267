"""A template's rendering is bounded in time, memory and output, whatever it asks for, and a template
that fails costs itself only: the renderer after it answers the next one as before. Each hostile
template here escaped checks made inside the sandbox (a power of powers ran 21 s, a namespace that
doubles a string took 1.5 GB), and a counter above 100,000 must still render."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from stethoscope.templating import TemplateFailure, Undefined, render

from conftest import TOP

HOSTILE = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "a power of powers": "{{ ((((10**64)**64)**64)**64) > 1 }}",
    "a string of a gigabyte": "{{ 'x' * 10**9 }}",
    "a namespace doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    ),
    "a joined list of 10 GB": "{{ (['x' * 100000] * 100000) | join | length }}",
    "a format width": "{{ '%050000000d' % 1 }}",
    "an output of megabytes": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "an infinite int": "{{ value | int }}",
    "a division by zero": "{{ 1 / (value - value) }}",
}


def kib_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_fails_alone_within_its_bounds(name):
    before = kib_rss()
    started = time.monotonic()
    with pytest.raises(TemplateFailure) as failure:
        render(HOSTILE[name], {"value": float("inf") if "int" in name else 3.0})
    assert time.monotonic() - started < 5, failure.value
    assert kib_rss() - before < 50 * 1024  # this process never held what the template asked for
    assert not isinstance(failure.value, Undefined)
    # the next rendering is answered as before
    assert render("{{ node_id }} {{ value }}", {"node_id": "node07", "value": 184.0}) == "node07 184.0"


def test_a_large_counter_still_renders():
    context = {"value": 250_000.0, "node_id": "node07"}
    assert render("{{ '%d errors' | format(value | int) }}", context) == "250000 errors"
    assert render("{{ '{:,}'.format(value | int) }}", context) == "250,000"
    assert render("{{ (value | int) | tojson }}", context) == "250000"


def test_an_undefined_name_is_told_apart():
    with pytest.raises(Undefined, match="switch_api"):
        render("{{ vars.switch_api }}/v1", {"vars": {}})


def test_renders_from_many_threads_each_get_their_own_answer():
    def one(index: int) -> str:
        return render("{{ node_id }}:{{ value | int }}", {"node_id": f"node{index:02d}", "value": index})

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(64)))
    assert answers == [f"node{i:02d}:{i}" for i in range(64)]


def test_a_process_with_more_than_1024_descriptors_still_renders(tmp_path):
    """Regression: the renderer waited on its worker with select(), which refuses a descriptor past
    1024: serve holds the store's files open, and a long test suite did hit it."""
    code = (
        "import os, resource; from stethoscope.templating import render; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard)); "
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]; "
        "print(max(held) > 1024, render('{{ node_id }}', {'node_id': 'node07'}))"
    )
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200:
        pytest.skip("this machine's hard limit on open files is under 1,200")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=TOP)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["True", "node07"]
