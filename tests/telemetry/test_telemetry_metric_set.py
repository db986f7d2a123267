"""rules/telemetry.yml: every slot a catalog name at its unit, a node part of 20, errors that name the
file, set and slot; and the JSON the nodes get is the set as the YAML holds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stethoscope.telemetry import wire
from stethoscope.telemetry.metric_set import MetricSetError, default_path, load_sets, render_json


def test_shipped_sets_name_catalog_metrics_with_a_node_part_of_twenty() -> None:
    sets = load_sets()
    assert sets and all(len(s.parts["node"]) == wire.MAX_VALUES for s in sets.values())
    assert len({s.id for s in sets.values()}) == len(sets)


def test_json_for_the_nodes_is_the_set_as_the_yaml_holds_it() -> None:
    """The push_agent role renders the JSON from the YAML itself (from_yaml | to_json)."""
    raw = {entry["name"]: entry for entry in yaml.safe_load(default_path().read_text())["sets"]}
    for name, metric_set in load_sets().items():
        assert json.loads(render_json(metric_set)) == json.loads(json.dumps(raw[name]))


def _write(tmp_path: Path, slot: str, part: str = "node") -> Path:
    path = tmp_path / "telemetry.yml"
    agg = ", agg: max" if part == "node" else ""
    path.write_text(
        "---\nsets:\n  - name: t\n    id: 3\n    version: 1\n    period: 5\n    parts:\n"
        "      node:\n"
        "        - {metric: gpu_temperature_celsius, read: gpu.temperature, unit: celsius, agg: max}\n"
        f"      {part}:\n        - {{{slot}{agg}}}\n"
    )
    return path


@pytest.mark.parametrize(
    ("slot", "message"),
    [
        ("metric: gpu_made_up_celsius, read: gpu.temperature, unit: celsius", "not in the catalog"),
        ("metric: gpu_temperature_celsius, read: gpu.temperature, unit: mhz", "the catalog says 'celsius'"),
        ("metric: ib_port_xmit_wait_total, read: ib.xmit_wait, unit: count", "send its rate"),
    ],
)
def test_a_slot_the_catalog_does_not_back_is_refused_naming_set_part_and_slot(
    tmp_path, slot, message
) -> None:
    with pytest.raises(MetricSetError, match=message) as error:
        load_sets(_write(tmp_path, slot, part="gpu"))
    assert "set t: part gpu slot 0" in str(error.value)


def test_two_sets_sharing_an_id_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "metric: gpu_power_watts, read: gpu.power, unit: watts", part="gpu")
    text = path.read_text()
    path.write_text(text + text.split("sets:\n", 1)[1].replace("name: t", "name: u"))
    with pytest.raises(MetricSetError, match="share id 3"):
        load_sets(path)
