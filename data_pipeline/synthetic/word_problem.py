"""Word problems over S5, A5 and Mᵃ × G (the paper's state-tracking task, Sec. 4 and App. D).

A sample is a word x_1 ... x_L of token ids (see `algebra` for the encoding) and its labels, the
prefix products at every position, aligned with the inputs (no shift):

    labels[t] = x_1 · x_2 · ... · x_{t+1}     (0-based t: the state after consuming inputs[0..t])

with `·` the table's product ("left, then right"), composed left to right.  The prefix products are
computed for a whole batch at once by a Hillis-Steele scan: log2(L) rounds of Cayley-table lookups
over numpy arrays, which is valid because the product is associative.

Sampling, with p the probability that a token's group part is not the identity:

- p = None: the group part is uniform over all of G (identity included);
- p = float in [0, 1]: the group part is the identity with probability 1 - p, else uniform over
  G minus the identity (each non-identity element with probability p / (|G| - 1)), as the paper
  defines its distributions (Sec. 4, "Languages with Sparse Non-Solvable Transitions").  p = 0
  gives only simple tokens, p = 0.5 is the paper's out-of-distribution evaluation.
- The Mᵃ part of Mᵃ × G tokens is uniform over its four elements, independently of the group part
  (the paper: "an element of Mᵃ is sampled uniformly at each step").  S5 and A5 have no Mᵃ part.

The paper's appendix once calls p a "sparsity" (p = 0.9 meaning 10 % hard tokens); the main text's
definition above is the one used here, so larger p means more hard tokens.

Randomness: numpy's PCG64 seeded through `SeedSequence`; the same seed gives the same data on every
machine.  `WordProblemBatches` keys each batch by (seed, rank, batch index), so ranks are
independent and a restart only needs the batch index.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from data_pipeline.synthetic.algebra import Algebra, get_algebra

TOKEN_DTYPE = np.int16  # every algebra here has at most 480 elements
STREAM_KEY = 1  # spawn-key tag of on-the-fly batches (shards use `SHARD_KEY` in word_problem_shards)


@dataclass(frozen=True)
class WordProblemSpec:
    """What a set of word problems is: algebra, word length, hard-token share p and seed."""

    group: str  # an algebra name (algebra.get_algebra): "S5", "A5", "Ma_A5", "S3", "Z2", ...
    length: int
    p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        get_algebra(self.group)  # ValueError for an unknown name
        if self.length < 1:
            raise ValueError(f"length must be positive, got {self.length}")
        if self.p is not None and not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be in [0, 1] or None, got {self.p}")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")

    @property
    def algebra(self) -> Algebra:
        return get_algebra(self.group)

    @property
    def vocab_size(self) -> int:
        return self.algebra.size


def from_released_p(p: float | None, group_size: int) -> float | None:
    """The released data script's p (the probability that a group part is forced to the identity;
    otherwise it is uniform over G, identity included) as ours (the probability of a non-identity
    group part): both give the same distribution. None (uniform over G) stays None."""
    return None if p is None else (1.0 - p) * (group_size - 1) / group_size


def sample_words(algebra: Algebra, num: int, length: int, p: float | None, rng: np.random.Generator) -> np.ndarray:
    """(num, length) token ids drawn from the distribution described in the module doc."""
    shape = (num, length)
    n_g = algebra.group_size
    if p is None:
        group = rng.integers(0, n_g, size=shape, dtype=np.int32)
    else:
        hard = rng.random(size=shape) < p
        group = rng.integers(1, n_g, size=shape, dtype=np.int32)
        group *= hard
    if algebra.monoid_size > 1:
        monoid = rng.integers(0, algebra.monoid_size, size=shape, dtype=np.int32)
        group += monoid * n_g
    return group


def prefix_products(words: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Inclusive prefix products along the last axis, y[t] = x[0] · ... · x[t] (Hillis-Steele scan)."""
    size = table.shape[0]
    flat = np.ascontiguousarray(table, dtype=np.int32).ravel()
    y = np.array(words, dtype=np.int32, copy=True)
    if y.size and (y.min() < 0 or y.max() >= size):
        raise ValueError(f"token ids must lie in [0, {size}), got [{y.min()}, {y.max()}]")
    scratch = np.empty_like(y)
    length = y.shape[-1]
    shift = 1
    while shift < length:
        left, right, out = y[..., :-shift], y[..., shift:], scratch[..., shift:]
        np.multiply(left, size, out=out)  # out = left * size + right, the flat table index
        np.add(out, right, out=out)
        # y[t] <- y[t - shift] · y[t], the earlier factor on the left; "clip" skips a buffered copy
        np.take(flat, out, out=right, mode="clip")
        shift *= 2
    return y


def generate_words(spec: WordProblemSpec, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`num` words of `spec` from an explicit generator (the spec's seed is not used)."""
    if num < 0:
        raise ValueError(f"num must be non-negative, got {num}")
    algebra = spec.algebra
    words = sample_words(algebra, num, spec.length, spec.p, rng)
    labels = prefix_products(words, algebra.table)
    return words.astype(TOKEN_DTYPE), labels.astype(TOKEN_DTYPE)


def generate(group: str, num: int, length: int, p: float | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels), both int16 of shape (num, length); labels[:, t] = inputs[:, 0] · ... · inputs[:, t].

    `p` is the probability that a token's group part is not the identity (None: uniform over G);
    see the module doc.  Same arguments, same arrays.
    """
    spec = WordProblemSpec(group, length, p, seed)
    return generate_words(spec, num, np.random.default_rng(np.random.SeedSequence(seed)))


def batch_rng(seed: int, rank: int, batch: int) -> np.random.Generator:
    """The generator of one on-the-fly batch: independent across seeds, ranks and batch indices."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(STREAM_KEY, rank, batch))))


class WordProblemBatches:
    """Infinite (inputs, labels) batches of `batch_size` words for one rank, made on the fly.

    Batch k of rank r depends only on (spec, batch_size, r, k): resume with `start_batch`, and
    give every data-parallel rank its own `rank` so that ranks never see the same words.
    """

    def __init__(self, spec: WordProblemSpec, batch_size: int, rank: int = 0, start_batch: int = 0) -> None:
        if batch_size < 1 or rank < 0 or start_batch < 0:
            raise ValueError(f"batch_size must be positive and rank, start_batch non-negative, got "
                             f"{batch_size}, {rank}, {start_batch}")
        self.spec, self.batch_size, self.rank, self.next_batch = spec, batch_size, rank, start_batch

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        rng = batch_rng(self.spec.seed, self.rank, self.next_batch)
        self.next_batch += 1
        return generate_words(self.spec, self.batch_size, rng)

    def state_dict(self) -> dict[str, int]:
        return {"next_batch": self.next_batch, "rank": self.rank, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("batch_size", self.batch_size) != self.batch_size:
            raise ValueError(f"the saved position counts batches of {state['batch_size']} words, this iterator "
                             f"makes batches of {self.batch_size}")
        self.next_batch = int(state["next_batch"])
