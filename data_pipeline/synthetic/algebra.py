"""The finite monoids of the word problems, as Cayley tables over integer token ids.

Encoding (fixed; shards written with it record `ENCODING_VERSION`):

- S5: the 120 permutations of (0, 1, 2, 3, 4), as image tuples `perm[i] = image of i`, numbered in
  lexicographic order of those tuples (`itertools.permutations(range(5))`); id 0 is the identity.
- A5: the 60 even permutations, numbered 0..59 in the same lexicographic order (id 0: identity).
- Product convention, for every algebra: `table[a, b] = a · b` = "a, then b".  For permutations
  `(a · b)[i] = b[a[i]]` (apply a first, then b), so a word's prefix product x_1 · x_2 · ... · x_t
  is the permutation obtained by applying x_1 first and x_t last.
- Mᵃ: the four-element aperiodic monoid of the paper (Sec. 4 and App. D, "a simple aperiodic monoid
  with four elements"; its table is the one in the authors' released state-tracking data script).
  Ids E=0, A=1, B=2, X=3; E is the identity and X absorbs everything.  It is the monoid of the 2x2
  0/1 matrices {I, E12, E11, 0} under matrix product (A = E12, B = E11), which makes associativity
  evident; x² = x³ for every x (aperiodic):

        ·  | E  A  B  X
        ---+-----------
        E  | E  A  B  X
        A  | A  X  X  X
        B  | B  A  B  X
        X  | X  X  X  X

- Mᵃ × G (G any group below): pairs (a, g) with id `a * |G| + g`, multiplied componentwise; id 0 is
  the identity (E, e).
- S3 (the smallest non-abelian group, solvable) and A4: numbered as S5 and A5, on (0, 1, 2) and
  (0, 1, 2, 3).
- Z<m> (m >= 2, e.g. Z2 = parity): the residues 0..m-1 under addition mod m; id 0 is the identity.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

ENCODING_VERSION = 1
ALGEBRAS = ("S5", "A5", "Ma_A5", "Ma_S5", "S3", "A4", "Z2", "Z3", "Ma_S3", "Ma_Z2")  # Z<m>: any m >= 2
GROUPS = {"S3": (3, False), "S5": (5, False), "A4": (4, True), "A5": (5, True)}  # name -> (degree, even only)
APERIODIC_NAMES = ("E", "A", "B", "X")
APERIODIC_TABLE = np.array([[0, 1, 2, 3],
                            [1, 3, 3, 3],
                            [2, 1, 2, 3],
                            [3, 3, 3, 3]], dtype=np.int32)


@dataclass(frozen=True)
class Algebra:
    """A finite monoid Mᵃ-part × group-part with its Cayley table (`table[a, b] = a · b`).

    Pure groups have `monoid_size == 1`; every id splits as `monoid_part * group_size + group_part`.
    The identity is id 0 and the group identity is group part 0.
    """

    name: str
    table: np.ndarray  # (size, size) int32
    group_size: int
    monoid_size: int

    @property
    def size(self) -> int:
        return self.group_size * self.monoid_size

    def group_part(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids) % self.group_size

    def monoid_part(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids) // self.group_size


def permutations(n: int = 5) -> list[tuple[int, ...]]:
    """S_n in the encoding's order: image tuples, lexicographic."""
    return list(itertools.permutations(range(n)))


def is_even(perm: tuple[int, ...]) -> bool:
    inversions = sum(1 for i, j in itertools.combinations(range(len(perm)), 2) if perm[i] > perm[j])
    return inversions % 2 == 0


def even_permutations(n: int = 5) -> list[tuple[int, ...]]:
    """A_n in the encoding's order (lexicographic among the even permutations)."""
    return [p for p in permutations(n) if is_even(p)]


def permutation_table(perms: list[tuple[int, ...]]) -> np.ndarray:
    """Cayley table of a permutation group, `(a · b)[i] = b[a[i]]`, built with array indexing."""
    arr = np.array(perms, dtype=np.int64)  # (n, degree)
    degree = arr.shape[1]
    products = np.take_along_axis(arr[None, :, :], arr[:, None, :], axis=2)  # [a, b, i] = b[a[i]]
    weights = degree ** np.arange(degree - 1, -1, -1)  # a base-`degree` code that is unique per tuple
    codes = arr @ weights
    order = np.argsort(codes)
    found = order[np.searchsorted(codes, products @ weights, sorter=order)]
    if not np.array_equal(codes[found], products @ weights):
        raise ValueError("the permutations are not closed under composition")
    return found.astype(np.int32)


def cyclic_table(m: int) -> np.ndarray:
    """Cayley table of Z_m: `(a + b) mod m`."""
    ids = np.arange(m, dtype=np.int64)
    return ((ids[:, None] + ids[None, :]) % m).astype(np.int32)


def group_table(name: str) -> np.ndarray:
    """The Cayley table of one of `GROUPS` or of Z<m>; ValueError naming the known ones otherwise."""
    if name in GROUPS:
        degree, even = GROUPS[name]
        return permutation_table(even_permutations(degree) if even else permutations(degree))
    if name.startswith("Z") and name[1:].isdigit() and 2 <= int(name[1:]) <= 4096:
        return cyclic_table(int(name[1:]))
    raise ValueError(f"unknown algebra group {name!r}; expected one of {sorted(GROUPS)} or Z<m> (2 <= m <= 4096), "
                     "optionally as Ma_<group>")


def direct_product(monoid: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Cayley table of M × G with ids `m * |G| + g`, multiplied componentwise."""
    n_g = group.shape[0]
    table = monoid[:, None, :, None] * n_g + group[None, :, None, :]  # [m1, g1, m2, g2]
    return table.reshape(monoid.shape[0] * n_g, monoid.shape[0] * n_g).astype(np.int32)


@functools.cache
def get_algebra(name: str) -> Algebra:
    """A group of `GROUPS`, Z<m>, or Mᵃ × one of them (`Ma_<group>`); its table computed once per process."""
    group_name = name.removeprefix("Ma_")
    group = group_table(group_name)
    monoid = APERIODIC_TABLE if name.startswith("Ma_") else np.zeros((1, 1), dtype=np.int32)
    table = direct_product(monoid, group)
    table.flags.writeable = False  # shared by every caller in the process
    return Algebra(name, table, group.shape[0], monoid.shape[0])
