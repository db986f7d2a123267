"""benchmarks/results holds what benchmark runs measured, each file written whole by one run with
that run's stamp (benchmarks/provenance.py), and the figures README and docs/ quote are the ones in
those files.

- every benchmark script writes its results through provenance.write_results (none writes a results
  file itself, none merges into an earlier file);
- every results file carries the stamp, or is listed in benchmarks/results/UNSTAMPED.md with why it
  was not rerun and the command that rewrites it;
- every figure README or a docs/ page quotes from a results file (QUOTES below) matches the file, as
  rounded there; every results file they name has its figures listed here.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
BENCHMARKS = TOP / "benchmarks"
RESULTS = BENCHMARKS / "results"
UNSTAMPED = RESULTS / "UNSTAMPED.md"
_SPEC = importlib.util.spec_from_file_location("provenance", BENCHMARKS / "provenance.py")
assert _SPEC is not None and _SPEC.loader is not None
provenance = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(provenance)
STAMP_KEYS = provenance.STAMP_KEYS

# calls that write a file: `path.write_text(...)`, `json.dump(obj, handle)`, `open(path, "w")`
WRITERS = {"write_text", "write_bytes", "dump"}
# what a write's target names when it is a results file: the --out/--json argument, a RESULT
# constant, the results folder, gpu_device_check's OUTDIR
RESULT_TARGET = re.compile(r"\bargs\.(out|json)\b|\bRESULTS?\b|results|\bout\b")


def _scripts() -> list[Path]:
    return sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "provenance.py")


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, target) of every call in `tree` that writes a file, the target as source text."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in WRITERS:
            # json.dump(obj, handle): the handle is the target
            dumped = node.args[1] if len(node.args) > 1 else func
            target = dumped if func.attr == "dump" else func.value
            found.append((node.lineno, ast.unparse(target)))
        elif isinstance(func, ast.Name) and func.id == "open" and node.args:
            mode = node.args[1] if len(node.args) > 1 else None
            if isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+"):
                found.append((node.lineno, ast.unparse(node.args[0])))
        elif isinstance(func, ast.Attribute) and func.attr == "open":
            mode = node.args[0] if node.args else None
            if isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+"):
                found.append((node.lineno, ast.unparse(func.value)))
    return found


def _results_writes(source: str) -> list[str]:
    """The writes in `source` that go to a results file other than through write_results."""
    return [
        f"line {line}: {target}"
        for line, target in _writes(ast.parse(source))
        if RESULT_TARGET.search(target)
    ]


def _calls(source: str, name: str) -> int:
    tree = ast.parse(source)
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    )


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.name)
def test_a_benchmark_writes_its_results_through_write_results(script):
    source = script.read_text(encoding="utf-8")
    assert not _results_writes(source), (
        f"{script.name} writes a results file itself: {_results_writes(source)}; "
        "use provenance.write_results (the whole file, stamped, atomically)"
    )
    writes_results = re.search(r"""["']--(out|json)["']|benchmarks/results|["']results["']|RESULT""", source)
    if writes_results:
        assert _calls(source, "write_results"), f"{script.name} writes results without write_results"
        assert "from provenance import" in source and "write_results" in source


def test_the_static_check_flags_a_script_writing_or_merging_a_results_file_itself():
    """What the check above is for: the scripts as they were (a results file written by hand-rolled
    json, model_train.py merging its figures into the file an earlier run left)."""
    before = (
        "kept = json.loads(args.json.read_text()) if args.json.is_file() else {}\n"
        'args.json.write_text(json.dumps(kept | {"finetune": figures}, indent=2) + "\\n")\n'
        '(TOP / "benchmarks/results/audit_lab.json").write_text(json.dumps(result))\n'
        'with open(args.out, "w") as f:\n    json.dump(result, f)\n'
    )
    assert len(_results_writes(before)) == 3
    scratch = '(work / "agent.json").write_text(json.dumps(config))\nmeta.write_text("{}")\n'
    assert not _results_writes(scratch)


