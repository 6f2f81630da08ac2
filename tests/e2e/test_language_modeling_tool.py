"""tools/research/language_modeling.py end to end at toy size: an explicit and an implicit model of one config
train on the same tokens through the launcher, are tested at 1x and 2x the trained length on the
same windows, and the page is written; a rerun trains and tests nothing again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.processes import ROOT, child_env, free_port


def sweep(shards, out, page, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "tools/research/language_modeling.py", "--config", "configs/tiny/mamba2-implicit.yaml",
           "--seeds", "1", "--lengths", "1,2", "--eval-windows", "2", "--output", str(out), "--page", str(page),
           "--tag", "tiny", f"data.prefixes=[{shards}]", "data.source=null", "train.steps=5", "train.eval_interval=5",
           "schedule.warmup_steps=1", "train.log_interval=1", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=child_env(MASTER_PORT=str(free_port())), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_language_modeling_sweep(shakespeare_shards, tmp_path):
    page = tmp_path / "docs" / "language_modeling.md"
    result = sweep(shakespeare_shards, tmp_path / "runs", page)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = tmp_path / "runs" / "tiny"
    results = json.loads((folder / "results.json").read_text())
    explicit, implicit = results["runs"]["explicit"]["0"], results["runs"]["implicit"]["0"]
    for run in (explicit, implicit):
        assert sorted(run["lengths"], key=int) == ["64", "128"] and run["tokens"] == 5 * 8 * 64
        assert run["val_ppl"] == run["curve"][-1][1] and run["curve"][-1][0] == 5 * 8 * 64
    assert implicit["parameters"] > explicit["parameters"]  # the injection module
    # The same tokens in the same order: both runs logged the same number of samples at each step,
    # and an implicit run of the config trains with its curriculum, the explicit one without.
    runs = {m: [json.loads(line) for line in (folder / m / "seed0" / "metrics.jsonl").read_text().splitlines()]
            for m in ("explicit", "implicit")}
    assert "solver/iterations" in next(r for r in runs["implicit"] if "train/loss" in r)
    assert not any("solver/iterations" in r for r in runs["explicit"])
    assert (folder / "implicit" / "seed0" / "checkpoints" / "latest").read_text().strip() == "free-step5"
    # The tested perplexity is what tools/evaluate.py gives for that checkpoint on those windows.
    saved = json.loads((folder / "explicit" / "seed0" / "evaluation" / "results.json").read_text())
    assert saved["extrapolation"]["lengths"]["128"]["ppl"] == explicit["lengths"]["128"]["ppl"]
    assert saved["extrapolation"]["lengths"]["128"]["windows"] == 2
    text = page.read_text()
    assert "## tiny" in text and "| model | L64 | L128 |" in text and "--eval-windows 2" in text
    assert (page.parent / "language_modeling" / "tiny-positions.png").is_file()
    assert (page.parent / "language_modeling" / "tiny-runs.png").is_file() and "/tiny-runs.png)" in text

    again = sweep(shakespeare_shards, tmp_path / "runs", page)
    assert again.returncode == 0 and again.stdout.count("not trained again") == 2
    assert result.stdout.count("simultaneous mode, length 128: 2 windows") == 2  # each run tested once
    assert "simultaneous mode" not in again.stdout  # and not again
    assert json.loads((folder / "results.json").read_text())["runs"] == results["runs"]


def test_bad_settings_are_refused_before_anything_trains(tmp_path):
    for extra, expected in ((["--models", "explicit,llama"], "--models llama: choose from explicit"),
                            (["--lengths", "2,4"], "start at 1"),
                            (["train.stepz=3"], "train.stepz: unknown key")):
        result = subprocess.run([sys.executable, "tools/research/language_modeling.py", "--output", str(tmp_path),
                                 *extra], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and expected in result.stderr, result.stderr
        assert not any(tmp_path.iterdir())
