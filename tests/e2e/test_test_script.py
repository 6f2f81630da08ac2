"""scripts/test.sh says how to use it, --quick included, before it sets anything up."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from support.processes import ROOT, child_env


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_installs_nothing(flag, tmp_path):
    """In a copy of the scripts with no .venv: a set-up would make one (and install the extras)."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    result = subprocess.run(["bash", "test.sh", flag], cwd=tmp_path / "scripts", env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("The test suite, from a fresh clone")
    assert "bash scripts/test.sh --quick   the edit loop's tier" in result.stdout
    assert "set -euo" not in result.stdout and "#" not in result.stdout
    assert result.stdout.splitlines()[-1].startswith("pytest's own options: .venv/bin/python -m pytest --help")
    assert not (tmp_path / ".venv").exists()
