"""LAUNCHER_ARGS read as the launcher's own options (launch/launcher_args.py): what a node's shell
would run is refused by name before any process starts; the options users pass go through."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from implicit_megatron.launch import launcher_args
from implicit_megatron.launch.environment import LaunchError


def deepspeeds_node_command(venv_script: str, tmp_path) -> str:
    """The start of the command DeepSpeed's pdsh runner hands every node's shell for `--venv_script`."""
    from implicit_megatron.utils.deepspeed_env import name_accelerator

    name_accelerator()
    from deepspeed.launcher.multinode_runner import PDSHRunner

    args = SimpleNamespace(user_args=[], user_script="x", ssh_port=None, launcher_args="", venv_script=venv_script,
                           master_addr="a", master_port=29500, no_python=False, module=True, no_local_rank=True,
                           save_pid=False, enable_each_rank_log="None")
    command = PDSHRunner(args, "e30=").get_cmd({}, {"a": [0]})[0]
    return command[command.index("a") + 1]  # the first word after pdsh's host list: `source VALUE;`


@pytest.mark.processes  # bash, as a node's shell
def test_the_venv_script_payload_would_run_on_every_node_and_is_refused(tmp_path):
    marker = tmp_path / "marker"
    payload = f"/dev/null;touch${{IFS}}{marker};true"
    subprocess.run(["bash", "-c", deepspeeds_node_command(payload, tmp_path) + " true"], check=False)
    assert marker.exists()  # what DeepSpeed would do with it
    marker.unlink()
    with pytest.raises(LaunchError, match=r"LAUNCHER_ARGS: '--venv_script /dev/null;touch\$\{IFS\}.*' is not a "
                                          r"plain word"):
        launcher_args.read(f"--venv_script={payload}", "deepspeed")
    assert not marker.exists()


@pytest.mark.parametrize("value,named", [
    ("--enable_each_rank_log=$(touch M)", "'--enable_each_rank_log $(touch' is not a plain word"),
    ("--venv_script `touch M`", "'--venv_script `touch' is not a plain word"),  # split as a shell splits
    ("--venv_script '/x/`id`'", "--venv_script /x/`id`' is not a plain word"),
    ("--include 'a;touch M'", "--include a;touch M' is not a host list"),
    ("-e a|b", "-e a|b' is not a host list"),
    ("--ssh_port 22 -oProxyCommand=x", "-oProxyCommand=x is not an option of the deepspeed launcher"),
    ("--ssh_port 0x16", "--ssh_port 0x16' is not a whole number from 1 to 65535"),
    ("--bind_core_list 0-3;id", "--bind_core_list 0-3;id' is not a core list"),
    ("--launcher_args -l", "--launcher_args is not let through to pdsh"),
    ("--launcher openmpi --launcher_args '-x A=$(id)'", "holds 'A=$(id)', not a plain word"),
    ("--launcher ssh", "--launcher ssh' is not one of pdsh"),
    ("--master_port 1", "--master_port is set by the launch: set MASTER_PORT instead"),
    ("--hostfile=/etc/hosts", "is set by the launch: set HOSTFILE instead"),
    ("--save_pid=1", "--save_pid=1 takes no value"),
    ("--venv_script", "--venv_script needs a value"),
    ("--force_multi 'unbalanced", "cannot be split into words"),
    ("touch M", "touch is not an option"),
])
def test_what_deepspeeds_launcher_is_not_let_take_is_named(value, named):
    with pytest.raises(LaunchError) as caught:
        launcher_args.read(value, "deepspeed")
    assert str(caught.value).startswith("pretrain.sh: LAUNCHER_ARGS: ") and named in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value,named", [
    ("--log-dir=$(touch M)", "is not a plain word"), ("--max_restarts -1", "is not a whole number"),
    ("--monitor-interval nan", "is not a finite number"), ("--nproc_per_node 4", "set NPROC instead"),
    ("--rdzv-endpoint x:1", "is not an option of the torchrun launcher"),
])
def test_what_torchrun_is_not_let_take_is_named(value, named):
    with pytest.raises(LaunchError, match=".*" + named.replace("$", r"\$").replace("(", r"\(")):
        launcher_args.read(value, "torchrun")


def test_the_options_users_pass_go_through_as_words():
    assert launcher_args.read("", "deepspeed") == []
    assert launcher_args.read("--launcher openmpi --launcher_args '-mca btl_tcp_if_include eth0'", "deepspeed") == [
        "--launcher", "openmpi", "--launcher_args", "-mca btl_tcp_if_include eth0"]
    words = "--venv_script /opt/env.sh --ssh_port=2222 -i node1:0,1@node2 --bind_cores_to_rank --log_level warning"
    assert launcher_args.read(words, "deepspeed") == words.split()
    assert launcher_args.read("--max_restarts=0 --monitor-interval 0.5 --tee 3", "torchrun") == [
        "--max_restarts=0", "--monitor-interval", "0.5", "--tee", "3"]
