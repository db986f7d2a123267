"""`stethoscope model train|evaluate|finetune|info`: exit codes (2 for a missing or damaged model,
for torch missing when training, and for bad episodes), the info summary, and fine-tuning a new
hardware class through the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stethoscope.cli.main import main
from stethoscope.model.metadata import load, metadata_path
from stethoscope_training import episodes, job_fresh

TOP = Path(__file__).resolve().parents[2]
NO_TORCH = (
    "import sys; sys.modules['torch'] = None; "
    "from stethoscope.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def _copy_shipped(target: Path) -> Path:
    meta = load(metadata_path())
    target.mkdir(parents=True, exist_ok=True)
    for name in (meta.path.name, *meta.graphs.values()):
        shutil.copy2(meta.path.parent / name, target / name)
    return target / meta.path.name


@pytest.fixture(scope="module")
def small_episodes(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("episodes")
    episodes.save(episodes.generate(seed=5, per_family=3), out)
    return out


def test_info_prints_features_classes_thresholds_scores_and_history(capsys):
    assert main(["model", "info"]) == 0
    printed = capsys.readouterr().out
    for expected in (
        "train_allreduce_latency_ms",
        "communication",
        "thresholds:",
        "test: macro-F1",
        "train:",
    ):
        assert expected in printed
    # which generator made the training data: the fresh-set figures are per generator version
    history = load(metadata_path()).history
    version = next(h["generator_version"] for h in history if h.get("action") == "train")
    assert version == episodes.GENERATOR_VERSION and f"generator version {version}" in printed


def test_info_json_is_the_metadata(capsys):
    assert main(["model", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"] == "synthetic"


def test_missing_model_exits_2_and_names_it(tmp_path, capsys):
    missing = tmp_path / "none.json"
    assert main(["model", "info", "--model", str(missing)]) == 2
    assert main(["model", "evaluate", "--model", str(missing), "--no-rules"]) == 2
    assert str(missing) in capsys.readouterr().err


def test_corrupt_metadata_exits_2_with_its_line(tmp_path, capsys):
    path = _copy_shipped(tmp_path)
    path.write_text(path.read_text()[:200])
    assert main(["model", "info", "--model", str(path)]) == 2
    assert f"{path}:" in capsys.readouterr().err


def test_corrupt_graph_exits_2(tmp_path, small_episodes, capsys):
    path = _copy_shipped(tmp_path)
    (tmp_path / "core12.onnx").write_bytes(b"not a graph")
    assert (
        main(["model", "evaluate", "--model", str(path), "--episodes", str(small_episodes), "--no-rules"])
        == 2
    )
    assert "core12.onnx" in capsys.readouterr().err


def test_damaged_episodes_exit_2(tmp_path, capsys):
    (tmp_path / "episodes.npz").write_bytes(b"junk")
    (tmp_path / "episodes.json").write_text("{}")
    assert main(["model", "evaluate", "--episodes", str(tmp_path), "--no-rules"]) == 2
    assert main(["model", "evaluate", "--episodes", str(tmp_path / "nowhere"), "--no-rules"]) == 2
    assert "episodes" in capsys.readouterr().err


def test_evaluate_prints_per_class_scores_and_the_confusion_matrix(small_episodes, capsys):
    argv = ["model", "evaluate", "--episodes", str(small_episodes), "--no-rules", "--job-scenes", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "precision" in printed and "confusion" in printed and "false findings on healthy" in printed
    # the job scenes: the graphs, the job-relative detector and both, side by side
    assert f"job scenes (held-out set {job_fresh.SET}" in printed
    assert "graphs  detector  combined" in printed and "straggler culprit found" in printed
    assert "peers with a finding of their own %" in printed


@pytest.mark.parametrize("command", [["train"], ["finetune", "--class", "x", "--episodes", "."]])
def test_training_without_torch_exits_2_with_the_pip_hint(command, small_episodes, tmp_path):
    argv = ["model", *command]
    if command == ["train"]:
        argv += ["--episodes", str(small_episodes), "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, *argv], cwd=TOP, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "pip install aicluster-stethoscope-training" in done.stderr
    assert not list(tmp_path.glob("*.onnx"))


def test_finetune_raises_the_shifted_class_and_keeps_the_old_ones(tmp_path, capsys):
    pytest.importorskip("torch", reason="fine-tuning needs torch (aicluster-stethoscope-training)")
    path = _copy_shipped(tmp_path / "model")
    shifted = tmp_path / "shifted"
    data = episodes.generate(seed=11, per_family=20, hw_class="shifted")
    episodes.save(data, shifted)
    hw = str(data.hw_class[0])
    out = tmp_path / "tuned"
    assert (
        main(
            [
                "model",
                "finetune",
                "--model",
                str(path),
                "--class",
                hw,
                "--episodes",
                str(shifted),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "before" in capsys.readouterr().out
    tuned = load(out / "core12.json")
    entry = tuned.history[-1]
    assert entry["action"] == "finetune" and entry["hw_class"] == hw and entry["fault_episodes"] == 10
    assert hw in tuned.normalisation
    assert entry["new_after"]["accuracy"] > entry["new_before"]["accuracy"]
    assert entry["new_after"]["accuracy"] >= 0.85
    assert entry["old_after"]["accuracy"] >= entry["old_before"]["accuracy"] - 0.02
    assert load(path).history == load(metadata_path()).history  # --out leaves the original alone


def test_finetune_with_too_few_fault_episodes_exits_2(tmp_path, small_episodes, capsys):
    pytest.importorskip("torch", reason="fine-tuning needs torch (aicluster-stethoscope-training)")
    path = _copy_shipped(tmp_path / "model")
    data = episodes.load(small_episodes)
    hw = str(data.hw_class[0])
    argv = [
        "model",
        "finetune",
        "--model",
        str(path),
        "--class",
        hw,
        "--episodes",
        str(small_episodes),
        "--faults",
        "500",
    ]
    assert main(argv) == 2
    assert "needs 500 fault episodes" in capsys.readouterr().err


def test_train_with_a_bad_episode_count_exits_2_not_3(tmp_path, capsys):
    pytest.importorskip("torch", reason="training needs torch (aicluster-stethoscope-training)")
    assert main(["model", "train", "--per-family", "0", "--out", str(tmp_path)]) == 2
    assert "per_family" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_finetune_writes_the_state_folder_and_the_loader_prefers_what_it_wrote(tmp_path, monkeypatch, capsys):
    """Regression: `model finetune` wrote into the installed package by default (from a wheel that is
    site-packages: read-only, erased by an upgrade). It writes the state folder's models/ now, and
    the loader takes a model from there before the shipped one."""
    shipped = load(metadata_path())
    before = shipped.path.read_bytes()
    home = tmp_path / "home"
    monkeypatch.setenv("STETHOSCOPE_HOME", str(home))
    own = home / ".stethoscope" / "models" / "core12.json"
    assert metadata_path() == shipped.path  # nothing fine-tuned yet: the shipped model
    dsn = f"chdb://{tmp_path / 'db'}"
    argv = ["--dsn", dsn, "--database", "t_state", "model", "finetune", "--from-faults"]
    try:
        assert main(argv) == 0
        assert shipped.path.read_bytes() == before  # the package's model untouched
    finally:
        if shipped.path.read_bytes() != before:  # the bug: put the checkout's model back
            shipped.path.write_bytes(before)
    assert f"wrote {own}" in capsys.readouterr().out
    assert metadata_path() == own
    tuned = load(metadata_path())
    assert tuned.history[-1]["action"] == "finetune-from-faults"
    assert all((own.parent / name).is_file() for name in tuned.graphs.values())
    assert main(["model", "info"]) == 0 and f"({own})" in capsys.readouterr().out
