"""What a launch reads from its environment, each value checked before anything uses it.

launch/pretrain.sh documents the variables (NUM_NODES, GPUS_PER_NODE, NPROC, MASTER_ADDR/PORT,
HOSTFILE, LAUNCHER_ARGS, GPU_DEVICE_NODES, PYTHON). A count that is not a whole number or an
address that is not one is refused by name (a shell's arithmetic or a remote shell would have run
what it held); under `srun`, one task per GPU, SLURM's variables say which rank this is.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field

PROG = "pretrain.sh"  # how the launch names itself in its messages: what the user ran
COUNTS = ("NUM_NODES", "GPUS_PER_NODE", "NPROC", "MASTER_PORT")
ADDRESS = re.compile(r"[A-Za-z0-9.:_-]+")
DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")  # NVIDIA, AMD, WSL: where a GPU can be


class LaunchError(Exception):
    """A launch refused before any process starts; the message names the variable or file."""


MOST = {"MASTER_PORT": 65535}  # a TCP port is 1..65535 (0: any, which the other nodes cannot know)


def whole_number(environ: dict[str, str], name: str, prog: str = PROG, least: int = 1) -> int | None:
    """The count `name` holds (None: not set), refused by name unless a whole number >= `least` (and
    a port, MASTER_PORT, at most 65535)."""
    value = environ.get(name) or None
    if value is not None and not (value.isdigit() and int(value) >= least):
        raise LaunchError(f"{prog}: {name}={shlex.quote(value)} is not a whole number"
                          + (f" of at least {least}" if least else ""))
    if value is not None and name in MOST and int(value) > MOST[name]:
        raise LaunchError(f"{prog}: {name}={value} is not a port: a whole number from 1 to {MOST[name]}")
    return None if value is None else int(value)


@dataclass(frozen=True)
class LaunchEnvironment:
    """The launch's settings, as the environment gave them (None: not set)."""

    num_nodes: int | None = None
    gpus_per_node: int | None = None
    nproc: int | None = None
    master_port: int | None = None
    master_addr: str | None = None
    hostfile: str | None = None
    launcher_args: str = ""  # LAUNCHER_ARGS as given: read as the launcher's options (launcher_args.py)
    device_nodes: list[str] = field(default_factory=lambda: list(DEVICE_NODES))
    python: str = "python3"

    @property
    def multi_node(self) -> bool:
        """Several nodes: DeepSpeed's launcher reaches each through a remote shell."""
        return self.hostfile is not None or (self.num_nodes or 1) != 1

    @classmethod
    def read(cls, environ: dict[str, str]) -> LaunchEnvironment:
        counts = {name: whole_number(environ, name) for name in COUNTS}
        addr = environ.get("MASTER_ADDR") or None
        if addr is not None and not ADDRESS.fullmatch(addr):
            raise LaunchError(f"{PROG}: MASTER_ADDR={shlex.quote(addr)} is not a host name or address")
        nodes = environ.get("GPU_DEVICE_NODES")
        return cls(num_nodes=counts["NUM_NODES"], gpus_per_node=counts["GPUS_PER_NODE"], nproc=counts["NPROC"],
                   master_port=counts["MASTER_PORT"], master_addr=addr, hostfile=environ.get("HOSTFILE") or None,
                   launcher_args=environ.get("LAUNCHER_ARGS", ""),
                   device_nodes=nodes.split() if nodes else list(DEVICE_NODES),
                   python=environ.get("PYTHON") or "python3")


def slurm_task_rank(environ: dict[str, str]) -> dict[str, str]:
    """Under `srun --ntasks-per-node=GPUS` each task is one rank: the variables a launcher would have
    set for it, from SLURM's ({} where this is no such task, or a launcher set them already)."""
    if environ.get("RANK") or not environ.get("SLURM_PROCID"):
        return {}
    tasks = environ.get("SLURM_NTASKS") or "1"
    for name, value in (("SLURM_NTASKS", tasks), ("SLURM_PROCID", environ["SLURM_PROCID"]),
                        ("SLURM_LOCALID", environ.get("SLURM_LOCALID") or "0")):
        if not value.isdigit():
            raise LaunchError(f"{PROG}: {name}={shlex.quote(value)} is not a whole number")
    if int(tasks) <= 1:
        return {}
    if not environ.get("SLURM_STEP_ID"):  # srun's tasks have it; the batch script, the job's step 0, has not
        raise LaunchError(f"{PROG}: SLURM_NTASKS={tasks} but SLURM_STEP_ID is not set: this is the job's batch script, "
                          "not one of srun's tasks; run it as `srun bash launch/pretrain.sh ...` (one task a rank), "
                          "or submit launch/examples/slurm.sbatch")
    addr = environ.get("MASTER_ADDR") or first_host(environ.get("SLURM_JOB_NODELIST", ""))
    return {"RANK": environ["SLURM_PROCID"], "LOCAL_RANK": environ.get("SLURM_LOCALID") or "0", "WORLD_SIZE": tasks,
            "MASTER_ADDR": addr, "MASTER_PORT": environ.get("MASTER_PORT") or "29500"}


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what a launcher sets a rank


def launched_rank(environ: dict[str, str]) -> bool:
    """Whether this process is a rank its launcher started (every one of RANK_VARIABLES set); False
    where none of RANK and LOCAL_RANK is. Some set and others not are variables left in a shell: a
    rank started with them would look for MPI to learn the rest, so they are refused by name."""
    given = [name for name in ("RANK", "LOCAL_RANK") if environ.get(name)]
    missing = [name for name in RANK_VARIABLES if not environ.get(name)]
    if not given or not missing:
        return bool(given)
    said = " and ".join(f"{name}={shlex.quote(environ[name])}" for name in given)
    raise LaunchError(f"{PROG}: {said} {'is' if len(given) == 1 else 'are'} set but {', '.join(missing)} "
                      f"{'is' if len(missing) == 1 else 'are'} not: left in this shell by an earlier run? unset "
                      f"{' '.join(given)} to launch (a launcher sets all of {', '.join(RANK_VARIABLES)})")


def first_host(nodelist: str, prog: str = PROG) -> str:
    """The first host of a SLURM node list (`node[1-4]` -> node1), as scontrol expands it."""
    try:
        shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                               timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as err:
        raise LaunchError(f"{prog}: SLURM_JOB_NODELIST={shlex.quote(nodelist)}: scontrol could not expand it "
                          f"({type(err).__name__}); set MASTER_ADDR") from None
    if not shown or not ADDRESS.fullmatch(shown[0]):
        raise LaunchError(f"{prog}: SLURM_JOB_NODELIST={shlex.quote(nodelist)} names no host; set MASTER_ADDR")
    return shown[0]
