"""At launch, one line says what the data holds and what the plan reads of it: tokens per split,
planned tokens and the epochs they make, with a warning above one epoch (the trainer's log) and a
note from the config check, before any process starts."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from data_pipeline.packed import split_tokens
from implicit_megatron import load_config
from implicit_megatron.train.tasks.language_model import LanguageModelTask
from implicit_megatron.train.tasks.shards import data_summary

ROOT = Path(__file__).resolve().parents[4]
TINY = "configs/tiny/mamba2-explicit.yaml"


def config(shards: str, steps: int, seq_len: int = 128):
    return load_config(ROOT / TINY, [f"data.prefixes=[{shards}]", "data.source=null", f"train.steps={steps}",
                                     f"data.seq_len={seq_len}"], check_files=False)


def test_the_summary_counts_each_split_and_the_epochs_of_the_plan(shakespeare_shards):
    train = split_tokens([shakespeare_shards], "train")
    cfg = config(shakespeare_shards, steps=10)
    line, warning = data_summary(cfg)
    planned = 10 * cfg.train.global_batch_size * 128
    assert f"train {train:,} tokens" in line and f"the plan reads {planned:,}" in line
    assert f"{10 * cfg.train.global_batch_size / ((train - 1) // 128):.2f} epochs" in line and warning is None
    long = config(shakespeare_shards, steps=1000, seq_len=2048)
    line, warning = data_summary(long)
    epochs = 1000 * long.train.global_batch_size / ((train - 1) // 2048)
    assert f"{epochs:.2f} epochs" in line and epochs > 1
    assert f"reads the training data {epochs:.1f} times" in warning and "train.steps=1000" in warning


def test_the_trainer_prints_the_summary_and_warns_above_one_epoch(shakespeare_shards, caplog, capsys):
    with caplog.at_level(logging.WARNING, logger="implicit_megatron.train.tasks.language_model"):
        LanguageModelTask(config(shakespeare_shards, steps=1000, seq_len=2048)).prepare()
    line = capsys.readouterr().out
    assert line.startswith("[data] train ") and "epochs of the train split" in line
    assert ["reads the training data" in record.getMessage() for record in caplog.records] == [True]


def test_the_config_check_notes_a_plan_of_many_epochs_before_launch(shakespeare_shards):
    check = [sys.executable, "-m", "implicit_megatron.config", TINY, f"data.prefixes=[{shakespeare_shards}]",
             "data.source=null", "data.seq_len=2048"]
    many = subprocess.run([*check, "train.steps=1000"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert many.returncode == 0 and "note: train.steps=1000 reads the training data" in many.stderr
    few = subprocess.run([*check, "train.steps=10"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert few.returncode == 0 and "reads the training data" not in few.stderr
