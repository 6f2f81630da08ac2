"""tools/dev/check_dockerfiles.py: the repository's images pass; each kind of mistake fails at its line.

The broken images are the repository's own with one change, so each test fails only through that change
(the unchanged copy is checked to pass first).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import load_tool

ROOT = Path(__file__).resolve().parents[3]
ROCM, CUDA = ROOT / "Dockerfile", ROOT / "docker" / "cuda.Dockerfile"
PYPROJECT = """\
[project]
name = "x"
version = "0"
dependencies = ["torch>=2.4", "deepspeed>=0.16"]
[project.optional-dependencies]
gpu = ["mamba-ssm>=2.2.4", "causal-conv1d>=1.5.0", "flash-attn>=2.7.4"]
dev = ["transformers>=4.46"]
"""


def load_checker():
    return load_tool("check_dockerfiles")


checker = load_checker()


def run_checker(dockerfile: Path, pyproject: Path, capsys, hadolint: bool = False) -> tuple[int, str]:
    """The checks of our own, and hadolint's where asked (0.2 s a call)."""
    code = checker.main([str(dockerfile), "--pyproject", str(pyproject), *([] if hadolint else ["--no-hadolint"])])
    return code, capsys.readouterr().out


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.fixture
def pyproject(tmp_path) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(PYPROJECT)
    return path


@pytest.mark.processes
def test_repository_images_pass():
    result = subprocess.run([sys.executable, "tools/dev/check_dockerfiles.py"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok: Dockerfile, docker/cuda.Dockerfile")


@pytest.mark.parametrize("source", [ROCM, CUDA], ids=["rocm", "cuda"])
def test_unchanged_copies_pass(source, tmp_path, pyproject, capsys):
    copy = tmp_path / "Dockerfile"
    copy.write_text(source.read_text())
    code, out = run_checker(copy, pyproject, capsys)
    assert code == 0, out


FLASH_ATTN = '"flash-attn==${FLASH_ATTN_VERSION}"'
# (image, text replaced, replacement, text of the line the message must name, words the message must hold)
BROKEN = {
    "unpinned FROM": (ROCM, "ARG BASE_IMAGE=rocm/pytorch:rocm6.4.1_ubuntu24.04_py3.12_pytorch_release_2.7.1",
                      "ARG BASE_IMAGE=rocm/pytorch", "FROM ${BASE_IMAGE}", ["rocm/pytorch", "not pinned"]),
    "latest": (CUDA, "ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.6-cudnn9-devel",
               "ARG BASE_IMAGE=pytorch/pytorch:latest", "FROM ${BASE_IMAGE}", ["`latest`"]),
    "root user": (ROCM, "USER ${APP_USER}", "USER 0:0", "USER 0:0", ["hadolint DL3002", "should not be root"]),
    "pip install torch": (ROCM, "USER ${APP_USER}", "RUN python3 -m pip install torch==2.7.1\nUSER ${APP_USER}",
                          "pip install torch==", ["torch", "replace"]),
    "build isolation": (CUDA, '--no-build-isolation --no-deps "causal-conv1d', '--no-deps "causal-conv1d',
                        '"causal-conv1d==', ["causal-conv1d", "--no-build-isolation"]),
    "version below pyproject": (ROCM, "ARG MAMBA_SSM_VERSION=2.2.4", "ARG MAMBA_SSM_VERSION=2.0.4",
                                "ARG MAMBA_SSM_VERSION", ["mamba-ssm 2.0.4", "mamba-ssm>=2.2.4"]),
    "unused ARG": (CUDA, "ARG MAX_JOBS=16", "ARG MAX_JOBS=16\nARG FORGOTTEN=1", "ARG FORGOTTEN",
                   ["FORGOTTEN", "never used"]),
    "HIP arch unset": (ROCM, "    GPU_ARCHS=${GPU_ARCH} \\\n", "", '"causal-conv1d==', ["GPU_ARCHS"]),
    "CUDA arch without 9.0": (CUDA, 'ARG CUDA_ARCH_LIST="8.0;9.0"', 'ARG CUDA_ARCH_LIST="8.0"', '"causal-conv1d==',
                              ["TORCH_CUDA_ARCH_LIST", "9.0"]),
    "kernel left out": (CUDA, "python3 -m pip install --no-build-isolation --no-deps " + FLASH_ATTN,
                        'echo "flash-attn ${FLASH_ATTN_VERSION} left out"', "FROM ${BASE_IMAGE}",
                        ["flash-attn", "gpu extra"]),
}


@pytest.mark.processes
@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_image_fails_at_its_line(case, tmp_path, pyproject, capsys):
    source, old, new, at, words = BROKEN[case]
    text = source.read_text()
    assert old in text, f"{case}: the image no longer has {old!r}; update the test"
    broken = text.replace(old, new, 1)
    path = tmp_path / "Dockerfile"
    path.write_text(broken)
    code, out = run_checker(path, pyproject, capsys, hadolint="hadolint" in words[0])
    assert code == 1, out
    where = f"{checker._shown(path)}:{line_of(broken, at)}: "
    assert any(line.startswith(where) and all(w in line for w in words) for line in out.splitlines()), out


def test_pyproject_gpu_extra_must_be_installed(tmp_path, capsys):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT.replace('"flash-attn>=2.7.4"', '"flash-attn>=2.7.4", "new-kernel"'))
    code, out = run_checker(ROCM, pyproject, capsys)
    assert code == 1
    assert f"Dockerfile:{line_of(ROCM.read_text(), 'FROM ')}: the image does not install new-kernel" in out


@pytest.mark.processes
def test_launch_examples_are_well_formed():
    """The hostfile is in DeepSpeed's format and the SLURM script parses."""
    hosts = [line.split() for line in (ROOT / "launch/examples/hostfile").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert len(hosts) >= 2 and all(len(h) == 2 and h[1].startswith("slots=") and h[1][6:].isdigit() for h in hosts)
    subprocess.run(["bash", "-n", str(ROOT / "launch/examples/slurm.sbatch")], check=True)


@pytest.mark.parametrize("source", [ROCM, CUDA], ids=["rocm", "cuda"])
def test_kernels_built_by_default(source):
    """GPU_KERNELS=0 is for a stand-in base (tools/dev/container_smoke.sh); a plain build builds the kernels and
    asserts the base's GPU build of torch."""
    text = source.read_text()
    assert "\nARG GPU_KERNELS=1\n" in text
    runs = [block for block in text.split("\nRUN ")[1:] if "--no-build-isolation --no-deps" in block]
    assert len(runs) == 2 and all(block.startswith('if [ "${GPU_KERNELS}" = 0 ]; then') for block in runs), runs
    assert text.count("or '${GPU_KERNELS}' == '0'") == 2  # the torch assertions


@pytest.mark.processes
def test_help_works_without_the_dev_extra():
    """--help needs no dockerfile_parse (the dev extra): its import is blocked here."""
    script = ("import sys, runpy; sys.modules['dockerfile_parse'] = None; "
              "sys.argv = ['check_dockerfiles.py', '--help']; "
              "runpy.run_path('tools/dev/check_dockerfiles.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage: check_dockerfiles.py"), result.stderr[-2000:]
