"""catbAbI: parsing bAbI task files, the answer mask, the vocabulary, and per-task accuracy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.synthetic.catbabi import (
    EOS,
    CatbabiFormatError,
    Vocabulary,
    build_stream,
    load_split,
    parse_babi_file,
    parse_catbabi_file,
    per_task_accuracy,
)

FIXTURES = Path(__file__).parent / "fixtures" / "babi"


def test_parse_fixture():
    parsed = load_split(FIXTURES, "train")
    assert parsed.malformed == []
    assert [(s.task, s.line) for s in parsed.stories] == [(1, 1), (1, 7), (2, 1), (2, 5)]
    first = parsed.stories[0]
    assert " ".join(first.words) == ("mary moved to the bathroom . john went to the hallway . where is mary ? "
                                     "bathroom daniel went back to the hallway . sandra moved to the garden . "
                                     "where is daniel ? hallway")
    assert [first.words[i] for i in first.answers] == ["bathroom", "hallway"]
    assert first.source.endswith("qa1_train.txt")


def test_stream_answer_mask_and_tasks():
    parsed = load_split(FIXTURES, "train")
    vocab = Vocabulary.build(parsed.stories)
    stream = build_stream(parsed.stories, vocab)
    words = vocab.decode(stream.tokens)
    assert words[0] == EOS and words.count(EOS) == 4
    answers = np.flatnonzero(stream.answer_mask)
    assert [words[i] for i in answers] == ["bathroom", "hallway", "office", "kitchen", "garden"]
    assert all(words[i - 1] == "?" for i in answers)
    assert stream.task_ids[answers].tolist() == [1, 1, 1, 2, 2]
    assert len(stream.tokens) == len(stream.answer_mask) == len(stream.task_ids) == len(words)
    inputs, targets, target_is_answer, target_task = stream.next_token()
    assert [vocab.words[t] for t in targets[target_is_answer]] == ["bathroom", "hallway", "office", "kitchen",
                                                                   "garden"]
    assert [vocab.words[t] for t in inputs[target_is_answer]] == ["?"] * 5
    assert target_task[target_is_answer].tolist() == [1, 1, 1, 2, 2]


def test_shuffled_stream_keeps_stories_whole():
    parsed = load_split(FIXTURES, "train")
    vocab = Vocabulary.build(parsed.stories)
    a, b = build_stream(parsed.stories, vocab, shuffle_seed=0), build_stream(parsed.stories, vocab, shuffle_seed=0)
    assert np.array_equal(a.tokens, b.tokens)
    assert sorted(vocab.decode(a.tokens)) == sorted(vocab.decode(build_stream(parsed.stories, vocab).tokens))
    assert a.answer_mask.sum() == 5


def test_vocabulary_round_trip(tmp_path):
    vocab = Vocabulary.build(load_split(FIXTURES, "train").stories)
    assert vocab.words[:3] == ("<pad>", "<eos>", "<unk>")
    assert list(vocab.words[3:]) == sorted(vocab.words[3:])
    vocab.save(tmp_path / "vocab.json")
    loaded = Vocabulary.load(tmp_path / "vocab.json")
    assert loaded == vocab and loaded.index == vocab.index
    ids = loaded.encode(["where", "is", "mary", "?", "zebra"])
    assert loaded.decode(ids) == ["where", "is", "mary", "?", "<unk>"]


def test_per_task_accuracy_hand_made():
    targets = np.array([[5, 6, 7, 8], [5, 9, 9, 4]])
    predictions = np.array([[5, 0, 7, 1], [5, 9, 0, 4]])
    answer_mask = np.array([[False, True, True, True], [False, True, True, True]])
    task_ids = np.array([[1, 1, 3, 3], [3, 3, 3, 20]])
    # task 1: one answer (6), wrong; task 3: answers 7 (right), 8 (wrong), 9 (right), 9 (wrong); task 20: right.
    assert per_task_accuracy(predictions, targets, answer_mask, task_ids) == {1: 0.0, 3: 0.5, 20: 1.0}
    with pytest.raises(ValueError, match="shapes differ"):
        per_task_accuracy(predictions[:, :2], targets, answer_mask, task_ids)


def test_malformed_lines_are_counted_skipped_and_named(tmp_path):
    bad = tmp_path / "qa1_train.txt"
    lines = (FIXTURES / "qa1_train.txt").read_text().splitlines()
    lines.insert(2, "Mary and John went home.")  # no ID: line 3
    lines.insert(5, "5 Where is John?")  # a question without an answer: line 6
    bad.write_text("\n".join(lines) + "\n")
    shutil.copy(FIXTURES / "qa2_train.txt", tmp_path)
    with pytest.warns(UserWarning, match="2 malformed lines skipped"):
        parsed = load_split(tmp_path, "train")
    assert [(m.line, Path(m.path).name) for m in parsed.malformed] == [(3, "qa1_train.txt"), (6, "qa1_train.txt")]
    assert "qa1_train.txt:3: expected 'ID text'" in str(parsed.malformed[0])
    assert "question without an answer" in parsed.malformed[1].reason
    assert [s.words[i] for s in parsed.stories for i in s.answers] == ["bathroom", "hallway", "office", "kitchen",
                                                                        "garden"]
    with pytest.raises(CatbabiFormatError, match=r"qa1_train\.txt:3:"):
        parse_babi_file(bad, strict=True)


def test_bad_answer_fields(tmp_path):
    path = tmp_path / "qa5_test.txt"
    path.write_text("1 Bill went home.\n2 Where is Bill?\thome\tone\n3 Where is Bill?\tthe home\t1\n"
                    "4 Where is Bill?\thome\t1\n")
    parsed = parse_babi_file(path)
    assert [m.line for m in parsed.malformed] == [2, 3]
    assert parsed.stories[0].task == 5 and [parsed.stories[0].words[i] for i in parsed.stories[0].answers] == ["home"]


def test_list_answers_stay_one_word_unless_split(tmp_path):
    path = tmp_path / "qa19_valid.txt"
    path.write_text("1 The office is east of the hallway.\n2 How do you go from the office to the garden?\ts,w\t1\n")
    assert parse_babi_file(path).stories[0].words[-1] == "s,w"
    story = parse_babi_file(path, split_answers=True).stories[0]
    assert [story.words[i] for i in story.answers] == ["s", "w"]


def test_converted_catbabi_files(tmp_path):
    (tmp_path / "en-valid-10k_valid.txt").write_text(
        "1\tmary went to the office . where is mary ? office\n"
        "2\tbill is in the park . where is bill ?\n"
        "3\tjeff took the milk . what is jeff carrying ? milk\n")
    with pytest.warns(UserWarning, match="1 malformed"):
        parsed = load_split(tmp_path, "valid")
    assert [s.task for s in parsed.stories] == [1, 3]
    assert parsed.malformed[0].line == 2
    assert [parsed.stories[1].words[i] for i in parsed.stories[1].answers] == ["milk"]
    assert parse_catbabi_file(tmp_path / "en-valid-10k_valid.txt").stories[0].answers == [10]


def test_missing_split(tmp_path):
    with pytest.raises(FileNotFoundError, match="no test files"):
        load_split(tmp_path, "test")
