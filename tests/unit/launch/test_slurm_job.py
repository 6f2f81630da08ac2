"""The SLURM job's own steps (launch/slurm_job.py): its counts, how a task runs Python, a stop asked
of the job passed to its tasks as the launch's stop request, and that it needs only the standard
library (the host runs it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from support.processes import ROOT, child_env

from implicit_megatron.launch import slurm_job
from implicit_megatron.launch.environment import LaunchError
from implicit_megatron.launch.slurm_job import Job, runner


@pytest.fixture
def first_node(monkeypatch):
    monkeypatch.setattr(slurm_job, "first_host", lambda nodelist, prog: "node001")


def test_tasks_per_node_come_from_sbatch_then_the_gpus_then_one(first_node):
    gpus = Job.read({"SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_NUM_NODES": "2", "SLURM_CPUS_ON_NODE": "128"})
    assert (gpus.per_node, gpus.world, gpus.threads, gpus.master_addr, gpus.master_port) == (8, 16, "16", "node001",
                                                                                             29500)
    asked = Job.read({"SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "3",
                      "SLURM_CPUS_PER_TASK": "7", "MASTER_PORT": "29611", "OMP_NUM_THREADS": "3"})
    assert (asked.per_node, asked.world, asked.threads, asked.master_port) == (2, 6, "3", 29611)
    cpu = Job.read({"SLURM_GPUS_ON_NODE": "0", "SLURM_CPUS_ON_NODE": "2", "MASTER_ADDR": "elsewhere"})
    assert (cpu.per_node, cpu.world, cpu.threads, cpu.master_addr) == (1, 1, "2", "node001")
    env = asked.task_environment({"SLURM_CPUS_PER_TASK": "7"})
    assert env["SRUN_CPUS_PER_TASK"] == "7" and env["MASTER_ADDR"] == "node001" and env["OMP_NUM_THREADS"] == "3"


@pytest.mark.parametrize("variable", slurm_job.COUNTS)
def test_a_count_is_refused_by_name(variable, first_node):
    with pytest.raises(LaunchError, match=rf"^slurm\.sbatch: {variable}=-1 is not a whole number$"):
        Job.read({variable: "-1"})


def test_a_port_beyond_65535_is_refused_by_name(first_node):
    with pytest.raises(LaunchError, match=r"^slurm\.sbatch: MASTER_PORT=70000 is not a port: a whole number from 1 "
                                          "to 65535$"):
        Job.read({"MASTER_PORT": "70000"})


def test_a_task_runs_the_image_s_python_or_this_checkout_s(tmp_path):
    assert runner({"PYTHON": "/opt/py"}, tmp_path) == ([], "/opt/py")
    run, python = runner({"CONTAINER": "image.sif"}, tmp_path)
    assert python == "python3" and run == ["apptainer", "exec", "--rocm", "--bind", str(tmp_path), "--pwd",
                                           str(tmp_path), "--env", "PYTHON=python3", "image.sif"]
    assert runner({"CONTAINER": "c.sif", "APPTAINER_GPU_FLAG": ""}, tmp_path)[0][:3] == ["apptainer", "exec", "--bind"]
    assert runner({"CONTAINER": "c.sif", "APPTAINER_GPU_FLAG": "--nv"}, tmp_path)[0][2] == "--nv"


@pytest.mark.parametrize("setting", [{"APPTAINER_GPU_FLAG": "--nv --bind /:/host"}, {"APPTAINER_GPU_FLAG": "--nv;id"},
                                     {"APPTAINER_GPU_FLAG": "--writable"}, {"CONTAINER": "--fakeroot"}])
def test_srun_s_words_are_only_what_the_job_lets_through(setting, tmp_path):
    """Each word of the srun line is ours or checked: an option smuggled in as an image or a GPU flag
    is refused naming the variable."""
    with pytest.raises(LaunchError) as caught:
        runner({"CONTAINER": "c.sif", **setting}, tmp_path)
    name = next(iter(setting))
    assert str(caught.value).startswith(f"slurm.sbatch: {name}=") and "\n" not in str(caught.value)


@pytest.mark.processes
def test_it_imports_only_the_standard_library():
    """With CONTAINER, the host's python3 runs it, without the project's dependencies (-S: no site)."""
    probe = "import sys, implicit_megatron.launch.slurm_job; print('site' in sys.modules)"
    shown = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, env=child_env(PYTHONPATH=str(ROOT)),
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == "False", shown.stderr[-2000:]


SRUN = """#!/usr/bin/env bash
# a job step whose ranks stop as ranks do on the launch's request: the run's end written, exit 0
echo "$*" > "$OUT/srun-args"
touch "$OUT/started"
while [ ! -e "$OUT/stop-requested" ]; do sleep 0.05; done
echo '{"outcome": "stopped", "exit_status": 0, "reason": "'"$(cat "$OUT/stop-requested")"'", "step": 2}' \\
  > "$OUT/run-end.json"
"""
CONFIG_CHECK = """#!/usr/bin/env bash
# stands in for the interpreter: the config check prints the output folder
echo "$OUT"
"""


@pytest.mark.processes
def test_a_stop_asked_of_the_job_stops_its_tasks_gracefully_and_requeues(tmp_path):
    """SIGTERM or SIGHUP to the batch process (scancel --full, a closed terminal) reaches the ranks as
    the launch's stop request, their graceful stop; the job then requeues itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("python", CONFIG_CHECK),
                       ("scontrol", 'echo "$*" >> "$OUT/scontrol"; [ "$1" != show ] || echo node001\n')):
        (bin_dir / name).write_text(text if text.startswith("#!") else "#!/usr/bin/env bash\n" + text)
        (bin_dir / name).chmod(0o755)
    env = child_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path), SLURM_JOB_ID="77",
                    SLURM_JOB_NODELIST="node001", SLURM_JOB_NUM_NODES="2", PYTHON=str(bin_dir / "python"))
    job = subprocess.Popen([sys.executable, "-m", "implicit_megatron.launch.slurm_job", "configs/tiny/x.yaml", "a=1"],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)
        job.send_signal(signal.SIGHUP)
        out, err = job.communicate(timeout=30)
    finally:  # the stand-in srun loops until its SIGTERM: nothing of the job outlives the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, err
    assert (tmp_path / "srun-args").read_text().split() == [
        "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "launch/pretrain.sh",
        "configs/tiny/x.yaml", "a=1"]
    assert (tmp_path / "scontrol").read_text().splitlines() == ["show hostnames node001", "requeue 77"]
    assert ("slurm.sbatch: stopped gracefully (SIGHUP (the terminal closed) after step 2, nothing saved); "
            "requeueing job 77") in out
