"""The launcher's command line (launch/command.py): torchrun on one CPU node, DeepSpeed's otherwise."""

from __future__ import annotations

import subprocess

import pytest

from implicit_megatron.launch.command import launcher_command
from implicit_megatron.launch.environment import LaunchEnvironment
from implicit_megatron.launch.world import World
from implicit_megatron.train.__main__ import decoded

ARGS = ["configs/tiny/mamba2-implicit.yaml", "train.output_dir=/tmp/my run", "tracking.uri=$(touch m);x"]


def test_one_cpu_node_runs_our_torchrun_with_the_arguments_as_typed():
    env = LaunchEnvironment.read({"PYTHON": "/venv/bin/python", "LAUNCHER_ARGS": "--max-restarts 0"})
    assert launcher_command(env, World(0, 2, 1, 2), 1234, ARGS) == [
        "/venv/bin/python", "-m", "implicit_megatron.train.process.torchrun", "--nnodes", "1", "--nproc_per_node",
        "2", "--master_addr", "127.0.0.1", "--master_port", "1234", "--max-restarts", "0", "-m",
        "implicit_megatron.train", *ARGS]


def test_gpus_on_one_node_run_deepspeeds_launcher_beside_the_python(tmp_path):
    (tmp_path / "python").write_text("")
    (tmp_path / "deepspeed").write_text("")
    (tmp_path / "deepspeed").chmod(0o755)
    env = LaunchEnvironment.read({"PYTHON": str(tmp_path / "python"), "GPUS_PER_NODE": "4"})
    assert launcher_command(env, World(8, 4, 1, 4), 29500, ARGS) == [
        str(tmp_path / "deepspeed"), "--no_local_rank", "--master_port", "29500", "--num_nodes", "1", "--num_gpus",
        "4", "--module", "implicit_megatron.train", *ARGS]


@pytest.mark.processes
def test_several_nodes_get_the_arguments_as_one_word_no_remote_shell_splits(tmp_path):
    (tmp_path / "hosts").write_text("a slots=2\nb slots=2\n")
    env = LaunchEnvironment.read({"PYTHON": "python3", "HOSTFILE": str(tmp_path / "hosts"), "MASTER_ADDR": "a"})
    command = launcher_command(env, World(0, 2, None, 4), 29500, ARGS)
    assert command[:3] == ["deepspeed", "--no_local_rank", "--master_port"] and "--num_gpus" not in command
    assert command[command.index("--hostfile") + 1] == str(tmp_path / "hosts") and "--master_addr" in command
    word = command[-1]
    assert command[-2] == "--args-base64" and all(c.isalnum() or c in "+/=" for c in word)
    through_a_shell = subprocess.run(["sh", "-c", f"printf '%s' {word}"], capture_output=True, text=True).stdout
    assert decoded(["--args-base64", through_a_shell]) == ARGS
