"""The fault path through the topology (docs/design.md "Learned diagnosis")."""

from __future__ import annotations

from stethoscope.model.path import Place, fault_paths

SWITCHED = {f"node0{i}": Place("rack-1", "switch-b") for i in range(1, 5)} | {
    "node05": Place("rack-2", "switch-c"),
    "node06": Place("rack-2", "switch-c"),
}


def test_four_nodes_behind_one_switch_degrading_together_give_a_path_through_that_switch() -> None:
    scores = {"node01": 0.7, "node02": 0.95, "node03": 0.8, "node04": 0.6}
    paths = fault_paths(scores, SWITCHED)
    assert set(paths.values()) == {"node02 → switch-b → node03"}  # the two most anomalous, worst first
    assert set(paths) == set(scores)


def test_one_node_alone_gives_that_node() -> None:
    assert fault_paths({"node05": 0.9}, SWITCHED) == {"node05": "node05"}


def test_nodes_behind_different_switches_are_each_alone() -> None:
    assert fault_paths({"node01": 0.9, "node05": 0.8}, SWITCHED) == {"node01": "node01", "node05": "node05"}


def test_without_a_switch_the_rack_is_the_path() -> None:
    racked = {"a": Place("rack-7"), "b": Place("rack-7"), "c": Place()}
    assert fault_paths({"a": 0.6, "b": 0.6, "c": 0.9}, racked) == {
        "a": "a → rack-7 → b",
        "b": "a → rack-7 → b",
        "c": "c",
    }


def test_a_node_missing_from_the_topology_is_its_own_path() -> None:
    assert fault_paths({"ghost": 0.9, "node01": 0.9}, SWITCHED) == {"ghost": "ghost", "node01": "node01"}
