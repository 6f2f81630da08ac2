"""catbAbI: the 20 bAbI tasks as one token stream with answers inline (Schlag et al., 2021).

Reads bAbI v1.2 task files (`qa{N}_train.txt`, `qa{N}_single-supporting-fact_train.txt`, ...) from a
local folder.  Their lines are

    ID statement.                                  e.g. "3 Mary went back to the bedroom."
    ID question?<TAB>answer<TAB>supporting IDs     e.g. "4 Where is Mary?\tbedroom\t3"

and a story restarts whenever ID is 1.  As in the catbAbI preprocessing, text is lower-cased and
split into words, "." and "?" are words of their own, each question is followed by its answer (one
word: list answers such as "n,w" stay one word unless `split_answers`), supporting IDs are dropped,
and every story starts with "<eos>".  Already-converted catbAbI files (one story per line,
"task<TAB>words", e.g. `en-valid-10k_train.txt`) are read as well.

The stream marks answer tokens (`answer_mask`) and the task of every token (`task_ids`), so a
language model trained on next-token prediction over the whole stream is scored on answers only,
per task (`per_task_accuracy`).  Malformed lines are skipped, counted and named by file and line.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIALS = (PAD, EOS, UNK)
SPLITS = ("train", "valid", "test")
VOCAB_FORMAT = "catbabi-vocab"
BABI_LINE = re.compile(r"^(\d+) (\S.*)$")
WORDS = re.compile(r"[^\s.?]+|[.?]")


class CatbabiFormatError(ValueError):
    """A malformed line where `strict=True` asks to stop, or a file whose task its name does not tell."""


@dataclass(frozen=True)
class MalformedLine:
    """A skipped input line: which file, which line (1-based), and what is wrong with it."""

    path: str
    line: int
    reason: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}: {self.text!r}"


@dataclass
class Story:
    """One bAbI story with its questions: words, positions of answer words, task, and origin."""

    task: int
    words: list[str] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    source: str = ""
    line: int = 0


@dataclass
class Parsed:
    """Stories read from files, and the malformed lines that were skipped."""

    stories: list[Story]
    malformed: list[MalformedLine]

    def report(self) -> str:
        head = f"{len(self.stories)} stories, {len(self.malformed)} malformed lines skipped"
        return "\n  ".join([head] + [str(m) for m in self.malformed])


def words_of(text: str) -> list[str]:
    return WORDS.findall(text.lower())


def task_of(path: Path) -> int:
    match = re.match(r"qa(\d+)_", path.name)
    if not match:
        raise CatbabiFormatError(f"{path}: cannot tell the task from the name (expected qa<N>_...txt)")
    return int(match.group(1))


def _babi_text(text: str, split_answers: bool) -> tuple[list[str], list[str]] | str:
    """(words, answer words) of a line's text after its ID, or the reason the line is malformed."""
    if "\t" not in text:
        if text.rstrip().endswith("?"):
            return "a question without an answer (expected 'ID question?<TAB>answer<TAB>supporting IDs')"
        return words_of(text), []
    parts = text.split("\t")
    if len(parts) not in (2, 3):
        return f"{len(parts)} tab-separated fields, expected question, answer and supporting IDs"
    question, answer = parts[0].strip(), parts[1].strip().lower()
    if not question.endswith("?"):
        return "a line with an answer field has no question mark"
    if not answer or len(answer.split()) != 1:
        return "the answer must be one non-empty word (lists are comma-separated: n,w)"
    if len(parts) == 3 and not all(s.isdigit() for s in parts[2].split()):
        return "supporting IDs must be integers separated by spaces"
    return words_of(question), ([a for a in answer.split(",") if a] if split_answers else [answer])


def _skip(malformed: list[MalformedLine], bad: MalformedLine, strict: bool) -> None:
    if strict:
        raise CatbabiFormatError(str(bad))
    malformed.append(bad)


def _lines(path: Path):
    """(line number, text without its line end) of every non-blank line."""
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\r\n")
            if line.strip():
                yield number, line