def test_write_results_writes_the_whole_file_stamped(tmp_path):
    target = tmp_path / "r.json"
    target.write_text('{"old": 1}\n')
    provenance.write_results(target, {"figure": 1.5})
    doc = json.loads(target.read_text())
    assert list(doc)[: len(STAMP_KEYS)] == list(STAMP_KEYS) and doc["figure"] == 1.5
    assert "old" not in doc  # nothing kept from the file before
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left
    with pytest.raises(ValueError, match="stamp's keys"):
        provenance.write_results(target, {"commit": "mine"})


# -- every results file is stamped, or listed with its reason and command --------------------------


def _results_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*.json"))


def _unstamped() -> dict[str, str]:
    """benchmarks/results/UNSTAMPED.md: a `- `path` ...` bullet per file (relative to results/), the
    rest of its entry (up to the next bullet) its reason and the command that rewrites it."""
    entries: dict[str, str] = {}
    current = None
    for line in UNSTAMPED.read_text(encoding="utf-8").splitlines():
        match = re.match(r"- `([^`]+\.json)`(.*)", line)
        if match:
            current = match.group(1)
            entries[current] = match.group(2)
        elif current and line.startswith("  "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def _stamped(path: Path) -> bool:
    doc = json.loads(path.read_text(encoding="utf-8"))
    return isinstance(doc, dict) and all(doc.get(key) not in (None, "") for key in STAMP_KEYS)


@pytest.mark.parametrize("path", _results_files(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_results_file_is_stamped_or_listed_as_unstamped(path):
    name = str(path.relative_to(RESULTS))
    listed = _unstamped()
    if _stamped(path):
        assert name not in listed, f"{name} is stamped now: take it off UNSTAMPED.md"
        return
    assert name in listed, f"{name} carries no stamp (commit, at, command, ...) and UNSTAMPED.md omits it"
    entry = listed[name]
    assert re.search(r"benchmarks/\w+\.py", entry), f"{name}: UNSTAMPED.md gives no command to rewrite it"
    reason = re.match(r"\s*not rerun:\s*(.*?)\s*`", entry)
    assert reason and len(reason.group(1).split()) >= 4, f"{name}: UNSTAMPED.md gives no reason"


def test_unstamped_lists_only_files_that_exist():
    missing = [name for name in _unstamped() if not (RESULTS / name).is_file()]
    assert not missing


def test_the_stamp_check_flags_a_file_without_its_run(tmp_path):
    """A file as the hand-edited comparison and the merged model_train.json were: figures, no stamp."""
    unstamped, stamped = tmp_path / "unstamped.json", tmp_path / "stamped.json"
    unstamped.write_text('{"findings": 8, "speedup": 1.94, "machine": "2 shared cores"}')
    stamped.write_text(json.dumps({**dict.fromkeys(STAMP_KEYS, "x"), "speedup": 1.94}))
    assert not _stamped(unstamped) and _stamped(stamped)


# -- README's figures are the results files' ------------------------------------------------------

# (results file, path to the figures in it, README text quoting them in that order). A path element
# that is a dict selects the first list entry holding those items. Each number in the text is one
# figure, compared as README rounds it (a percentage's figure is the file's percent).
FRESH = "model_fresh_families.json"
JOB_FAULTS = ("straggler", "input_stall", "switch_congestion")
HISTORY = "model_fresh_history.json"


def _scoring_of_set(number: int) -> list[tuple]:
    """A fresh set's earlier scoring: macro-F1, healthy false findings, each class's fault precision."""
    entry = ("scorings", {"fresh_set": number})
    return [
        (*entry, "macro_f1"),
        (*entry, "healthy_false_findings_percent"),
        *((*entry, "per_class_precision", cls) for cls in ("communication", "storage", "compute")),
    ]


# serve_relay_reads.py's p95 per read command, in the order the docs quote them
READS = ("summary", "incidents", "actions", "top", "diagnose")
READS_P95 = [("beside_serve", read, "p95_seconds") for read in READS]
QUOTES: list[tuple[str, list[tuple], str]] = [
    *(
        (HISTORY, [("scorings", {"fresh_set": n}, key) for key in keys], text)
        for n, keys, text in [
            (1, ["macro_f1", "healthy_false_findings_percent"], "0.633 / 86 %"),
            (2, ["macro_f1", "healthy_false_findings_percent"], "0.756 / 65 %"),
            (3, ["macro_f1", "healthy_false_findings_percent"], "0.730 / 32 %"),
            (4, ["macro_f1", "healthy_false_findings_percent"], "0.881 / 3.3 %"),
            (5, ["macro_f1", "healthy_false_findings_percent"], "0.675 / 18 %"),
            (6, ["macro_f1", "healthy_false_findings_percent"], "0.800 / 23 %"),
            (7, ["macro_f1", "healthy_false_findings_percent"], "0.889 / 21 %"),
            (8, ["macro_f1", "healthy_false_findings_percent"], "0.905 / 31 %"),
            (9, ["macro_f1", "healthy_false_findings_percent"], "0.830 / 16 %"),
            (10, ["macro_f1", "healthy_false_findings_percent"], "version 10 on set 10: 0.976 / 0.17 %"),
            (11, ["macro_f1", "healthy_false_findings_percent"], "that held: 0.881 / 7.7 %"),
        ]
    ),
    (
        HISTORY,
        _scoring_of_set(12),
        "Version 11 on set 12: 0.765 / 0.83 %, fault precision 0.833 (communication), 0.6525\n"
        "(storage), 1.000 (compute)",
    ),
    (
        HISTORY,
        _scoring_of_set(13),
        "Version 12 on set 13: 0.765 / 21.7 %, fault precision 0.636 (communication), 0.983 (storage),\n"
        "0.962 (compute)",
    ),
    (
        FRESH,
        [
            ("macro_f1",),
            ("healthy_false_findings_percent",),
            ("per_class", "communication", "precision"),
            ("per_class", "storage", "precision"),
            ("per_class", "compute", "precision"),
        ],
        "The shipped version 13 on set 14: **0.901 / 0 %**, fault precision 0.793 (communication), 0.983\n"
        "(storage), 0.981 (compute)",
    ),
    (
        "model_fresh_set10.json",
        [("macro_f1",), ("healthy_false_findings_percent",)],
        "version 10 on set 10: 0.976 / 0.17 %",
    ),
    (
        "model_fresh_set12_by_version10.json",
        [("macro_f1",), ("healthy_false_findings_percent",)],
        "(`benchmarks/results/model_fresh_set12_by_version10.json`): 0.780 / 0.50 %",
    ),
    (
        "model_fresh_set13_by_version11.json",
        [("macro_f1",), ("healthy_false_findings_percent",)],
        "(`benchmarks/results/model_fresh_set13_by_version11.json`): 0.728 /\n25.5 %",
    ),
    (
        "model_fresh_set14_by_version12.json",
        [
            ("macro_f1",),
            ("healthy_false_findings_percent",),
            ("per_class", "communication", "precision"),
            ("per_class", "storage", "precision"),
            ("per_class", "compute", "precision"),
        ],
        "(`benchmarks/results/model_fresh_set14_by_version12.json`): 0.845 / 0 %, precision 0.916 / 0.985 /"
        "\n0.963",
    ),
    *(
        (
            "model_jobs.json",
            [("fresh", "paths", path, kind, "culprit_recall") for path in ("graphs", "detector", "combined")],
            text,
        )
        for kind, text in [
            ("straggler", "| straggler: culprit rank found | 0.383 | 0.992 | 0.992 |"),
            ("input_stall", "| input stall: culprit rank found | 0.675 | 0.983 | 0.983 |"),
            ("switch_congestion", "| switch congestion: the switch named | 0.512 | 0.975 | 0.975 |"),
        ]
    ),
    (
        "model_jobs.json",
        [
            ("fresh", "paths", path, "peers_with_own_finding_percent")
            for path in ("graphs", "detector", "combined")
        ],
        "| peers of a faulty job with a finding of their own | 57.34 % | 0.00 % | 0.00 % |",
    ),
    (
        "model_jobs.json",
        [
            ("fresh", "paths", path, "healthy_jobs_with_finding_percent")
            for path in ("graphs", "detector", "combined")
        ],
        "| healthy jobs with any finding | 10.96 % | 0.98 % | 0.98 % |",
    ),
    (
        "model_jobs.json",
        [
            (
                "fresh",
                "paths",
                "combined",
                "families",
                f"fresh2.{family}",
                "healthy_jobs_with_finding_percent",
            )
            for family in ("healthy_input_heavy_multi_rank", "healthy_everything", "healthy_large_fleet")
        ],
        "node: 8.9 % of them get an input-stall culprit; 3.6 % of the jobs of the variant that mixes\n"
        "  pipeline stages, heavy input, a neighbour's traffic spells and restarts; 0.23 %",
    ),
    (
        "model_jobs.json",
        [
            ("fresh", "paths", "combined", "wrong_switch_findings"),
            ("development", "paths", "combined", "wrong_switch_findings"),
        ],
        "- 3 switch findings on a switch without congestion (as on jobs-1: 2)",
    ),
    (
        "model_jobs.json",
        [("fresh", "switch_lead", key) for key in ("named_before_impact", "scenes", "median_lead_s")],
        "in 49 of 80 scenes, median lead\n10 s",
    ),
    (
        "model_jobs.json",
        [
            ("development", "paths", "combined", "healthy_jobs_with_finding_percent"),
            *(("development", "paths", "combined", kind, "culprit_recall") for kind in JOB_FAULTS),
            *(("multi_rank", "paths", "combined", kind, "culprit_recall") for kind in JOB_FAULTS),
            ("multi_rank", "paths", "combined", "peers_with_own_finding_percent"),
            ("multi_rank", "paths", "combined", "healthy_jobs_with_finding_percent"),
        ],
        "0.35 % of its healthy jobs with a finding now, recall\nunchanged (1.000 / 0.912 / 0.988); the "
        "multi-rank families: 1.000 / 1.000 / 1.000, peers 0.09 %,\nhealthy jobs 0.26 %",
    ),
    (
        "model_jobs.json",
        [
            *(("validation", "paths", "combined", kind, "culprit_recall") for kind in JOB_FAULTS),
            ("validation", "paths", "combined", "peers_with_own_finding_percent"),
            ("validation", "paths", "combined", "healthy_jobs_with_finding_percent"),
        ],
        "0.983 / 1.000 / 1.000, peers 0.00 %, healthy jobs 0.07 %",
    ),
    (
        "model_inference.json",
        [
            ("nodes",),
            ("jobs",),
            ("median_seconds", "total_s"),
            ("median_seconds", "features_read_s"),
            ("median_seconds", "inference_s"),
            ("median_seconds", "job_relative_s"),
            ("first_run_seconds", "total_s"),
            ("load_average_at_start", 0),
        ],
        "`benchmarks/model_inference.py` (`benchmarks/results/model_inference.json`): 2,000 nodes in 250\n"
        "jobs of 8 (three fleets side by side with a straggler, an input stall and a congested switch, all\n"
        "three named and nothing else), read and judged as `diagnose` does: 1.47 s, the median of the warm\n"
        "runs (the read 0.94 s, the two graphs 0.34 s, the job-relative layer 0.16 s; the first, cold run\n"
        "3.5 s), load average 0.65",
    ),
    (
        "early_warning_lead.json",
        [("lead_minutes",)],
        "the `climbing_ssd` drive is warned about 44\n  minutes before it crosses",
    ),
    (
        "cadence_hysteresis.json",
        [
            ("sweep_interval_s",),
            ("jitter_s",),
            ("hours",),
            ("executing", "node08 ib_port_not_active"),
            ("instants",),
        ],
        "sweeps every 300 s ± 60 s, one of them lost, over 4 h:\n"
        "every state fault of the lab found at 49 of 49 instants",
    ),
    (
        "serve_lab64.json",
        [
            ("nodes",),
            ("sweep_interval_s",),
            ("minutes",),
            ("sweeps", "ok"),
            ("sweeps", "run"),
            ("sweep_seconds", 3),
            ("sweep_seconds", 1),
            ("cycles",),
            ("cycle_seconds", "p50"),
            ("cycle_seconds", "max"),
        ],
        "`serve` on the lab's 64 nodes with sweeps every 120 s for 10 minutes (`benchmarks/serve_lab64.py`,\n"
        "`benchmarks/results/serve_lab64.json`): 5 of 5 sweeps ran and were stored on every node, 33.0 to\n"
        "36.1 s each, never overlapping; its 10 diagnosis cycles took 1.65 s at the median and 11.84 s at\n"
        "most",
    ),
    (
        "model_train.json",
        [("train_s",)],
        "Training takes 343 s",
    ),
    (
        "model_train.json",
        [("test_macro_f1",), ("test_fault_precision", "communication")],
        "test macro-F1 0.996 (seed 2026's smaller test split, the fresh-set benchmark's control: 0.99),"
        "\nfault precision 1.000",
    ),
    (
        "model_finetune.json",
        [
            ("finetune", "new_before_accuracy"),
            ("finetune", "new_after_accuracy"),
            ("finetune", "old_before_accuracy"),
            ("finetune", "old_after_accuracy"),
        ],
        "accuracy 0.818 → 0.981, the old\nclasses 0.996 → 0.996",
    ),
    # docs/design.md's "Sizing beyond one machine"
    (
        "stream_scale.json",
        [("highest_rate_held_per_s",), ("runs", {"rate_target_per_s": 16000}, "seconds")],
        "One collector held 16,000 datagrams/s for 60 s",
    ),
    ("stream_scale.json", [("runs", {"rate_target_per_s": 16000}, "nodes")], "20,000 nodes' node\n  part"),
    (
        "stream_scale_gpu_parts.json",
        [
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "nodes"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "spooled_rows"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "sample_to_queryable", "commit", "p99_s"),
            (
                "runs",
                {"nodes": 2000, "diagnosis_beside": False},
                "sample_to_queryable",
                "write_seconds",
                "p50_s",
            ),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "process_cpu_percent_of_one_core"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "process_cpu_seconds_per_million_rows"),
        ],
        "stored every sample of 2,000 eight-GPU nodes, 0 rows spooled, at\n  p99 1.4 s from sample to "
        "queryable (writes 0.22 s at the median), the process at 84 % of one core\n  with its merges "
        "(14.1 CPU-s per million rows)",
    ),
    (
        "stream_scale_gpu_parts.json",
        [
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "diagnosis", "cycle_wall_s_median"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "spooled_rows"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "sample_to_queryable", "commit", "p99_s"),
        ],
        "4.7 s each at the median) still every sample and 0 spooled, p99 1.51 s",
    ),
    (
        "stream_scale_gpu_parts_26a5d4f.json",
        [
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "diagnosis", "cycle_wall_s_median"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "process_cpu_percent_of_one_core"),
        ],
        "1.55 s alone, 2.93 s\n  beside cycles of 7.0 s, 105 % of a core",
    ),
    (
        "stream_scale_gpu_parts_again.json",
        [
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "sample_to_queryable", "commit", "p99_s"),
        ],
        "1.42 s alone, 1.51 s beside",
    ),
    (
        "stream_scale_gpu_parts_any_labels.json",
        [
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "process_cpu_seconds_per_million_rows"),
        ],
        "p99 2.09 s alone, 12.3 s beside, 23.4 CPU-s per million rows",
    ),
    (
        "stream_scale_gpu_parts_metric_first.json",
        [
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "sample_to_queryable", "commit", "p99_s"),
            ("runs", {"nodes": 2000, "diagnosis_beside": True}, "diagnosis", "cycle_wall_s_median"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "process_cpu_percent_of_one_core"),
            ("runs", {"nodes": 2000, "diagnosis_beside": False}, "process_cpu_seconds_per_million_rows"),
        ],
        "p99 1.34 s alone, 1.39 s beside cycles of 2.6 s, 75 % of a core, 12.6 CPU-s per\n  million rows",
    ),
    (
        "store_latency.json",
        [("nodes",), ("latency_p99_s",)],
        "2,000 node-part-only nodes with\n  the diagnosis cycle beside it at p99 1.8 s",
    ),
    ("ingest.json", [("rows_per_second_median", "writer")], "525,173\n  rows/s through the writer"),
    (
        "diagnosis_cycle.json",
        [("results", 0, "cycle", "median_cpu_seconds"), ("results", 0, "nodes")],
        "diagnosis cycle: 3.5 CPU-seconds a cycle for 200 nodes",
    ),
    ("diagnosis_cycle.json", [("results", 0, "cycle", "median_seconds")], "2.0 s wall, median"),
    (
        "diagnosis_cycle.json",
        [("results", 0, "parts", "rules", "median_seconds"), ("budget_seconds", "rules")],
        "its\n  rules 1.2 s of their 3",
    ),
    (
        "diagnosis_cycle.json",
        [("results", 0, "parts", "rules_without_window_reads", "median_seconds")],
        "1.9 s with every rule read by its own query",
    ),
    (
        "diagnosis_cycle.json",
        [("results", 0, "parts", "rules_without_families", "median_seconds")],
        "and 2.5 s with no family either",
    ),
    (
        "diagnosis_cycle.json",
        [("results", 0, "rules"), ("results", 0, "parts", "rules", "queries")],
        "the 103 rules shipped, in 35 queries",
    ),
    (
        "diagnosis_cycle.json",
        [
            ("results", 0, "cycle_without_window_reads", "median_seconds"),
            ("results", 0, "cycle_without_window_reads", "median_cpu_seconds"),
        ],
        "alternating: 2.8 s wall and 4.9 CPU-seconds",
    ),
    (
        "diagnosis_cycle_node_first.json",
        [("results", 0, "cycle", "median_cpu_seconds"), ("results", 0, "cycle", "median_seconds")],
        "6.1 CPU-seconds and 3.6 s\n  wall",
    ),
    (
        "diagnosis_cycle_2000.json",
        [
            ("results", 0, "cycle", "median_seconds"),
            ("results", 0, "cycle", "median_cpu_seconds"),
            ("results", 0, "parts", "rules", "median_seconds"),
            ("results", 0, "parts", "unknown", "median_seconds"),
            ("results", 0, "parts", "model", "median_seconds"),
        ],
        "15.0 s wall and 27.2\n  CPU-seconds, its rules 8.2 s, UNKNOWN 3.3 s, the model 1.8 s",
    ),
    (
        "diagnosis_cycle_2000.json",
        [
            ("results", 0, "cycle_without_window_reads", "median_seconds"),
            ("results", 0, "cycle_without_window_reads", "median_cpu_seconds"),
            ("results", 0, "parts", "rules_without_window_reads", "median_seconds"),
        ],
        "13.8 s and 25.0 CPU-seconds with\n  every rule read by its own query or its family's, its rules"
        " 7.5 s",
    ),
    (
        "diagnosis_cycle_2000_node_first.json",
        [
            ("results", 0, "cycle", "median_seconds"),
            ("results", 0, "cycle", "median_cpu_seconds"),
            ("results", 0, "parts", "rules", "median_seconds"),
        ],
        "31.7 s\n  wall and 59.0 CPU-seconds, its rules 16.0 s",
    ),
    (
        "diagnosis_cycle_inventory.json",
        [("results", 0, "parts", "rules_for_an_inventory", "median_seconds"), ("results", 0, "nodes")],
        "its rules 1.9 s at 200 nodes",
    ),
    (
        "diagnosis_cycle_2000_inventory.json",
        [("results", 0, "parts", "rules_for_an_inventory", "median_seconds"), ("results", 0, "nodes")],
        "8.8 s at 2,000",
    ),
    (
        "diagnosis_cycle_inventory.json",
        [("results", 0, "parts", "rules", "median_seconds")],
        "against\n  1.8 s and",
    ),
    (
        "diagnosis_cycle_2000_inventory.json",
        [("results", 0, "parts", "rules", "median_seconds")],
        "and 6.9 s without one in the same runs",
    ),
    (
        "board_scale.json",
        [("render_s",), ("nodes",), ("days",)],
        "(3.7 s for\n  2,000 nodes x 7 days, board_scale.json,",
    ),
    ("board_scale.json", [("collect_s",)], "2.2 s against"),
    ("board_scale_before_window_reads.json", [("render_s",)], "as 3.9 s run just before it"),
    ("board_scale_before_window_reads.json", [("collect_s",)], "against 2.9, the pages' writing the\n  rest"),
    ("board_scale_node_first.json", [("render_s",)], "sorted node first, 4.0 s, board_scale_node_first.json"),
    ("board_scale_metric_first.json", [("render_s",)], "beside\n  3.8 s metric first"),
    (
        "diagnosis_cycle_metric_first.json",
        [("results", 0, "cycle", "median_cpu_seconds"), ("results", 0, "cycle", "median_seconds")],
        "diagnosis_cycle_metric_first.json: 4.5 CPU-seconds and 2.6 s wall",
    ),
    (
        "diagnosis_cycle.json",
        [
            ("results", 0, "parts", "rules", "queries"),
            ("results", 0, "parts", "rules_without_window_reads", "queries"),
        ],
        "take 35 queries a cycle so, against 79",
    ),
    (
        "collect_vs_ping_64.json",
        [("seconds_median", "ping"), ("seconds_median", "collect"), ("collect_vs_ping",)],
        "ping 16.4 s, collect.yml 33.8 s (2.06x)",
    ),
    (
        "collect_vs_ping_64.json",
        [("seconds_median", "reference"), ("reference_vs_ping",)],
        "`git show 57fed94:playbooks/collect.yml`: a fingerprint task, then the `health_collect` role)\n"
        "  58.6 s (3.57x)",
    ),
    (
        "collect_vs_ping_64_quiet.json",
        [("seconds_median", "ping"), ("seconds_median", "collect"), ("collect_vs_ping",)],
        "ping\n  10.1 s, collect.yml 19.0 s (1.89x)",
    ),
    (
        "collect_vs_ping_64_before_checks_once.json",
        [("seconds_median", "ping"), ("seconds_median", "collect"), ("collect_vs_ping",)],
        "ping 9.37 s, collect.yml\n  18.11 s (1.93x)",
    ),
    (
        "collect_vs_ping_64_bounded_run.json",
        [
            ("seconds_median", "ping"),
            ("seconds_median", "collect"),
            ("collect_vs_ping",),
            ("seconds_median", "reference"),
            ("reference_vs_ping",),
            ("cpu_seconds_median", "collect"),
            ("cpu_seconds_median", "reference"),
            ("cpu_seconds_median", "ping"),
        ],
        "ping 9.96 s,\n  collect.yml 16.57 s (1.66x) against 17.3 s (1.74x), its processes' CPU 29.8 s "
        "against 31.48 s\n  (ping 19.21 s)",
    ),
    (
        "collect_vs_ping_64_checks_once.json",
        [("seconds_median", "ping"), ("seconds_median", "collect"), ("collect_vs_ping",)],
        "ping 9.24 s,\n  collect.yml 15.83 s (1.71x)",
    ),
    (
        "serve_relay_reads_nice10.json",
        [("beside_serve", "summary", "p95_seconds"), ("beside_serve", "incidents", "p95_seconds")],
        "summary 2.79 s, incidents 1.79 s",
    ),
    (
        "serve_relay_reads_nice19.json",
        READS_P95,
        "summary 3.46 s, incidents 1.09 s, actions 0.80 s, top 1.11 s,\n  diagnose 2.93 s",
    ),
    (
        "serve_relay_reads.json",
        READS_P95,
        "summary 0.30 s, incidents 0.43 s, actions 0.30 s, top 0.42 s, diagnose\n  0.26 s",
    ),
    (
        "serve_relay_reads_spares.json",
        READS_P95,
        "summary 3.17 s,\n  incidents 4.26 s, actions 1.61 s, top 2.43 s, diagnose 1.22 s",
    ),
    (
        "serve_relay_reads_inject.json",
        [("fault_injected", "seconds_to_drain"), ("fault_injected", "seconds_to_ticket")],
        "drained in 78.9 s and\n  ticketed in 89.9 s",
    ),
    (
        "serve_relay_reads_digest.json",
        READS_P95,
        "summary 2.01 s, incidents 2.78 s, actions 2.26 s, top 2.69 s,\n  diagnose 1.10 s",
    ),
    (
        "summary_scale.json",
        [("hourly_rollup_as_summary_reads", "median_cpu_seconds"), ("raw_final", "median_cpu_seconds")],
        "0.006 CPU-s against 0.57, summary_scale.json",
    ),
    (
        "collect_vs_ping_512.json",
        [("seconds_median", "ping"), ("seconds_median", "collect"), ("collect_vs_ping",)],
        "ping 101.7 s, collect.yml 209.0 s (2.05x)",
    ),
    (
        "crash_recovery.json",
        [("max_seconds_to_completion",)],
        "at most 19.4 s after its start",
    ),
    (
        "collect_vs_ping_256.json",
        [("seconds_median", "ping"), ("seconds_median", "collect"), ("collect_vs_ping",)],
        "ping 73.1 s,\n  collect.yml 124.7 s (1.71x)",
    ),
]

NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
# numbers inside a quote that are not figures of the file (prose around them)
PROSE = re.compile(
    r"`[^`]*`|version \d+ on set \d+:|Version \d+ on set \d+:|set \d+:|jobs\s+of 8|"
    r"three fleets|jobs\s+of\s+8|\(seed[^)]*\)|jobs-\d"
)


def _select(doc, path: tuple):
    value = doc
    for step in path:
        if isinstance(step, dict):
            value = next(e for e in value if all(e.get(k) == v for k, v in step.items()))
        else:
            value = value[step]
    return value


def _figures(text: str) -> list[str]:
    return NUMBER.findall(PROSE.sub(" ", text))


def _matches(quoted: str, value: float) -> bool:
    """`value` rounded to `quoted`'s decimals gives `quoted` (a value exactly halfway may go either way)."""
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(float(value) - float(quoted.replace(",", ""))) <= 0.5 * 10**-digits + 1e-9


def _readme() -> str:
    """README and the docs/ pages its topics moved to (the model's scores: docs/model_history.md)."""
    pages = [TOP / "README.md", *sorted((TOP / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


@pytest.mark.parametrize("name, paths, text", QUOTES, ids=[f"{q[0]}:{q[2][:40]}" for q in QUOTES])
def test_a_figure_readme_quotes_is_the_one_in_its_results_file(name, paths, text):
    assert text in _readme(), f"README no longer says {text!r}: update QUOTES with README"
    doc = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    quoted = _figures(text)
    assert len(quoted) == len(paths), (quoted, paths)
    wrong = [
        f"{'/'.join(map(str, path))}: README {figure}, file {_select(doc, path)}"
        for figure, path in zip(quoted, paths, strict=True)
        if not _matches(figure, _select(doc, path))
    ]
    assert not wrong, f"{name}: {wrong}"


def _results_files_named(text: str) -> set[str]:
    """The results files `text` names, by path (`benchmarks/results/x.json`) or by bare name (`x.json`)."""
    # results files are named in lower case; a capital is a placeholder (`model_fresh_setN_by_versionV.json`)
    by_path = set(re.findall(r"benchmarks/results/([a-z0-9_./]+\.json)", text))
    bare = {name for name in re.findall(r"\b[a-z0-9_]+\.json\b", text) if (RESULTS / name).is_file()}
    return by_path | bare


def test_every_results_file_readme_names_has_its_figures_checked():
    named = _results_files_named(_readme())
    checked = {name for name, _, _ in QUOTES}
    assert named <= checked, f"README cites {sorted(named - checked)} without figures checked here"
    assert all((RESULTS / name).is_file() for name in checked)


def test_a_results_file_named_by_its_bare_name_counts_as_named():
    text = "(6.2 s, board_scale.json); `benchmarks/results/ingest.json`; agent.json; set_N_by_V.json"
    assert _results_files_named(text) == {"board_scale.json", "ingest.json"}


def test_the_figure_check_flags_a_figure_the_file_does_not_hold():
    assert _matches("0.765", 0.7649) and _matches("86", 85.833) and _matches("2,000", 2000)
    assert _matches("31", 30.5) and _matches("0.976", 0.9765) and not _matches("0.975", 0.9765)
    assert not _matches("0.780", 0.7649) and not _matches("1.81", 1.8591)
    assert _figures("(`benchmarks/results/model_fresh_set12_by_version10.json`): 0.780 / 0.50 %") == [
        "0.780",
        "0.50",
    ]
