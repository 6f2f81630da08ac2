"""The Cayley tables: sizes, closure, identity, associativity, and the aperiodic monoid's properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from data_pipeline.synthetic.algebra import ALGEBRAS, APERIODIC_NAMES, APERIODIC_TABLE, get_algebra

# The paper's four-element monoid written by names, row · column.
NAMED_TABLE = {
    "E": "EABX",
    "A": "AXXX",
    "B": "BABX",
    "X": "XXXX",
}
# The same monoid as 2x2 0/1 matrices under matrix product: E = I, A = E12, B = E11, X = 0.
MATRICES = {"E": ((1, 0), (0, 1)), "A": ((0, 1), (0, 0)), "B": ((1, 0), (0, 0)), "X": ((0, 0), (0, 0))}


def matmul(a, b):
    return tuple(tuple(sum(a[i][k] * b[k][j] for k in range(2)) for j in range(2)) for i in range(2))


def test_aperiodic_table_is_the_papers_monoid():
    for row, left in enumerate(APERIODIC_NAMES):
        assert "".join(APERIODIC_NAMES[v] for v in APERIODIC_TABLE[row]) == NAMED_TABLE[left]


def test_aperiodic_table_is_the_matrix_monoid():
    by_matrix = {m: name for name, m in MATRICES.items()}
    for left, right in itertools.product(APERIODIC_NAMES, repeat=2):
        product = APERIODIC_NAMES[APERIODIC_TABLE[APERIODIC_NAMES.index(left), APERIODIC_NAMES.index(right)]]
        assert by_matrix[matmul(MATRICES[left], MATRICES[right])] == product


def powers(table: np.ndarray, x: int, count: int) -> list[int]:
    out = [x]
    for _ in range(count - 1):
        out.append(int(table[out[-1], x]))
    return out


def test_aperiodic_monoid_properties():
    table = APERIODIC_TABLE
    n = table.shape[0]
    assert np.array_equal(table[0], np.arange(n)) and np.array_equal(table[:, 0], np.arange(n))  # E is identity
    assert (table[3] == 3).all() and (table[:, 3] == 3).all()  # X is a zero
    a, b, c = np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij")
    assert np.array_equal(table[table[a, b], c], table[a, table[b, c]])
    for x in range(n):  # aperiodic: x^k = x^(k+1) for some k (here k = 2 works for all)
        p = powers(table, x, 4)
        assert any(p[k] == p[k + 1] for k in range(3)), APERIODIC_NAMES[x]
        assert p[1] == p[2]
    # not a group: A has no inverse (nothing times A gives E)
    assert 0 not in table[1] and 0 not in table[:, 1]


@pytest.mark.parametrize("name,size,group_size", [("S5", 120, 120), ("A5", 60, 60), ("Ma_A5", 240, 60),
                                                  ("Ma_S5", 480, 120)])
def test_sizes_identity_and_closure(name, size, group_size):
    algebra = get_algebra(name)
    assert algebra.size == size and algebra.group_size == group_size
    table = algebra.table
    assert table.shape == (size, size) and table.min() >= 0 and table.max() < size
    assert np.array_equal(table[0], np.arange(size)) and np.array_equal(table[:, 0], np.arange(size))


@pytest.mark.parametrize("name", ["S5", "A5"])
def test_groups_are_latin_squares(name):
    table = get_algebra(name).table
    n = table.shape[0]
    assert all(len(set(row)) == n for row in table.tolist())
    assert all(len(set(col)) == n for col in table.T.tolist())


@pytest.mark.parametrize("name", ["S5", "A5", "Ma_A5"])
def test_associative(name):
    table = get_algebra(name).table.astype(np.int64)
    n = table.shape[0]
    ab = table[:, :, None]  # (a · b), broadcast over c
    left = table[ab, np.arange(n)[None, None, :]]
    right = table[np.arange(n)[:, None, None], table[None, :, :]]
    assert np.array_equal(left, right)


def test_a5_is_the_even_half_of_s5():
    s5, a5 = get_algebra("S5").table, get_algebra("A5").table
    perms = list(itertools.permutations(range(5)))
    even = [i for i, p in enumerate(perms) if sum(p[i] > p[j] for i, j in itertools.combinations(range(5), 2)) % 2 == 0]
    assert len(even) == 60
    index_in_a5 = {s5_id: k for k, s5_id in enumerate(even)}
    for x, y in itertools.product(range(60), repeat=2):
        assert index_in_a5[int(s5[even[x], even[y]])] == a5[x, y]


def test_unknown_algebra():
    assert "S5" in ALGEBRAS
    with pytest.raises(ValueError, match="unknown algebra"):
        get_algebra("S6")


@pytest.mark.parametrize("m", [2, 3, 7])
def test_cyclic_groups_add_mod_m(m):
    """Z_m from first principles: the residues under addition; Z2 is parity."""
    algebra = get_algebra(f"Z{m}")
    assert algebra.size == algebra.group_size == m and algebra.monoid_size == 1
    for a, b in itertools.product(range(m), repeat=2):
        assert algebra.table[a, b] == (a + b) % m


@pytest.mark.parametrize("name,degree,even", [("S3", 3, False), ("A4", 4, True)])
def test_small_permutation_groups_compose_as_a_then_b(name, degree, even):
    """Every product composed by hand from the image tuples: (a · b)[i] = b[a[i]], ids in
    lexicographic order of the tuples (even ones only for A_n)."""
    perms = [p for p in itertools.permutations(range(degree))
             if not even or sum(p[i] > p[j] for i, j in itertools.combinations(range(degree), 2)) % 2 == 0]
    table = get_algebra(name).table
    assert table.shape == (len(perms), len(perms)) and perms[0] == tuple(range(degree))
    for x, y in itertools.product(range(len(perms)), repeat=2):
        composed = tuple(perms[y][perms[x][i]] for i in range(degree))
        assert perms[int(table[x, y])] == composed
    assert any(table[x, y] != table[y, x] for x, y in itertools.product(range(len(perms)), repeat=2))  # non-abelian


def test_aperiodic_monoid_times_a_small_group():
    algebra, group = get_algebra("Ma_S3"), get_algebra("S3").table
    assert algebra.size == 24 and algebra.group_size == 6
    for a, b in itertools.product(range(24), repeat=2):
        m, g = divmod(int(algebra.table[a, b]), 6)
        assert m == APERIODIC_TABLE[a // 6, b // 6] and g == group[a % 6, b % 6]


@pytest.mark.parametrize("name", ["Z1", "Z", "S4x", "Ma_Q8", "Z5000"])
def test_unknown_names_are_refused(name):
    with pytest.raises(ValueError, match="unknown algebra group"):
        get_algebra(name)
