"""How many processes a launch starts, where, with how many threads each, and on which port.

torch counts the GPUs only where a GPU device node exists (NVIDIA, AMD, WSL), and in a process of its
own: this launcher stays up for the whole run, and importing torch to learn that a CPU machine has
no GPU cost 2 s a launch. Without GPUs a host runs NPROC CPU processes (on gloo), or as many as its
hostfile slots say.
"""

from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass

from implicit_megatron.launch.environment import PROG, LaunchEnvironment, LaunchError
from implicit_megatron.launch.hostfile import read_hostfile
from implicit_megatron.utils.ports import free_port

COUNT_GPUS = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


def visible_gpus(env: LaunchEnvironment) -> int:
    if not any(glob.glob(pattern) for pattern in env.device_nodes):
        return 0
    shown = subprocess.run([env.python, "-c", COUNT_GPUS], capture_output=True, text=True, timeout=300)
    if shown.returncode != 0 or not shown.stdout.strip().isdigit():
        raise LaunchError(f"{PROG}: {env.python} could not count the GPUs: {shown.stderr.strip()[-500:]}")
    return int(shown.stdout.strip())


@dataclass(frozen=True)
class World:
    gpus: int  # on this node (0: CPU processes)
    per_node: int  # processes on each node (with a hostfile: the most on any host)
    nodes: int | None  # None: every host of the hostfile
    size: int  # processes in all

    def threads(self, environ: dict[str, str]) -> str:
        """OMP_NUM_THREADS for each process: the user's, else this node's cores over its processes."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return environ.get("OMP_NUM_THREADS") or str(max(1, cores // self.per_node))

    def port(self, env: LaunchEnvironment) -> int:
        """One node without MASTER_PORT takes a free port (two runs on one machine do not collide);
        several use MASTER_PORT or 29500 on every node."""
        if env.master_port is None and self.nodes == 1:
            return free_port()
        return env.master_port or 29500


def world_of(env: LaunchEnvironment) -> World:
    gpus = visible_gpus(env)
    per_node = (env.gpus_per_node or gpus) if gpus else (env.nproc or 1)
    if env.hostfile is not None:  # read by our own code: a mistake is one line naming its line
        try:
            hosts = read_hostfile(env.hostfile)
        except ValueError as err:
            raise LaunchError(f"{PROG}: HOSTFILE {err}") from None
        if env.num_nodes is None:  # every host, each with its slots (CPU processes, or GPUs)
            most = max(host.slots for host in hosts)
            return World(gpus, per_node if gpus else most, None, sum(host.slots for host in hosts))
    nodes = env.num_nodes or 1
    return World(gpus, per_node, nodes, nodes * per_node)
