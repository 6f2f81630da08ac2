"""One SLURM job of pretraining:  python -m implicit_megatron.launch.slurm_job CONFIG [key=value ...]

launch/examples/slurm.sbatch hands over to this on the allocation's first node. The job's counts
are checked (sbatch's --export=ALL may bring the submitting shell's values where SLURM sets none),
the rendezvous is the allocation's first node, and `srun` starts one task per GPU (per CPU process
on nodes without GPUs), each running launch/pretrain.sh as one rank. srun runs no shell: its words
are ours, the config's arguments (handed on as words) and the image with one of apptainer's GPU
flags, both checked (an option smuggled in as either is refused naming its variable). `srun` is this launch's
launcher, run by the launch's own supervisor (supervisor.py): a stop signal sent to the job's batch
process (SIGTERM, SIGHUP, or SLURM's `--signal=B:...` warning, whichever run_control.STOP_SIGNALS
takes) asks the ranks for the graceful stop, as one sent to the tasks themselves does. A run that
stopped gracefully (its run's end says so) requeues its job; a finished or failed one does not.

This runs outside any container (`srun` and `scontrol` are the host's): it imports only the
standard library, so the host's python3 is enough; the config check and the ranks run in the image
(CONTAINER) or the checkout's environment.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from implicit_megatron.launch.environment import LaunchError, first_host, whole_number
from implicit_megatron.launch.supervisor import supervise
from implicit_megatron.run_control import StopSignals, install_stop_signals

PROG = "slurm.sbatch"
USAGE = "usage: sbatch launch/examples/slurm.sbatch CONFIG [key=value ...]"
GPU_FLAGS = ("--rocm", "--nv", "")
COUNTS = ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NUM_NODES", "SLURM_CPUS_ON_NODE",
          "SLURM_CPUS_PER_TASK", "MASTER_PORT")


@dataclass(frozen=True)
class Job:
    """The tasks of the job and what each is given."""

    per_node: int  # tasks on each node: --ntasks-per-node, else the node's GPUs, else 1
    world: int  # tasks in all
    threads: str  # OMP_NUM_THREADS of each task
    master_addr: str  # the allocation's first node
    master_port: int

    @classmethod
    def read(cls, environ: dict[str, str]) -> Job:
        counts = {name: whole_number(environ, name, PROG, least=0) for name in COUNTS}
        gpus = counts["SLURM_GPUS_ON_NODE"] or 0
        per_node = counts["SLURM_NTASKS_PER_NODE"] or max(gpus, 1)
        cpus = counts["SLURM_CPUS_PER_TASK"] or max(1, (counts["SLURM_CPUS_ON_NODE"] or 1) // per_node)
        addr = first_host(environ.get("SLURM_JOB_NODELIST", ""), PROG)  # the job's, whatever the submitting shell had
        return cls(per_node, (counts["SLURM_JOB_NUM_NODES"] or 1) * per_node,
                   environ.get("OMP_NUM_THREADS") or str(cpus), addr, counts["MASTER_PORT"] or 29500)

    def task_environment(self, environ: dict[str, str]) -> dict[str, str]:
        env = {**environ, "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
               "OMP_NUM_THREADS": self.threads}
        if environ.get("SLURM_CPUS_PER_TASK"):
            env["SRUN_CPUS_PER_TASK"] = environ["SLURM_CPUS_PER_TASK"]  # srun does not inherit --cpus-per-task
        return env


def runner(environ: dict[str, str], here: Path) -> tuple[list[str], str]:
    """How a task runs Python: in the image (CONTAINER, apptainer) or with this checkout's interpreter.
    APPTAINER_GPU_FLAG: --rocm (default) for the ROCm image, --nv for the CUDA one; empty leaves the
    host's GPU libraries out (apptainer shares /dev; the ROCm image has its own user-space libraries)."""
    image = environ.get("CONTAINER")
    if not image:
        return [], environ.get("PYTHON") or sys.executable
    flag = environ.get("APPTAINER_GPU_FLAG", "--rocm")
    if flag not in GPU_FLAGS:  # one of apptainer's GPU flags, not any option of it
        raise LaunchError(f"{PROG}: APPTAINER_GPU_FLAG={shlex.quote(flag)} is not one of --rocm, --nv or empty")
    if image.startswith("-"):
        raise LaunchError(f"{PROG}: CONTAINER={shlex.quote(image)} is not an image: it would be read as an option")
    flags = [flag] if flag else []
    return ["apptainer", "exec", *flags, "--bind", str(here), "--pwd", str(here), "--env", "PYTHON=python3",
            image], "python3"


def main(argv: list[str], environ: dict[str, str]) -> int:
    signals = install_stop_signals(StopSignals(environ), interrupt=False)  # a stop during the check: no rank starts
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    here = Path.cwd()
    try:
        job = Job.read(environ)
        run, python = runner(environ, here)
    except LaunchError as err:
        print(err, file=sys.stderr)
        return 2
    # the run's folder, where the stop request and the run's end go; a bad config ends the job here
    checked = subprocess.run([*run, python, "-m", "implicit_megatron.config", *argv, "--world-size", str(job.world),
                              "--get", "output_dir"], stdout=subprocess.PIPE, text=True)
    if checked.returncode != 0:
        return checked.returncode
    folders = checked.stdout.rstrip("\n").split("\n")  # one per launch the config makes
    if len(folders) != 1:
        print(f"{PROG}: {argv[0]} is a curriculum whose phases run as launches of their own: submit one job per "
              "phase, with curriculum.run_phase=NAME", file=sys.stderr)
        return 2
    srun = ["srun", f"--ntasks={job.world}", f"--ntasks-per-node={job.per_node}", "--kill-on-bad-exit=1", *run,
            "bash", "launch/pretrain.sh", *argv]
    result = supervise(srun, Path(folders[0]), job.task_environment(environ), signals, multi_node=False,
                       tracking_uri=None, prog=PROG)
    if result.stopped and result.end is not None:
        job_id = environ.get("SLURM_JOB_ID", "")
        print(f"{PROG}: stopped gracefully ({result.end.describe()}); requeueing job {job_id}", flush=True)
        subprocess.run(["scontrol", "requeue", job_id], check=False)
    return result.status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], dict(os.environ)))
