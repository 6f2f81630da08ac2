"""The word-problem task: the same data order at every world size, exact resume, evaluation sets,
config checks; and the language-model task's inputs and targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data_pipeline.synthetic.algebra import get_algebra
from implicit_megatron import load_config
from implicit_megatron.train.tasks import build_task
from implicit_megatron.train.tasks.language_model import LanguageModelTask
from implicit_megatron.train.tasks.word_problem import WordProblemTask
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[4]
EXPLICIT = str(ROOT / "configs/state_tracking/mamba2-explicit.yaml")
SMALL = ["data.seq_len=16", "train.global_batch_size=8", "train.micro_batch_size=2", "task.word_problem.eval_words=6",
         "task.word_problem.eval_lengths=[24]"]


def task(*overrides: str, world: int = 1) -> WordProblemTask:
    return build_task(load_config(EXPLICIT, [*SMALL, *overrides], world_size=world))


def test_every_step_sees_the_same_global_batch_at_any_world_size():
    one = task().train_batches(0, 1, 4)
    two = [task(world=2).train_batches(rank, 2, 2) for rank in range(2)]
    for _ in range(3):  # three optimizer steps
        whole = torch.cat([next(one) for _ in range(4)], dim=1)
        split = torch.cat([next(it) for it in two for _ in range(2)], dim=1)
        assert torch.equal(whole, split)


def test_labels_are_the_prefix_products_of_the_inputs():
    t = task()
    inputs, labels = t.inputs_and_targets(next(t.train_batches(0, 1, 4)))
    table = torch.tensor(get_algebra("Ma_A5").table)
    state = inputs[:, 0]
    assert torch.equal(labels[:, 0], state)
    for i in range(1, inputs.shape[1]):
        state = table[state, inputs[:, i]]
        assert torch.equal(labels[:, i], state)
    hard = (inputs % 60 != 0).float().mean().item()  # the group part is not the identity
    assert 0 < hard < 0.4  # p = 0.1 over 128 tokens


def test_a_resumed_stream_continues_exactly():
    stream = task().train_batches(0, 1, 4)
    for _ in range(8):
        next(stream)
    state = stream.state_dict()
    expected = [next(stream) for _ in range(4)]
    resumed = task().train_batches(0, 1, 4)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, next(resumed)) for a in expected)
    with pytest.raises(ValueError, match="not a multiple of the global batch"):
        resumed.load_state_dict({"consumed_samples": 3})


def test_evaluation_sets_in_distribution_out_of_distribution_and_longer():
    sets = task().eval_sets(0, 1)
    assert list(sets) == ["val", "val_p0.5", "val_len24"]
    batches = {name: list(batches) for name, batches in sets.items()}
    assert [b.shape for b in batches["val"]] == [(2, 2, 16)] * 3
    assert batches["val_len24"][0].shape == (2, 2, 24)
    hard = (torch.cat([b[0] for b in batches["val_p0.5"]]) % 60 != 0).float().mean().item()
    assert hard > 0.3
    split = [list(task(world=2).eval_sets(rank, 2)["val"]) for rank in range(2)]
    assert sum(b.shape[1] for part in split for b in part) == 6  # the same words, split over the ranks
    assert not torch.equal(batches["val"][0], next(iter(task().train_batches(0, 1, 4))))  # not training data


def test_every_rank_evaluates_the_same_number_of_micro_batches():
    """7 words on 2 ranks in micro-batches of 2: 4 and 3 words would be 2 and 2 batches, 5 and 2 on 3
    ranks would be 3 and 1; short ranks pad with an ignored word so that the counts agree."""
    from implicit_megatron.models.loss import IGNORE_INDEX

    for world in (2, 3, 8):
        t = task("task.word_problem.eval_words=7", "train.global_batch_size=48", world=world)
        parts = [list(t.eval_sets(rank, world)["val"]) for rank in range(world)]
        assert len({len(p) for p in parts}) == 1, [len(p) for p in parts]
        words = torch.cat([torch.cat(p, dim=1) for p in parts], dim=1)  # (2, words, length)
        real = (words[1] != IGNORE_INDEX).all(1)
        assert real.sum() == 7 and ((words[1] == IGNORE_INDEX).all(1) | real).all()
        whole = torch.cat(list(task("task.word_problem.eval_words=7").eval_sets(0, 1)["val"]), dim=1)
        assert sorted(map(tuple, words[0][real].tolist())) == sorted(map(tuple, whole[0].tolist()))


def test_word_problem_config_checks():
    with pytest.raises(ConfigError, match="the S5 word problem has 120 elements"):
        load_config(EXPLICIT, ["task.word_problem.algebra=S5"])
    with pytest.raises(ConfigError, match=r"task.word_problem.p: expected a probability"):
        load_config(EXPLICIT, ["task.word_problem.p=1.5"])
    with pytest.raises(ConfigError, match=r"task.word_problem.algebra: unknown algebra group 'Q8'"):
        load_config(EXPLICIT, ["task.word_problem.algebra=Q8"])
    cfg = load_config(EXPLICIT, ["data.prefixes=[]", "data.tokenizer=missing.json"])  # needs neither
    assert cfg.task.kind == "word_problem"


def test_released_p_is_read_as_the_released_script_writes_it():
    """Released p = 0.9 (identity forced with probability 0.9, else uniform over A5) is our
    (1 - 0.9) x 59/60; the generated words have that share of non-identity group parts."""
    t = task("task.word_problem.p_convention=released", "task.word_problem.p=0.9", "task.word_problem.eval_p=0.5")
    assert t.p == pytest.approx(0.1 * 59 / 60) and t.eval_p == pytest.approx(0.5 * 59 / 60)
    assert t.spec.p == t.p
    words = torch.cat([t.inputs_and_targets(next(t.train_batches(0, 1, 4)))[0] for _ in range(50)])
    hard = (torch.from_numpy(get_algebra("Ma_A5").group_part(words.numpy())) != 0).double().mean().item()
    assert hard == pytest.approx(0.1 * 59 / 60, abs=0.02)
    assert set(t.eval_sets(0, 1)) == {"val", "val_p0.5", "val_len24"}


def test_language_model_targets_are_the_next_tokens():
    lm = LanguageModelTask(load_config(ROOT / "configs/tiny/mamba2-explicit.yaml"))
    batch = torch.arange(10).view(2, 5)
    inputs, targets = lm.inputs_and_targets(batch)
    assert torch.equal(inputs, batch[:, :-1]) and torch.equal(targets, batch[:, 1:])


@pytest.mark.processes
def test_shards_without_a_validation_split_skip_validation_with_one_warning(tmp_path, caplog):
    """Preprocessing with --valid-fraction 0 writes no valid split: training runs, and validation is
    skipped with a warning naming the prefix (it used to crash at the first validation)."""
    import logging
    import subprocess
    import sys

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(f'{{"text": "to be or not to be, {i}"}}\n' for i in range(50)))
    prefix = tmp_path / "neox"
    subprocess.run([sys.executable, "-m", "data_pipeline.preprocess", "--input", str(source), "--tokenizer",
                    str(ROOT / "data/tokenizers/gpt-neox-20b.json.xz"), "--output-prefix", str(prefix),
                    "--workers", "0", "--quiet", "--append-eod"], cwd=ROOT, check=True, capture_output=True)
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [f"data.prefixes=[{prefix}]", "data.source=null",
                                                                     "data.seq_len=16"], check_files=False)
    with caplog.at_level(logging.WARNING):
        assert LanguageModelTask(cfg).eval_sets(0, 1) == {}
    assert f"no validation data; validation is skipped: no valid shards for prefix '{prefix}'" in caplog.text
