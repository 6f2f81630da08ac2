"""A run's last lines say what it reached, how big its model is and what to do next; a phase launch
of a curriculum, which is not the run's end, says only what it reached."""

from __future__ import annotations

from pathlib import Path

import torch

from implicit_megatron import load_config
from implicit_megatron.train.callbacks.reporting import Reporting

ROOT = Path(__file__).resolve().parents[4]


def summary(tmp_path: Path, step: int) -> list[str]:
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={tmp_path}", "train.steps=30", "tracking.enabled=false"])
    said: list[str] = []
    reporting = Reporting(cfg, 0, torch.device("cpu"), said.append, parameters=1_234_567)
    reporting.last_eval = {"val/loss": 2.0, "val/ppl": 7.39}
    reporting.summary(step, 0)
    return said


def test_the_runs_last_lines_give_the_parameter_count_and_the_next_commands(tmp_path):
    done, then = summary(tmp_path, 30)
    assert done.startswith("done at step 30: validation perplexity") and done.endswith(f"checkpoints in "
                                                                                       f"{tmp_path / 'checkpoints'}")
    assert then.startswith("the model: 1,234,567 parameters; next: ")
    assert f"tools/convert_checkpoint.py export {tmp_path} {tmp_path}/export (a transformers folder)" in then
    assert f"tools/generate.py {tmp_path / 'checkpoints'} --prompt TEXT" in then
    assert f"tools/plot_run.py {tmp_path} (the run's curves)" in then


def test_a_phase_launch_that_is_not_the_runs_end_says_only_what_it_reached(tmp_path):
    (done,) = summary(tmp_path, 24)
    assert done.startswith("done at step 24")
