"""Word problems: labels against a from-first-principles composition, the p distribution, seeding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from data_pipeline.synthetic.algebra import get_algebra
from data_pipeline.synthetic.word_problem import (
    WordProblemBatches,
    WordProblemSpec,
    generate,
    generate_words,
    prefix_products,
)

PERMS = list(itertools.permutations(range(5)))  # the documented order: lexicographic image tuples
EVEN = [p for p in PERMS if sum(p[i] > p[j] for i, j in itertools.combinations(range(5), 2)) % 2 == 0]
# Mᵃ as 2x2 0/1 matrices (E = I, A = E12, B = E11, X = 0), so the reference never reads the table.
MONOID = [((1, 0), (0, 1)), ((0, 1), (0, 0)), ((1, 0), (0, 0)), ((0, 0), (0, 0))]


def then(a: tuple, b: tuple) -> tuple:
    """Permutation a, then b: i -> b[a[i]]."""
    return tuple(b[a[i]] for i in range(len(a)))


def matmul(a: tuple, b: tuple) -> tuple:
    return tuple(tuple(sum(a[i][k] * b[k][j] for k in range(2)) for j in range(2)) for i in range(2))


def decode(group: str, token: int) -> tuple:
    """Token id -> (monoid matrix, permutation tuple) straight from the documented encoding."""
    perms = PERMS if group.endswith("S5") else EVEN
    monoid, g = divmod(int(token), len(perms))
    return (MONOID[monoid] if group.startswith("Ma_") else None), perms[g]


def reference_labels(group: str, word: np.ndarray) -> list[tuple]:
    """Prefix products composed left to right with a plain loop."""
    out, state = [], None
    for token in word:
        m, g = decode(group, token)
        if state is None:
            state = (m, g)
        else:
            state = (None if m is None else matmul(state[0], m), then(state[1], g))
        out.append(state)
    return out


@pytest.mark.parametrize("group", ["S5", "A5", "Ma_A5", "Ma_S5"])
@pytest.mark.parametrize("p", [None, 0.3])
def test_labels_match_reference_composition(group, p):
    inputs, labels = generate(group, num=12, length=37, p=p, seed=7)
    assert inputs.shape == labels.shape == (12, 37)
    assert inputs.dtype == labels.dtype == np.int16
    for word, label in zip(inputs, labels):
        assert [decode(group, t) for t in label] == reference_labels(group, word)


def test_labels_are_aligned_and_first_label_is_first_input():
    inputs, labels = generate("S5", num=5, length=9, p=None, seed=1)
    table = get_algebra("S5").table
    assert np.array_equal(labels[:, 0], inputs[:, 0])
    for t in range(1, 9):
        assert np.array_equal(labels[:, t], table[labels[:, t - 1], inputs[:, t]])


@pytest.mark.parametrize("length", [1, 2, 3, 64, 100])
def test_scan_matches_sequential_recurrence(length):
    rng = np.random.default_rng(length)
    table = get_algebra("Ma_A5").table
    words = rng.integers(0, 240, size=(6, length))
    expected = words.copy()
    for t in range(1, length):
        expected[:, t] = table[expected[:, t - 1], words[:, t]]
    assert np.array_equal(prefix_products(words, table), expected)


def test_scan_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match=r"\[0, 60\)"):
        prefix_products(np.array([[0, 60]]), get_algebra("A5").table)


def within_sigma(count: int, n: int, q: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * q) <= sigmas * math.sqrt(n * q * (1 - q))


@pytest.mark.parametrize("group", ["Ma_A5", "S5"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_hard_token_share_is_p(group, p):
    inputs, _ = generate(group, num=400, length=256, p=p, seed=123)  # 102 400 tokens
    algebra = get_algebra(group)
    n = inputs.size
    group_part = algebra.group_part(inputs)
    assert within_sigma(int((group_part != 0).sum()), n, p)
    hard = group_part[group_part != 0]  # non-identity elements are uniform over G minus e
    counts = np.bincount(hard, minlength=algebra.group_size)[1:]
    q = 1 / (algebra.group_size - 1)
    assert all(within_sigma(int(c), hard.size, q) for c in counts)


def test_monoid_part_is_uniform_and_independent_of_p():
    inputs, _ = generate("Ma_A5", num=400, length=256, p=0.1, seed=5)
    monoid = get_algebra("Ma_A5").monoid_part(inputs)
    assert all(within_sigma(int(c), inputs.size, 0.25) for c in np.bincount(monoid.ravel(), minlength=4))


def test_p_none_is_uniform_over_the_group_and_extremes():
    inputs, _ = generate("A5", num=200, length=256, p=None, seed=9)
    assert within_sigma(int((inputs == 0).sum()), inputs.size, 1 / 60)
    assert (get_algebra("Ma_A5").group_part(generate("Ma_A5", 20, 50, 0.0, 1)[0]) == 0).all()
    assert (get_algebra("Ma_A5").group_part(generate("Ma_A5", 20, 50, 1.0, 1)[0]) != 0).all()


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = (generate("Ma_A5", 16, 64, 0.1, seed) for seed in (3, 3, 4))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_spec_validation():
    with pytest.raises(ValueError, match="unknown algebra group"):
        WordProblemSpec("Z1", 10)
    with pytest.raises(ValueError, match="p must be"):
        WordProblemSpec("A5", 10, p=1.5)
    with pytest.raises(ValueError, match="length"):
        WordProblemSpec("A5", 0)
    assert WordProblemSpec("Ma_S5", 8).vocab_size == 480


def test_batches_are_keyed_by_rank_and_index_and_resume():
    spec = WordProblemSpec("Ma_A5", 32, p=0.1, seed=11)
    rank0 = WordProblemBatches(spec, batch_size=4, rank=0)
    first = [next(rank0) for _ in range(3)]
    again = [next(WordProblemBatches(spec, batch_size=4, rank=0)) for _ in range(1)]
    assert np.array_equal(first[0][0], again[0][0])
    assert not np.array_equal(first[0][0], first[1][0])
    other_rank = next(WordProblemBatches(spec, batch_size=4, rank=1))
    assert not np.array_equal(first[0][0], other_rank[0])
    resumed = WordProblemBatches(spec, batch_size=4, rank=0)
    resumed.load_state_dict({"next_batch": 2, "batch_size": 4})
    inputs, labels = next(resumed)
    assert np.array_equal(inputs, first[2][0]) and np.array_equal(labels, first[2][1])
    assert np.array_equal(labels, prefix_products(inputs, spec.algebra.table))
    assert rank0.state_dict()["next_batch"] == 3
    with pytest.raises(ValueError, match="batches of"):
        resumed.load_state_dict({"next_batch": 2, "batch_size": 8})


def test_generate_words_uses_the_given_generator():
    spec = WordProblemSpec("S5", 16, seed=0)
    x1, _ = generate_words(spec, 3, np.random.default_rng(1))
    x2, _ = generate_words(spec, 3, np.random.default_rng(1))
    assert np.array_equal(x1, x2)
