"""tools/research/state_tracking.py's command line: what it refuses before anything trains, the checkpoints
that let a stopped sweep resume, and the estimate it prints before training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from support.tools import load_tool

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tool():
    return load_tool("state_tracking")


def test_seeds_are_a_count_or_a_list(tool):
    assert tool.parse(["--seeds", "3"]).seeds == [0, 1, 2]
    assert tool.parse(["--seeds", "0,2"]).seeds == [0, 2]
    assert tool.parse(["--seeds", "2,"]).seeds == [2]


@pytest.mark.parametrize("seeds", ["0", "", ",", "-1,", "three"])
def test_no_seed_to_train_is_refused_by_name(tool, seeds):
    with pytest.raises(SystemExit, match="--seeds") as refused:
        tool.parse([f"--seeds={seeds}"])
    assert repr(seeds) in str(refused.value)


def test_an_unknown_model_is_refused_before_any_trains(tool):
    with pytest.raises(SystemExit, match="unknown model 'explicit-3l'"):
        tool.parse(["--models", "implicit,explicit-3l"])
    with pytest.raises(SystemExit, match="--models names no model"):
        tool.parse(["--models", ","])


@pytest.mark.parametrize(("steps", "interval"), [(1000, 100), (16384, 1639), (4, 1), (1, 1)])
def test_runs_save_every_tenth_of_their_steps_so_a_stopped_sweep_resumes(tool, steps, interval, tmp_path):
    args = tool.parse(["--steps", str(steps)])
    assert f"checkpoint.interval={interval}" in tool.overrides(args, "implicit", tmp_path, 0)


@pytest.mark.parametrize(("length", "chunk"), [(1, 1), (8, 8), (20, 32), (32, 32), (64, 64), (256, 64)])
def test_short_words_are_not_padded_to_a_whole_scan_chunk(tool, length, chunk, tmp_path):
    args = tool.parse(["--length", str(length)])
    assert f"model.mamba2.chunk_size={chunk}" in tool.overrides(args, "implicit", tmp_path, 0)


def test_the_estimate_times_a_step_on_the_threads_the_launcher_gives_each_run(tool, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert tool.run_threads(1) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert tool.run_threads(2) == max(1, (os.cpu_count() or 1) // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    timed_on = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n, real=torch.set_num_threads: (timed_on.append(n), real(n)))
    args = tool.parse(["--algebra", "Z2", "--length", "8", "--batch", "4", "--d-model", "32", "--steps", "10",
                       "--device", "cpu", "--output", str(tmp_path)])
    tool.step_seconds("explicit-1l", args)
    assert timed_on[0] == 1  # then back to the caller's threads


def test_the_estimate_names_each_model_still_to_train(tool, tmp_path):
    args = tool.parse(["--algebra", "Z2", "--length", "8", "--batch", "4", "--d-model", "32", "--steps", "10",
                       "--device", "cpu", "--output", str(tmp_path)])
    line = tool.estimate({"explicit-1l": [0, 1], "implicit": [0]}, args)
    assert line.startswith("[state_tracking] estimate: explicit-1l ")
    assert "s/step x 10 steps x 2 seed(s); implicit " in line
    assert "s/step (every solve at its cap) x 10 steps x 1 seed(s)" in line
    assert "min of training in all on cpu" in line
    assert tool.step_seconds("explicit-1l", args) > 0
