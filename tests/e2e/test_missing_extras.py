"""The evaluation commands, where the `eval` extra's lm-eval does not import (not installed, or one of
its own dependencies missing): one line naming the extra and the command, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT, child_env


@pytest.fixture
def without_lm_eval(tmp_path) -> dict[str, str]:
    """An environment where `import lm_eval` fails as it does when httpx is missing."""
    shadow = tmp_path / "shadow" / "lm_eval"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'httpx\'", name="httpx")\n')
    return child_env(PYTHONPATH=str(shadow.parent))


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "implicit_megatron.lm_eval", "--model", "hf", "--tasks", "lambada_openai"],
    [sys.executable, "tools/evaluate.py", "runs/none/export", "--tasks", "ppl,lm_eval"],
], ids=["lm_eval", "evaluate"])
def test_a_missing_eval_extra_is_one_line(command, without_lm_eval):
    result = subprocess.run(command, cwd=ROOT, env=without_lm_eval, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "needs lm-eval, which does not import here (No module named 'httpx')" in lines[0]
    assert lines[0].endswith("install the 'eval' extra: bash scripts/setup.sh eval (or pip install -e .[eval])")
