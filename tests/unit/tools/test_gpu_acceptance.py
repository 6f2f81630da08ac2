"""tools/node/gpu_acceptance.py: the GPU node's acceptance run fits its budget, and its plumbing
(steps under timeouts, logs, the report written after each step, the exit status) works, run dry on
the CPU at tiny shapes."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from support.processes import ROOT
from support.tools import load_tool

DEVICE_CALL_S = 540  # one command on a lent GPU machine, with room left for a rerun of a part


def acceptance_tool():
    return load_tool("gpu_acceptance")


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/node/gpu_acceptance.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_the_steps_fit_the_budget_and_the_budget_fits_one_device_call():
    tool = acceptance_tool()
    assert [s.name for s in tool.STEPS] == ["checks", "speed-mamba2", "speed-llama", "generate"]
    assert sum(s.timeout_s for s in tool.STEPS) <= tool.BUDGET_S <= DEVICE_CALL_S - 30  # the kit's set-up
    for step in tool.STEPS:  # every step's script exists, on the GPU and dry alike
        assert (ROOT / step.argv[0]).is_file() and (ROOT / step.dry_argv[0]).is_file(), step.name
        assert "--device" not in step.argv or step.argv[step.argv.index("--device") + 1] == "cuda", step.name


@pytest.mark.processes
def test_a_dry_run_reports_every_step(tmp_path):
    result = run("--out", str(tmp_path), "--dry")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    report = (tmp_path / "report.md").read_text()
    for row in ("| checks | no GPU |", "| speed-mamba2 | ok |", "| speed-llama | ok |", "| generate | ok |"):
        assert row in report, report
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00-checks.log", "01-speed-mamba2.log", "02-speed-llama.log", "03-generate.log", "report.md"]
    assert "(4+1)" in (tmp_path / "01-speed-mamba2.log").read_text()
    assert "[speed-llama] " in result.stdout  # printed as it goes


@pytest.mark.processes
def test_a_step_the_budget_cannot_cover_is_skipped_and_fails_the_run(tmp_path):
    result = run("--out", str(tmp_path), "--dry", "--budget", "100", "--only", "checks,generate")
    assert result.returncode == 1
    report = (tmp_path / "report.md").read_text()
    assert "| checks | skipped: 100 s left of the budget |" in report and "| generate | ok |" in report, report


@pytest.mark.processes
def test_a_step_past_its_timeout_is_killed_and_named(tmp_path):
    tool = acceptance_tool()
    step = tool.Step("sleeper", 2, ("-c", "x"), ("-c", "import time; print('started', flush=True); time.sleep(60)"))
    start = time.monotonic()
    outcome = tool.run_step(step, True, tmp_path / "sleeper.log")
    assert outcome.status == "timeout" and outcome.tail == ["started"]
    assert time.monotonic() - start < 20
    log = (tmp_path / "sleeper.log").read_text()
    assert log.endswith("killed after 2 s\n")
    assert re.search(r"^ +0\.\d s  started$", log, re.MULTILINE), log  # when, within the step, it was said


@pytest.mark.processes
def test_on_a_gpu_node_a_missing_gpu_fails_the_run(tmp_path):
    result = run("--out", str(tmp_path), "--only", "checks")
    assert result.returncode == 1
    assert "| checks | no GPU |" in (tmp_path / "report.md").read_text()
    assert "0 of 1 steps passed" in result.stdout
