"""The launch's half of run control against a stand-in for its ranks: no torch, each case in about a
second. The launch (implicit_megatron.launch: pretrain.py, curriculum.py, slurm_job.py) runs for
real, in a process of its own, with its launcher swapped for STAND_IN, a process that speaks run
control's protocol as the ranks do (implicit_megatron.run_control): it says it started, then ends as
its `behaviour` says:

    stop      waits for the launch's stop request, then ends as a graceful stop does: the run's end
              (stopped, the request's reason, step 3, checkpoint `bounded-step3`), exit 0
    finish    the run's end (finished), exit 0          fail    the run's end (failed), exit 1
    refuse    the run's end (refused), exit 2           orphan  the run's end (killed), exit 3
    hang      waits for ever (a second Ctrl-C must end it)
    killed    killed by SIGKILL, as a launcher killed by someone; its rank, left in a session of its
              own, records the run's end (killed, exit 3) once it sees the launcher gone

What a real rank does with the protocol (its own signals, the request read by rank 0 at a step,
the run's end written by its entry) is tested in-process (tests/unit/train/); one real launch per
launcher crosses the whole way (tests/e2e, tests/multinode).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from support.processes import ROOT, child_env, kill_tree

STAND_IN = """
import os, sys, time
from pathlib import Path
from implicit_megatron.run_control import Launch, RunEnd, StopRequest
folder, behaviour = Path(sys.argv[1]), sys.argv[2]
launch = Launch.of(os.environ)
(folder / "rank-started").write_text(f"{launch.pid if launch else ''} {os.environ.get('NPROC', '')}")
if behaviour == "hang":
    while True:
        time.sleep(1)
if behaviour == "killed":
    import signal
    launcher = os.getpid()
    if os.fork() == 0:
        os.setsid()
        while os.getppid() == launcher:
            time.sleep(0.01)
        RunEnd("killed", 3, reason=f"the launcher of the ranks (process {launcher}) is gone").write(folder)
        os._exit(3)
    os.kill(launcher, signal.SIGKILL)
if behaviour == "stop":
    while StopRequest.read(folder) is None:
        time.sleep(0.01)
    RunEnd("stopped", 0, reason=StopRequest.read(folder).reason, step=3, checkpoint="bounded-step3").write(folder)
    sys.exit(0)
outcome, status = {"finish": ("finished", 0), "fail": ("failed", 1), "refuse": ("refused", 2),
                   "orphan": ("killed", 3)}[behaviour]
RunEnd(outcome, status, reason=behaviour).write(folder)
sys.exit(status)
"""

# A config every launch accepts without data shards or a tokenizer to check (a word problem), as a
# curriculum of two launches (the tiny curriculum's phases: 2 processes, then 1).
CONFIG = "configs/tiny/mamba2-curriculum.yaml"
OVERRIDES = ("task.kind=word_problem", "task.word_problem={algebra: Z60, p: 0.1}", "data.prefixes=[]",
             "model.vocab_size=60", "tracking.enabled=false")

# The launch, its launcher swapped: (which launch, the stand-in's behaviour, its arguments).
DRIVER = f"""
import sys
from implicit_megatron.launch import curriculum, pretrain, slurm_job
which, behaviour, folder, *argv = sys.argv[1:]
stand_in = [sys.executable, "-c", {STAND_IN!r}, folder, behaviour]
pretrain.launcher_command = lambda env, world, port, args: stand_in
if which == "pretrain":
    sys.exit(pretrain.main(argv))
if which == "curriculum":
    sys.exit(curriculum.main(argv))
import os
sys.exit(slurm_job.main(argv, dict(os.environ)))
"""

SRUN = """#!/usr/bin/env bash
# srun's options dropped, its task run here: the stand-in rank, whatever srun was asked to run
echo "$*" > "$OUT/srun-args"
exec {python} -c "$STAND_IN_RANK" "$OUT" "$BEHAVIOUR"
"""
SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$OUT/scontrol"
if [ "$1 $2" = "show hostnames" ]; then echo node001; fi
"""


def start(which: str, behaviour: str, folder: Path, *overrides: str, **env: str) -> subprocess.Popen:
    """The launch `which` (pretrain, curriculum, slurm) of the stand-in config into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    args = [CONFIG, *OVERRIDES, f"train.output_dir={folder}", *overrides]
    if which == "slurm":  # a job runs one launch: one phase of the curriculum
        env = {**slurm_commands(folder, behaviour), **env}
        args.append("curriculum.run_phase=bounded")
    return subprocess.Popen([sys.executable, "-c", DRIVER, which, behaviour, str(folder), *args], cwd=ROOT,
                            env=child_env(NPROC="1", **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def slurm_commands(folder: Path, behaviour: str) -> dict[str, str]:
    """Stand-ins for SLURM's srun and scontrol on PATH, and the job's variables."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN.format(python=sys.executable)), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(folder), "BEHAVIOUR": behaviour,
            "STAND_IN_RANK": STAND_IN, "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node001",
            "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "2"}


def started(proc: subprocess.Popen, folder: Path, timeout: float = 60) -> str:
    """Wait until the stand-in rank runs; what it says (the launch's process, its NPROC)."""
    deadline = time.monotonic() + timeout
    while not (folder / "rank-started").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the stand-in rank never started:\n{finish(proc)[1][-3000:]}")
        time.sleep(0.01)
    return (folder / "rank-started").read_text()


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    """The launch's exit status and what it printed. A launch still running after `timeout` is killed
    with everything it started (the stand-in runs in a session of its own, holding the output pipe)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"the launch did not end within {timeout} s:\n{out[-3000:]}") from None
    return proc.returncode, out
