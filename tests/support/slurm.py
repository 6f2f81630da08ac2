"""A SLURM cluster on the test nodes (tests/support/nodes.py): munged in each node (one shared key,
each node's own socket in its own /run), slurmctld in node1, slurmd in each node, all started in the
foreground by the test and stopped by their process ids; slurm.conf in the test's folder, named to
every command by SLURM_CONF. No cgroups, no accounting, no GPUs (no gres): a plain CPU cluster.

    with Nodes(folder / "nodes") as nodes, Slurm(nodes, folder / "slurm") as slurm:
        job = slurm.sbatch("--nodes=2", "launch/examples/slurm.sbatch", ...)
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from support.nodes import Node
from support.nodes import missing as nodes_missing
from support.processes import ROOT

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel")


def missing() -> str | None:
    """Why a SLURM cluster cannot be made here (None: it can): the nodes' reasons, or a tool missing."""
    absent = [tool for tool in TOOLS if shutil.which(tool, path="/usr/bin:/usr/sbin:/bin:/sbin") is None]
    return nodes_missing() or (f"not installed: {', '.join(absent)} (bash scripts/install_cluster_tools.sh)"
                               if absent else None)

CONF = """ClusterName=tests
SlurmctldHost={head}({head_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
KillWait=3
StateSaveLocation={folder}/state
SlurmdSpoolDir=/run/slurmd
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/%n/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/%n/slurmd.log
{nodes}
PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Slurm(contextlib.AbstractContextManager):
    """slurmctld on the first node, slurmd and munged on each; `sbatch`, `state` and `scancel` run on
    the first node as a user's login shell would."""

    def __init__(self, nodes: list[Node], folder: Path, cpus: int = 2) -> None:
        self.nodes, self.folder, self.cpus = nodes, folder, cpus
        self.conf = folder / "slurm.conf"
        self.daemons: list[tuple[Node, Path]] = []  # (node, pid file) of each daemon, stopped in reverse

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def __enter__(self) -> Slurm:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        (self.folder / "state").mkdir(parents=True)
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        head = self.nodes[0]
        lines = "\n".join(f"NodeName={node.name} NodeAddr={node.address} CPUs={self.cpus} State=UNKNOWN"
                          for node in self.nodes)
        self.conf.write_text(CONF.format(head=head.name, head_address=head.address, folder=self.folder, nodes=lines))
        for node in self.nodes:
            own = self.folder / node.name
            own.mkdir(parents=True)
            # in the node's own /run: short paths for the daemons' Unix sockets (at most 108 bytes)
            (node.folder / "run" / "munge").mkdir(exist_ok=True)
            (node.folder / "run" / "slurmd").mkdir(exist_ok=True)
            self._daemon(node, own / "munged.pid", "munged", "--foreground", "--force", f"--key-file={key}",
                         f"--log-file={own / 'munged.log'}", f"--seed-file={own / 'munged.seed'}",
                         f"--pid-file={own / 'munged.pid'}")
        for node in self.nodes:
            socket = node.folder / "run" / "munge" / "munge.socket.2"  # the node's /run/munge/...
            self.wait_until(socket.exists, f"munged on {node.name}")
        self._daemon(head, self.folder / "slurmctld.pid", "slurmctld", "-D", "-i")
        for node in self.nodes:
            self._daemon(node, self.folder / node.name / "slurmd.pid", "slurmd", "-D")
        self.wait_until(lambda: self.run("sinfo", "-N", "-h", "-o", "%t", check=False).stdout.split().count("idle")
                        == len(self.nodes), "every node idle in sinfo", every=1)

    def _daemon(self, node: Node, pid_file: Path, *command: str) -> None:
        log = (self.folder / f"{node.name}-{command[0]}.out").open("w")
        node.popen(*command, env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.daemons.append((node, pid_file))

    @staticmethod
    def wait_until(condition, what: str, seconds: float = 30, every: float = 0.1) -> None:
        """`every`: a condition that runs a SLURM command asks once a second (each is a process
        entering a node: ten a second kept most of a core busy while a test waited)."""
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM test cluster: no {what} within {seconds} s")
            time.sleep(every)

    def run(self, *args: str, check: bool = True, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        """A SLURM command on the first node, in the checkout (where users submit from)."""
        return self.nodes[0].run(*args, env=self.env(**env), check=check, timeout=timeout, cwd=ROOT)

    def sbatch(self, *args: str, **env: str) -> int:
        """The job's id; `env` is added to the submitting shell's environment (sbatch exports it all)."""
        submitted = self.run("sbatch", "--parsable", *args, check=False, **env)
        assert submitted.returncode == 0, f"sbatch refused the job: {submitted.stderr.strip()}"
        return int(submitted.stdout.strip().split(";")[0])

    def state(self, job: int) -> dict[str, str]:
        """scontrol's view of the job: JobState, Restarts, ExitCode, ..."""
        text = self.run("scontrol", "-o", "show", "job", str(job)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for(self, job: int, states: tuple[str, ...], seconds: float, skip_delay: bool = False) -> dict[str, str]:
        """The job's state once it is one of `states` (skip_delay: a requeued job starts at once)."""
        deadline = time.monotonic() + seconds
        while True:
            info = self.state(job)
            if info.get("JobState") in states:
                return info
            if skip_delay:
                self.skip_requeue_delay(job, info)
            assert time.monotonic() < deadline, f"job {job} still {info.get('JobState')} after {seconds} s: {info}"
            time.sleep(1)  # scontrol is a process: once a second (wait_until)

    def skip_requeue_delay(self, job: int, info: dict[str, str] | None = None) -> None:
        """A requeued job waits a while before it is eligible again (slurmctld lets its nodes clean up;
        ours have nothing to clean): it starts in 2 s instead. Not at once: slurmd refuses a job's
        credential made in the second its last one was revoked (the requeue), and the batch job is
        then killed as "Job credential revoked" and never comes back."""
        info = info or self.state(job)
        if info.get("JobState") != "PENDING" or info.get("Reason") != "BeginTime":
            return
        with contextlib.suppress(ValueError):  # the start already moved (a poll a second ago) stays
            if datetime.datetime.fromisoformat(info.get("StartTime", "")) < datetime.datetime.now() + \
                    datetime.timedelta(seconds=3):
                return
        self.run("scontrol", "update", f"JobId={job}", "StartTime=now+2", check=False)

    def __exit__(self, *exc) -> None:
        for node, pid_file in reversed(self.daemons):
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
                pid = int(pid_file.read_text().split()[0])  # as the node numbers its processes
                node.run("kill", f"-{int(signal.SIGTERM)}", str(pid), check=False, timeout=10)
