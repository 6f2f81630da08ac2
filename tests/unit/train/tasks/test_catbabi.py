"""The catbAbI task: targets only on answers, the same order at every world size, exact resume, each
window once per epoch, per-task accuracy, and the config checks that run before a launch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data_pipeline.synthetic.catbabi import Vocabulary, folder_vocabulary, load_split, per_task_accuracy
from implicit_megatron import load_config
from implicit_megatron.models.loss import IGNORE_INDEX
from implicit_megatron.train.tasks import build_task
from implicit_megatron.train.tasks.catbabi import CatbabiTask
from implicit_megatron.train.validation import group_hits
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[4]
CONFIG = str(ROOT / "configs/catbabi/mamba2-explicit.yaml")
FIXTURE = str(ROOT / "tests/fixtures/catbabi")
SMALL = [f"task.catbabi.folder={FIXTURE}", "data.seq_len=24", "train.global_batch_size=8",
         "train.micro_batch_size=2", "train.eval_samples=10", "model.vocab_size=32"]


def task(*overrides: str, world: int = 1) -> CatbabiTask:
    return build_task(load_config(CONFIG, [*SMALL, *overrides], world_size=world, check_data=True))


def test_targets_are_the_answers_and_nothing_else():
    t = task()
    vocab = folder_vocabulary(FIXTURE, False)
    batch = next(t.train_batches(0, 1, 4))
    inputs, labels = t.inputs_and_targets(batch)
    assert inputs.shape == labels.shape == (2, 24)
    assert torch.equal(inputs[:, 1:], batch[0][:, 1:-1])
    places = {"bathroom", "hallway", "garden", "office", "kitchen", "bedroom"}
    for row_inputs, row_labels in zip(inputs, labels):
        for word, label in zip(vocab.decode(row_inputs), row_labels.tolist()):
            assert (word == "?") == (label != IGNORE_INDEX)  # the answer follows its question mark
            assert label == IGNORE_INDEX or vocab.words[label] in places
    groups = t.accuracy_groups(batch)
    assert torch.equal(groups >= 0, labels != IGNORE_INDEX) and set(groups[groups >= 0].tolist()) <= {1, 2}


def test_every_step_sees_the_same_global_batch_at_any_world_size_and_resumes_exactly():
    one = task().train_batches(0, 1, 4)
    two = [task(world=2).train_batches(rank, 2, 2) for rank in range(2)]
    for _ in range(3):
        whole = torch.cat([next(one) for _ in range(4)], dim=1)
        assert torch.equal(whole, torch.cat([next(it) for it in two for _ in range(2)], dim=1))
    state = one.state_dict()
    expected = [next(one) for _ in range(4)]
    resumed = task().train_batches(0, 1, 4)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, next(resumed)) for a in expected)


def test_each_epoch_shows_every_training_window_once_in_a_new_order():
    t = task()
    count = len(t._train)
    steps = -(-2 * count // 8)
    rows = torch.cat([t.global_batch(k)[0] for k in range(steps)])[: 2 * count]
    first, second = rows[:count], rows[count:]
    as_set = lambda block: sorted(map(tuple, block.tolist()))  # noqa: E731
    assert as_set(first) == as_set(second) == as_set(torch.from_numpy(t._train[:, 0]))
    assert not torch.equal(first, second)


def test_per_task_accuracy_counts_hits_per_task_as_the_reader_does():
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (3, 40), generator=gen)
    logits = torch.randn(3, 40, 7, generator=gen)
    groups = torch.randint(-1, 4, (3, 40), generator=gen)
    totals = group_hits(logits, labels, groups, vocab_size=5, count=4)
    mask = (groups >= 0).numpy()
    expected = per_task_accuracy(logits[..., :5].argmax(-1).numpy(), labels.numpy(), mask, groups.clamp_min(0).numpy())
    assert {t: (totals[0, t] / totals[1, t]).item() for t in range(4) if totals[1, t]} == pytest.approx(expected)
    padded = torch.zeros(2, CatbabiTask.groups)
    padded[:, :4] = totals
    metrics = task().group_metrics("val", padded.flatten().tolist())
    assert metrics == {f"val/accuracy_task{t}": pytest.approx(expected[t]) for t in expected if t >= 1}


def test_the_evaluation_set_spans_every_task_and_pads_ranks_with_ignored_rows():
    t = task("train.eval_samples=5", world=2)
    batches = [list(t.eval_sets(rank, 2)["val"]) for rank in range(2)]
    assert [len(b) for b in batches] == [2, 2]  # 3 and 2 windows, the second rank padded to 3
    rows = [torch.cat(b, dim=1) for b in batches]
    padded = rows[1][:, -1:]
    assert (t.inputs_and_targets(padded)[1] == IGNORE_INDEX).all() and (t.accuracy_groups(padded) == -1).all()
    tasks = set(torch.cat([t.accuracy_groups(r) for r in rows], 1).unique().tolist()) - {-1}
    assert tasks == {1, 2}


def test_the_vocabulary_holds_every_split_and_is_saved_beside_the_run(tmp_path):
    t = task(f"train.output_dir={tmp_path}")
    t.prepare()
    words = {w for split in ("train", "valid", "test") for s in load_split(FIXTURE, split).stories for w in s.words}
    vocab = folder_vocabulary(FIXTURE, False)
    assert words <= set(vocab.words) and Vocabulary.load(tmp_path / "catbabi_vocab.json") == vocab


@pytest.mark.parametrize(("override", "key", "message"), [
    ("task.catbabi.folder=/nonexistent/babi", "task.catbabi.folder", "no folder /nonexistent/babi"),
    ("model.vocab_size=16", "model.vocab_size", "smaller than the catbAbI vocabulary"),
    ("data.seq_len=100000", "data.seq_len", "do not fill one window"),
    ("model.separate_documents=true", "model.separate_documents", "one stream"),
])
def test_bad_settings_are_refused_before_launch_naming_the_key(override, key, message):
    with pytest.raises(ConfigError, match=key) as err:
        load_config(CONFIG, [*SMALL, override], check_data=True)
    assert message in str(err.value)


def test_a_missing_evaluation_split_names_the_key(tmp_path):
    for path in Path(FIXTURE).glob("*_train.txt"):
        (tmp_path / path.name).write_text(path.read_text())
    with pytest.raises(ConfigError, match="task.catbabi.eval_split") as err:
        load_config(CONFIG, [*SMALL, f"task.catbabi.folder={tmp_path}"], check_data=True)
    assert "no valid files" in str(err.value)
