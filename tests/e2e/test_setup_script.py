"""scripts/setup.sh says how to use it and refuses an extra pyproject.toml does not have, before it
installs anything."""

from __future__ import annotations

import subprocess

import pytest
from support.processes import ROOT, child_env

try:
    import tomllib
except ImportError:  # Python 3.10: the dev extra's tomli
    import tomli as tomllib

EXTRAS = list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def setup(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/setup.sh", *args], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_the_extras(flag):
    result = setup(flag)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Idempotent set-up of .venv") and "bash scripts/setup.sh [EXTRAS]" in result.stdout
    assert result.stdout.splitlines()[-1] == "Extras: " + " ".join(EXTRAS)


@pytest.mark.parametrize("asked,named", [("evl", "evl"), ("dev,evl", "evl"), ("dev eval", "dev\\ eval"),
                                         ("--upgrade", "--upgrade")])
def test_an_unknown_extra_is_refused_naming_the_known_ones(asked, named):
    result = setup(asked)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"setup.sh: unknown extra {named}; the extras are: {' '.join(EXTRAS)}\n"


def test_more_than_one_argument_is_refused():
    result = setup("dev", "eval")
    assert result.returncode == 2 and "one argument, the extras separated by commas" in result.stderr
