"""The suite's tiers (tests/conftest.py): `--quick` leaves out what starts processes, is slow or runs
the kernels (the kernel tier), and a
test that starts a process without saying so fails by name, so the quick tier stays process-free."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
TESTS = '''
import multiprocessing, subprocess
import pytest

def test_unmarked_starts_a_process():
    subprocess.run(["true"], check=True)

def test_unmarked_starts_a_worker():
    multiprocessing.get_context("fork").Process(target=print).start()

@pytest.mark.processes
def test_marked_starts_a_process():
    subprocess.run(["true"], check=True)

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.kernels
def test_kernels():
    pass

def test_plain():
    pass
'''


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_example=TESTS)
    return pytester


@pytest.mark.processes  # its inner tests start processes; its own guard must not mask theirs
def test_a_process_started_by_an_unmarked_test_fails_naming_the_mark(suite):
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly")
    result.assert_outcomes(passed=4, failed=2)
    out = result.stdout.str()
    assert "UnmarkedProcess: this test starts a process (subprocess: ['true']) but is not marked" in out
    assert "UnmarkedProcess: this test starts a process (multiprocessing: <built-in function print>)" in out
    assert "@pytest.mark.processes" in out


@pytest.mark.processes
def test_quick_leaves_out_processes_slow_tests_and_the_kernel_tier(suite):
    result = suite.runpytest_inprocess("--quick", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
                                       "-k", "not unmarked")
    result.assert_outcomes(passed=1, deselected=5)


class _Item:
    """What conftest.start_order reads of a collected test: its file and its marks."""

    def __init__(self, name: str, *marks: str) -> None:
        self.path, self.name, self.marks = CONFTEST.parent / "unit" / name.split(":")[0], name, marks

    def get_closest_marker(self, mark: str):
        return mark if mark in self.marks else None


def test_long_modules_start_first_and_are_dealt_among_the_workers_shares():
    """conftest.start_order: worksteal hands each worker an equal contiguous share (here 6 and 7 of 13
    tests); each share starts with a long module, whole, and ends with short in-process tests."""
    spec = importlib.util.spec_from_file_location("suite_conftest", CONFTEST)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    a = [_Item(f"test_a.py:{i}") for i in range(10)]
    b = [_Item("test_b.py:slow", "slow"), _Item("test_b.py:plain")]
    c = [_Item("test_c.py:launch", "processes")]

    def order(workers: int) -> list[str]:
        return [item.name for item in conftest.start_order([*a, *b, *c], workers)]

    names = [item.name for item in a]
    assert order(1) == ["test_b.py:slow", "test_b.py:plain", "test_c.py:launch", *names]
    assert order(2) == ["test_b.py:slow", "test_b.py:plain", *names[:4], "test_c.py:launch", *names[4:]]
