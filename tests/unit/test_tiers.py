"""The suite's tiers (tests/conftest.py): `--quick` leaves out what starts processes or is slow, and a
test that starts a process without saying so fails by name, so the quick tier stays process-free."""

from __future__ import annotations

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
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "UnmarkedProcess: this test starts a process (subprocess: ['true']) but is not marked" in out
    assert "UnmarkedProcess: this test starts a process (multiprocessing: <built-in function print>)" in out
    assert "@pytest.mark.processes" in out


@pytest.mark.processes
def test_quick_leaves_out_processes_and_slow_tests(suite):
    result = suite.runpytest_inprocess("--quick", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
                                       "-k", "not unmarked")
    result.assert_outcomes(passed=1, deselected=4)


class _Workers:
    """As pytest-xdist tells each of its workers how many there are."""

    def __init__(self, count: int) -> None:
        self.count = count

    def pytest_configure(self, config):
        config.workerinput = {"workercount": self.count}


def test_long_modules_start_first_and_are_dealt_among_the_workers_shares(pytester):
    """conftest.start_order: worksteal hands each worker an equal contiguous share (here 6 and 7 of 13
    tests); each share starts with a long module, whole, and ends with short in-process tests."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_a="\n".join(f"def test_{i}(): pass" for i in range(10)),
                        test_b="import pytest\n@pytest.mark.slow\ndef test_slow(): pass\ndef test_plain(): pass",
                        test_c="import pytest\n@pytest.mark.processes\ndef test_launch(): pass")

    def order(workers: int) -> list[str]:
        result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                                              plugins=[_Workers(workers)])
        return [line.replace(".py::", ":") for line in result.stdout.lines if "::" in line]

    a = [f"test_a:test_{i}" for i in range(10)]
    assert order(1) == ["test_b:test_slow", "test_b:test_plain", "test_c:test_launch", *a]
    assert order(2) == ["test_b:test_slow", "test_b:test_plain", *a[:4], "test_c:test_launch", *a[4:]]