def parse_babi_file(path: str | os.PathLike, task: int | None = None, split_answers: bool = False,
                    strict: bool = False) -> Parsed:
    """Stories of one bAbI task file; the task comes from the name (qa<N>_...) unless given."""
    path = Path(path)
    task = task_of(path) if task is None else task
    stories: list[Story] = []
    malformed: list[MalformedLine] = []
    for number, line in _lines(path):
        match = BABI_LINE.match(line)
        parsed = (_babi_text(match.group(2), split_answers)
                  if match else "expected 'ID text' (a number, a space, text)")
        if isinstance(parsed, str):
            _skip(malformed, MalformedLine(str(path), number, parsed, line), strict)
            continue
        assert match is not None  # parsed is a str where the line does not match
        if not stories or match.group(1) == "1":  # ID 1 starts a new story
            stories.append(Story(task, source=str(path), line=number))
        story, (words, answers) = stories[-1], parsed
        story.words.extend(words)
        story.answers.extend(range(len(story.words), len(story.words) + len(answers)))
        story.words.extend(answers)
    return Parsed(stories, malformed)


def parse_catbabi_file(path: str | os.PathLike, split_answers: bool = False, strict: bool = False) -> Parsed:
    """Stories of an already-converted catbAbI file: one story per line, 'task<TAB>words', answers after '?'."""
    path = Path(path)
    stories: list[Story] = []
    malformed: list[MalformedLine] = []
    for number, line in _lines(path):
        task, _, text = line.partition("\t")
        words = text.split()
        if not task.isdigit() or not words:
            problem = "expected 'task<TAB>words' with a numeric task"
        elif words[-1] == "?" or any(w == "?" and n in ("?", ".") for w, n in zip(words, words[1:])):
            problem = "a question mark is not followed by an answer"
        else:
            problem = None
        if problem is not None:
            _skip(malformed, MalformedLine(str(path), number, problem, line), strict)
            continue
        story = Story(int(task), source=str(path), line=number)
        for word, follows_question in zip(words, ["", *words[:-1]]):
            pieces = [p for p in word.split(",") if p] if split_answers and follows_question == "?" else [word]
            if follows_question == "?":
                story.answers.extend(range(len(story.words), len(story.words) + len(pieces)))
            story.words.extend(pieces)
        stories.append(story)
    return Parsed(stories, malformed)


def split_files(folder: str | os.PathLike, split: str) -> tuple[list[Path], str]:
    """The files of `split` in `folder` and their format ("babi" or "catbabi")."""
    folder = Path(folder)
    babi = re.compile(rf"^qa(\d+)_(?:.*_)?{re.escape(split)}\.txt$")
    found = sorted((p for p in folder.iterdir() if babi.match(p.name)),
                   key=lambda p: int(cast(re.Match, babi.match(p.name))[1]))
    if found:
        return found, "babi"
    converted = sorted(p for p in folder.glob(f"*{split}.txt") if p.name == f"{split}.txt" or
                       p.name.endswith(f"_{split}.txt"))
    if converted:
        return converted, "catbabi"
    raise FileNotFoundError(f"no {split} files in {folder}: expected qa<N>_[name_]{split}.txt (bAbI) or "
                            f"[name_]{split}.txt (converted catbAbI)")


def load_split(folder: str | os.PathLike, split: str, split_answers: bool = False, strict: bool = False) -> Parsed:
    """Every story of one split (train/valid/test) in a folder, tasks in order; warns if lines were skipped."""
    files, kind = split_files(folder, split)
    parse = parse_babi_file if kind == "babi" else parse_catbabi_file
    parts = [parse(path, split_answers=split_answers, strict=strict) for path in files]
    result = Parsed([s for p in parts for s in p.stories], [m for p in parts for m in p.malformed])
    if result.malformed:
        warnings.warn(f"catbAbI {split} in {folder}: {result.report()}", stacklevel=2)
    return result


@dataclass(frozen=True)
class Vocabulary:
    """Word-level vocabulary: the specials (<pad>=0, <eos>=1, <unk>=2), then words in sorted order."""

    words: tuple[str, ...]
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.words[: len(SPECIALS)] != SPECIALS or len(set(self.words)) != len(self.words):
            raise ValueError(f"a vocabulary starts with {SPECIALS} and has no duplicate words")
        object.__setattr__(self, "index", {w: i for i, w in enumerate(self.words)})

    @classmethod
    def build(cls, stories: Iterable[Story]) -> Vocabulary:
        seen = {w for story in stories for w in story.words}
        return cls(SPECIALS + tuple(sorted(seen - set(SPECIALS))))

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: Sequence[str]) -> np.ndarray:
        unk = self.index[UNK]
        return np.array([self.index.get(w, unk) for w in words], dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.words[int(i)] for i in ids]

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps({"format": VOCAB_FORMAT, "version": 1, "words": list(self.words)}) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        data = json.loads(Path(path).read_text())
        if data.get("format") != VOCAB_FORMAT:
            raise ValueError(f"{path} is not a {VOCAB_FORMAT} file")
        return cls(tuple(data["words"]))


