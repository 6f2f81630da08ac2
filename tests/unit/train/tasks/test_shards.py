"""At launch, one line says what the data holds and what the plan reads of it: tokens per split,
planned tokens and the epochs they make, with a warning above one epoch (the trainer's log) and a
note from the config check, before any process starts."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.processes  # runs python -m implicit_megatron.config
def test_the_config_check_notes_a_plan_of_many_epochs_before_launch(shakespeare_shards):
    check = [sys.executable, "-m", "implicit_megatron.config", TINY, f"data.prefixes=[{shakespeare_shards}]",
             "data.source=null", "data.seq_len=2048"]
    many = subprocess.run([*check, "train.steps=1000"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert many.returncode == 0 and "note: train.steps=1000 reads the training data" in many.stderr
    few = subprocess.run([*check, "train.steps=10"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert few.returncode == 0 and "reads the training data" not in few.stderr


def test_a_valid_split_shorter_than_one_sample_skips_validation_with_one_warning(shakespeare_shards, caplog):
    """docs/data.md's fractions on a small corpus gave a valid split shorter than one sample: every
    rank crashed at the first validation. The check notes it before launch; the trainer skips it."""
    from implicit_megatron.prelaunch import notes

    valid = split_tokens([shakespeare_shards], "valid")
    short = config(shakespeare_shards, steps=10, seq_len=valid + 100)  # the train split still holds samples
    assert [note for note in notes(short) if "valid split" in note] == [
        f"the valid split of data.prefixes holds {valid} tokens, fewer than one sample (data.seq_len + 1 = "
        f"{valid + 101}): validation is skipped; rebuild the shards with a larger --valid-fraction to validate"]
    assert not [note for note in notes(config(shakespeare_shards, steps=10)) if "valid split" in note]
    task = LanguageModelTask(short)
    with caplog.at_level(logging.WARNING, logger="implicit_megatron.train.tasks.language_model"):
        assert task.eval_sets(0, 2) == {} and task.eval_sets(0, 2) == {}
        assert LanguageModelTask(short).eval_sets(1, 2) == {}  # another rank: skips, says nothing
    assert [record.getMessage() for record in caplog.records] == [
        f"no validation data; validation is skipped: the valid split of [{shakespeare_shards!r}] holds {valid} "
        f"tokens, fewer than one sample of {valid + 101}"]


def test_the_preprocessing_summary_warns_of_a_split_too_short_for_a_sample():
    from data_pipeline.pipeline import short_splits

    def stats(valid: int, test: int, test_fraction: float = 0.01) -> dict:
        return {"splits": {"train": {"tokens": 10**6}, "valid": {"tokens": valid}, "test": {"tokens": test}},
                "valid_fraction": 0.01, "test_fraction": test_fraction}

    assert short_splits(stats(2049, 5000)) == []
    [line] = short_splits(stats(1999, 0, test_fraction=0))
    assert line.startswith("the valid split holds 1999 tokens, enough for data.seq_len 1024 but not 2048")
    [line] = short_splits(stats(5000, 700))
    assert line.startswith("the test split holds 700 tokens, fewer than one sample of 1025")
    assert line.endswith("raise --test-fraction")
