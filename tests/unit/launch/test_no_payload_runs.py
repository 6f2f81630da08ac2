"""Payloads for another node's shell, through the launch itself (python -m implicit_megatron.launch,
launch/pretrain.sh's, and the SLURM job's): each is refused in one line naming it, exit 2, before any
process starts, and the marker file it would write never appears."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT, child_env

CONFIG = "configs/tiny/mamba2-implicit.yaml"


def launched(module: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "hosts").write_text("nohost.invalid slots=1\n")
    return subprocess.run([sys.executable, "-m", module, CONFIG, f"train.output_dir={tmp_path / 'run'}"], cwd=tmp_path,
                          env=child_env(HOSTFILE=str(tmp_path / "hosts"), PYTHONPATH=str(ROOT), **env),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.processes
@pytest.mark.parametrize("setting,named", [
    ({"PYTHON_Q$(touch {m})": "1"}, "the variable name 'PYTHON_Q$(touch "),
    ({"NCCL_ALGO`touch {m}`": "ring"}, "the variable name 'NCCL_ALGO`touch "),
    ({"UCX_TLS": "tcp\"; touch {m}; \""}, "UCX_TLS="),
    ({"LAUNCHER_ARGS": "--venv_script=/dev/null;touch${{IFS}}{m};true"}, "LAUNCHER_ARGS: '--venv_script /dev/null;"),
    ({"LAUNCHER_ARGS": "--enable_each_rank_log=x;touch${{IFS}}{m}"}, "LAUNCHER_ARGS: '--enable_each_rank_log x;"),
    ({"LAUNCHER_ARGS": "--include=a&&touch${{IFS}}{m}"}, "is not a host list"),
], ids=["name-subshell", "name-backquotes", "value-quote", "venv-script", "rank-log", "include"])
def test_a_payload_for_a_node_s_shell_is_refused_by_the_launch(setting, named, tmp_path):
    marker = tmp_path / "marker"
    env = {key.format(m=marker): value.format(m=marker) for key, value in setting.items()}
    shown = launched("implicit_megatron.launch", tmp_path, **env)
    assert shown.returncode == 2 and named in shown.stderr, shown.stderr[-2000:]
    assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr
    assert not marker.exists()


@pytest.mark.processes
@pytest.mark.parametrize("flag", ["--nv;touch {m}", "--nv --bind /:/host", "--writable"])
def test_a_payload_in_srun_s_words_is_refused_by_the_job(flag, tmp_path):
    marker = tmp_path / "marker"
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho node1\n")  # SLURM's, expanding the node list
    (tmp_path / "scontrol").chmod(0o755)
    shown = launched("implicit_megatron.launch.slurm_job", tmp_path, CONTAINER="c.sif", SLURM_JOB_NODELIST="node1",
                     APPTAINER_GPU_FLAG=flag.format(m=marker), PATH=f"{tmp_path}:/usr/bin:/bin")
    assert shown.returncode == 2, shown.stderr[-2000:]
    assert shown.stderr.startswith("slurm.sbatch: ") and "APPTAINER_GPU_FLAG=" in shown.stderr, shown.stderr[-2000:]
    assert not marker.exists()
