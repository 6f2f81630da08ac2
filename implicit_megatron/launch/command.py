"""The launcher that starts the ranks, as a command line.

One node without GPUs: torchrun (ours, implicit_megatron.train.process.torchrun, without its wall
of text) with NPROC CPU processes on gloo. GPUs, or several nodes: DeepSpeed's launcher (over
several nodes: pdsh, or the launcher LAUNCHER_ARGS names; LAUNCHER_ARGS is read as that launcher's
options, each checked: launcher_args.py), with `--no_local_rank` so that a rank's
arguments stay CONFIG [overrides] and it reads LOCAL_RANK from its environment. Over several nodes
the launcher hands the arguments to every node's remote shell, which would split them again and run
what they hold ($(...), ;): they travel as one base64 word (letters, digits, + / =), which the rank
decodes (implicit_megatron.train.__main__.decoded).
"""

from __future__ import annotations

import base64
import os
import shutil

from implicit_megatron.launch import launcher_args
from implicit_megatron.launch.environment import LaunchEnvironment
from implicit_megatron.launch.world import World

RANK_MODULE = "implicit_megatron.train"


def deepspeed_launcher(env: LaunchEnvironment) -> str:
    """The `deepspeed` beside the launch's Python (its virtual environment's), else the one on PATH."""
    python = shutil.which(env.python) or env.python
    beside = os.path.join(os.path.dirname(python), "deepspeed")
    return beside if os.access(beside, os.X_OK) else "deepspeed"


def rank_arguments(args: list[str], multi_node: bool) -> list[str]:
    if not multi_node:
        return args
    return ["--args-base64", base64.b64encode("".join(f"{a}\0" for a in args).encode()).decode()]


def launcher_command(env: LaunchEnvironment, world: World, port: int, args: list[str]) -> list[str]:
    """The command that starts every rank of `world` with `args` (CONFIG [overrides]); LaunchError where
    LAUNCHER_ARGS holds what that launcher is not let take (launcher_args.py)."""
    if not world.gpus and not env.multi_node:
        extra = launcher_args.read(env.launcher_args, "torchrun")
        return [env.python, "-m", "implicit_megatron.train.process.torchrun", "--nnodes", "1",
                "--nproc_per_node", str(world.per_node), "--master_addr", env.master_addr or "127.0.0.1",
                "--master_port", str(port), *extra, "-m", RANK_MODULE, *args]
    extra = launcher_args.read(env.launcher_args, "deepspeed")
    command = [deepspeed_launcher(env), "--no_local_rank", "--master_port", str(port)]
    if world.nodes is not None:
        command += ["--num_nodes", str(world.nodes)]
    if world.gpus and env.gpus_per_node is not None:
        command += ["--num_gpus", str(env.gpus_per_node)]  # else: every visible device
    elif not world.gpus and env.hostfile is None:
        command += ["--num_gpus", str(world.per_node)]  # CPU processes per node (with a hostfile: its slots)
    if env.hostfile is not None:
        command += ["--hostfile", env.hostfile]
    if env.master_addr is not None:
        command += ["--master_addr", env.master_addr]
    return [*command, *extra, "--module", RANK_MODULE, *rank_arguments(args, env.multi_node)]
