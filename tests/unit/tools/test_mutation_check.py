"""tools/dev/mutation_check.py: every break still applies to the source (its snippet occurs exactly once
and changes it), so the check cannot rot into breaks that no longer break anything. Running the
breaks' tests is the tool's (several minutes), not the suite's."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT
from support.tools import load_tool


def mutation_check_tool():
    return load_tool("mutation_check")


def test_every_break_applies_to_the_source_and_names_tests_that_exist():
    tool = mutation_check_tool()
    assert len(tool.BREAKS) >= 15 and len({b.name for b in tool.BREAKS}) == len(tool.BREAKS)
    for b in tool.BREAKS:
        assert tool.applies(b) is None, f"{b.name}: {tool.applies(b)}"
        assert b.new != b.old and b.what
        for test in b.tests:
            assert (ROOT / test.split("::")[0]).is_file(), f"{b.name}: no test file {test}"
            if "::" in test:
                function = test.split("::")[1].split("[")[0]  # a node id may name one parametrisation
                assert f"def {function}(" in (ROOT / test.split("::")[0]).read_text(), test


@pytest.mark.processes
def test_a_break_that_no_longer_applies_is_an_error_in_the_table(tmp_path):
    listed = subprocess.run([sys.executable, "tools/dev/mutation_check.py", "--list"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and "solver-stop-rule" in listed.stdout
    tool = mutation_check_tool()
    gone = tool.Break("gone", "implicit_megatron/implicit/phantom.py", "no such line", "x", ("tests",), "a test")
    assert tool.applies(gone) == "its snippet occurs 0 times in implicit_megatron/implicit/phantom.py"