@dataclass
class CatbabiStream:
    """The concatenated stream: token ids, which tokens are answers, and each token's task."""

    tokens: np.ndarray  # int32
    answer_mask: np.ndarray  # bool, True on answer tokens
    task_ids: np.ndarray  # int16, the task of the story each token belongs to

    def next_token(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(inputs, targets, target_is_answer, target_task) for next-token prediction over the stream."""
        return self.tokens[:-1], self.tokens[1:], self.answer_mask[1:], self.task_ids[1:]


def build_stream(stories: Sequence[Story], vocab: Vocabulary, shuffle_seed: int | None = None) -> CatbabiStream:
    """Stories concatenated ("<eos>" before each), in file order or shuffled with `shuffle_seed`."""
    order = range(len(stories)) if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(
        len(stories))
    tokens, mask, tasks = [], [], []
    eos = np.array([vocab.index[EOS]], dtype=np.int32)
    for i in order:
        story = stories[i]
        story_mask = np.zeros(len(story.words) + 1, dtype=bool)
        story_mask[np.asarray(story.answers, dtype=np.int64) + 1] = True
        tokens += [eos, vocab.encode(story.words)]
        mask.append(story_mask)
        tasks.append(np.full(len(story_mask), story.task, dtype=np.int16))
    if not tokens:
        return CatbabiStream(np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.int16))
    return CatbabiStream(np.concatenate(tokens), np.concatenate(mask), np.concatenate(tasks))


@functools.cache
def folder_vocabulary(folder: str, split_answers: bool):
    """The word vocabulary of every split present in `folder` (sorted: the same on every rank)."""
    stories = []
    for split in SPLITS:
        try:
            split_files(folder, split)
        except FileNotFoundError:
            continue
        stories += load_split(folder, split, split_answers).stories
    return Vocabulary.build(stories)


def split_windows(folder: str, split: str, split_answers: bool, seq_len: int, seed: int | None) -> np.ndarray:
    """(windows, 3, seq_len + 1) int64: token ids, answer marks (1 on an answer) and task numbers of
    consecutive windows of the split's stream; stories shuffled with `seed`, in file order if None."""
    stream = build_stream(load_split(folder, split, split_answers).stories, folder_vocabulary(folder, split_answers),
                          shuffle_seed=seed)
    count = (len(stream.tokens) - 1) // seq_len
    if count < 1:
        raise ValueError(f"catbAbI {split} in {folder}: {len(stream.tokens)} tokens do not fill one window of "
                         f"data.seq_len + 1 = {seq_len + 1}")
    rows = np.arange(count)[:, None] * seq_len + np.arange(seq_len + 1)
    channels = (stream.tokens, stream.answer_mask, stream.task_ids)
    return np.stack([np.asarray(c, dtype=np.int64)[rows] for c in channels], axis=1)


def per_task_accuracy(predictions: np.ndarray, targets: np.ndarray, answer_mask: np.ndarray,
                      task_ids: np.ndarray) -> dict[int, float]:
    """Accuracy on answer tokens, per task; arrays of one shape, aligned position by position.

    Tasks without answer tokens are absent.  Accepts numpy arrays or CPU tensors.
    """
    predictions, targets = np.asarray(predictions), np.asarray(targets)
    answer_mask, task_ids = np.asarray(answer_mask, dtype=bool), np.asarray(task_ids)
    if not predictions.shape == targets.shape == answer_mask.shape == task_ids.shape:
        raise ValueError(f"shapes differ: predictions {predictions.shape}, targets {targets.shape}, "
                         f"answer_mask {answer_mask.shape}, task_ids {task_ids.shape}")
    tasks = task_ids[answer_mask].astype(np.int64)
    if tasks.size and tasks.min() < 0:
        raise ValueError("task ids must be non-negative")
    correct = (predictions[answer_mask] == targets[answer_mask]).astype(np.float64)
    counts = np.bincount(tasks)
    hits = np.bincount(tasks, weights=correct, minlength=len(counts))
    return {int(t): float(hits[t] / counts[t]) for t in np.flatnonzero(counts)}
