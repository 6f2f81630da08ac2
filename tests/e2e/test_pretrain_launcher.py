"""launch/pretrain.sh as a user runs it: a bad config stops before any process; CPU processes train."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import ROOT, child_env, faults, free_port, signal_job

from implicit_megatron.launch.world import COUNT_GPUS
from implicit_megatron.run_control import RunEnd
from implicit_megatron.tracking.metrics_file import read_metrics


def pretrain(*args: str, nproc: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    env = child_env(PYTHON=sys.executable, NPROC=str(nproc), MASTER_PORT=str(free_port()))
    return subprocess.run(["bash", "launch/pretrain.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("script", ["pretrain", "curriculum"])
def test_help_is_the_scripts_usage(script):
    shown = subprocess.run(["bash", f"launch/{script}.sh", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and not shown.stderr
    assert shown.stdout.startswith(("Launch pretraining:", "Run a curriculum")) and "Preemption:" in shown.stdout
    assert not (ROOT / "runs" / "--help").exists()


def test_bad_config_key_is_refused_before_launch(tmp_path):
    result = pretrain("configs/tiny/mamba2-implicit.yaml", "train.stepz=3", f"train.output_dir={tmp_path}")
    assert result.returncode == 2
    assert "train.stepz" in result.stderr and "did you mean 'train.steps'" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("nodes", ["none", "present"])
def test_torch_counts_gpus_only_where_a_gpu_device_node_exists(nodes, tmp_path):
    """On a machine without GPU device nodes the launcher does not import torch to count none; where
    one exists it asks torch (here it finds none and goes on with NPROC processes)."""
    log = tmp_path / "python-calls"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    node = tmp_path / "kfd"
    if nodes == "present":
        node.write_text("")
    env = child_env(PYTHON=str(wrapper), NPROC="1", GPU_DEVICE_NODES=f"{tmp_path / 'nvidia0'} {node}")
    result = subprocess.run(["bash", "launch/pretrain.sh", "configs/tiny/mamba2-implicit.yaml", "train.stepz=3",
                             f"train.output_dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "train.stepz" in result.stderr  # refused by the config check after the count
    traps, *calls = log.read_text().splitlines()  # the launch itself, then torch's count in a process of its own
    assert traps == "-S -m implicit_megatron.run_control --shell-traps"  # the front door's traps: no torch
    assert calls[0].startswith("-m implicit_megatron.launch configs/tiny/mamba2-implicit.yaml"), calls
    assert calls[1:] == (["-c " + COUNT_GPUS] if nodes == "present" else []), calls


def test_several_nodes_pass_the_arguments_as_one_word_that_no_remote_shell_splits(shakespeare_shards, tmp_path):
    """On several nodes the DeepSpeed launcher reaches each node through a remote shell (pdsh quotes
    only arguments with spaces): the arguments travel as one base64 word, which the rank decodes to
    exactly what was typed. Here a stand-in GPU count and `deepspeed` record the launch."""
    from implicit_megatron.train.__main__ import decoded

    bin_dir, recorded, marker = tmp_path / "bin", tmp_path / "deepspeed-argv", tmp_path / "marker"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\ncase "$*" in *device_count*) echo 2; exit 0;; esac\n'
                                    f'exec {sys.executable} "$@"\n')
    (bin_dir / "deepspeed").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "nvidia0").write_text("")
    (tmp_path / "hostfile").write_text("node-a slots=2\nnode-b slots=2\n")
    args = ["configs/tiny/mamba2-implicit.yaml", f"tracking.uri=http://127.0.0.1:9/$(touch {marker});x",
            f"data.prefixes=[{shakespeare_shards}]", "train.global_batch_size=16",
            f"train.output_dir={tmp_path / 'my run'}", "data.source=null"]
    env = child_env(PYTHON=str(bin_dir / "python"), GPU_DEVICE_NODES=str(tmp_path / "nvidia0"),
                    HOSTFILE=str(tmp_path / "hostfile"))
    result = subprocess.run(["bash", "launch/pretrain.sh", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    argv = recorded.read_text().splitlines()
    word = argv[argv.index("implicit_megatron.train") + 2]
    assert argv[argv.index("implicit_megatron.train") + 1] == "--args-base64" and argv[-1] == word
    assert all(c.isalnum() or c in "+/=" for c in word)  # nothing a shell splits, expands or runs
    remote = subprocess.run(["sh", "-c", f"printf '%s' {word}"], capture_output=True, text=True)
    assert decoded(["--args-base64", remote.stdout]) == args
    assert not marker.exists()


def test_cpu_hosts_of_a_hostfile_share_their_cores_among_their_slots(shakespeare_shards, tmp_path):
    """Without GPUs a host runs one process per slot: the thread count every rank gets (through the
    launch's environment file) divides the cores by the most slots on any host, not by NPROC (1).
    A stand-in `deepspeed` records what the launch hands it."""
    import os

    bin_dir, recorded = tmp_path / "bin", tmp_path / "env-file"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "deepspeed").write_text(f'#!/bin/sh\ncat "$DS_ENV_FILE" > {recorded}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "hostfile").write_text(f"node-a slots={os.cpu_count()}\nnode-b slots=1\n")
    env = child_env(PYTHON=str(bin_dir / "python"), GPU_DEVICE_NODES=str(tmp_path / "nvidia0"),
                    HOSTFILE=str(tmp_path / "hostfile"))
    env.pop("OMP_NUM_THREADS")
    result = subprocess.run(["bash", "launch/pretrain.sh", "configs/tiny/mamba2-implicit.yaml",
                             f"data.prefixes=[{shakespeare_shards}]", "data.source=null",
                             f"train.global_batch_size={8 * (os.cpu_count() + 1)}",
                             f"train.output_dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OMP_NUM_THREADS=1" in recorded.read_text().splitlines()


def test_a_mistyped_data_prefix_is_refused_before_launch(shakespeare_shards, tmp_path):
    typo = shakespeare_shards + "_typo"
    result = pretrain("configs/tiny/mamba2-implicit.yaml", f"data.prefixes=[{typo}]", f"train.output_dir={tmp_path}")
    assert result.returncode == 2
    line = next(line for line in result.stderr.splitlines() if line.startswith("config error:"))
    assert f"data.prefixes[0]: no shards for {typo!r}" in line and "data_pipeline.preprocess" in line
    assert not any(tmp_path.iterdir()) and not list(Path(typo).parent.glob(Path(typo).name + "*"))


def test_batch_not_divisible_by_world_size_is_refused(tmp_path):
    result = pretrain("configs/tiny/mamba2-implicit.yaml", "train.micro_batch_size=4", nproc=3)
    assert result.returncode == 2 and "4 x 3" in result.stderr


@pytest.mark.distributed
def test_two_cpu_processes_train(llama_run, shakespeare_shards, tmp_path):
    """The shared run (conftest.llama_run: pretrain.sh, NPROC=2) learned and said so; then a launch
    on a copy of it that the ranks refuse."""
    assert "done at step 6: validation perplexity" in (llama_run.parent / "pretrain.log").read_text()
    rows = [json.loads(line) for line in (llama_run / "metrics.jsonl").read_text().splitlines()]
    trained = [r["train/loss"] for r in rows if "train/loss" in r]
    # Six steps from ln(1000) = 6.91 (guessing, the tiny configs' vocabulary): training 6.83 -> 6.58, validation 6.51
    assert trained[-1] < trained[0] - 0.2 and rows[-1]["val/loss"] < math.log(1000) - 0.3, (trained, rows[-1])
    assert rows[-1]["val/ppl"] == pytest.approx(math.exp(rows[-1]["val/loss"]), rel=1e-6)
    # a refusal found by the ranks (a changed data order): one line from rank 0, exit 2, no traceback
    run = Path(shutil.copytree(llama_run, tmp_path / "run"))
    refused = pretrain("configs/tiny/llama-implicit.yaml", f"data.prefixes=[{shakespeare_shards}]", "data.source=null",
                       f"train.output_dir={run}", "train.steps=6", "train.eval_interval=6",
                       "tracking.enabled=false", "implicit.weight_norm=true", "data.seq_len=32", nproc=2)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    errors = [line for line in (refused.stdout + refused.stderr).splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "changed data order (seq_len" in errors[0]
    assert "Traceback" not in refused.stderr + refused.stdout and "ChildFailedError" not in refused.stderr
    assert not (run / "run.lock").exists()


def start(out: Path, shards: str, *extra: str, steps: int = 300, env: dict | None = None) -> subprocess.Popen:
    """pretrain.sh with one CPU process and no MASTER_PORT, in a process group of its own."""
    env = child_env(PYTHON=sys.executable, **{"NPROC": "1", **(env or {})})
    env.pop("MASTER_PORT", None)
    args = ["configs/tiny/mamba2-implicit.yaml", f"data.prefixes=[{shards}]", "data.source=null",
            f"train.output_dir={out}", f"train.steps={steps}", "train.log_interval=1", "checkpoint.interval=1000",
            "train.eval_interval=1000", "tracking.enabled=false", *extra]
    # Started with Ctrl-C's default action, as a terminal's shell starts a command. A child inherits
    # ignored signals, and bash cannot trap one ignored at its start: twice in CI, pretrain.sh began
    # with SIGINT and SIGQUIT ignored, as glibc's system() sets them process-wide while it runs in
    # some other thread of this test process, and a Ctrl-C test failed for that alone.
    return subprocess.Popen(["env", "--default-signal=INT,QUIT", "bash", "launch/pretrain.sh", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for_steps(proc: subprocess.Popen, out: Path, steps: int = 2) -> None:
    metrics, deadline = out / "metrics.jsonl", time.time() + 180
    while not (metrics.is_file() and metrics.read_text().count("\n") >= steps):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, "no training step in time"
        time.sleep(0.1)


@pytest.mark.distributed
@pytest.mark.parametrize("whom,signum,said", [("script", signal.SIGHUP, "SIGHUP (the terminal closed)"),
                                             ("job", signal.SIGTERM, "SIGTERM")])
def test_sigterm_or_sighup_stops_with_a_checkpoint_and_exit_code_0(whom, signum, said, shakespeare_shards, tmp_path):
    """A requeue script sees 0 whether only pretrain.sh (docker stop; a closed terminal's SIGHUP) or the whole
    job (SLURM) got the signal. (SIGTERM to the script alone: test_sigterm_to_the_script_while_the_rank_starts.)"""
    proc = start(tmp_path, shakespeare_shards)
    wait_for_steps(proc, tmp_path)
    if whom == "script":
        proc.send_signal(signum)
    else:
        signal_job(proc.pid, signum)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    assert f"stopped by {said} after step" in out
    stopped = RunEnd.read(tmp_path)
    assert stopped.outcome == "stopped" and stopped.reason == said
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == stopped.checkpoint
    assert stopped.checkpoint == f"bounded-step{stopped.step}" and stopped.step < 300


def taken(launch: subprocess.Popen, out: Path) -> None:
    """Wait until pretrain.sh has taken a Ctrl-C (it writes the stop file); if it does not within 30 s,
    fail with the signals its shell blocks, ignores, catches and has pending, as the kernel has them."""
    deadline = time.time() + 30
    while not (out / "stop-requested").exists():
        if time.time() > deadline:
            status = Path(f"/proc/{launch.pid}/status").read_text().splitlines()
            pytest.fail("pretrain.sh did not take the Ctrl-C: " + "; ".join(
                line for line in status if line.startswith(("State", "Sig", "ShdPnd"))))
        time.sleep(0.02)


@pytest.mark.distributed
def test_ctrl_c_stops_with_a_checkpoint_and_a_second_one_at_once(shakespeare_shards, tmp_path):
    """A terminal's Ctrl-C reaches the foreground process group, pretrain.sh's (its launcher runs in
    a session of its own): the first finishes the step, saves and exits 0 in one line per process,
    as SIGTERM does; the second kills the launch at once."""
    import psutil

    first = start(tmp_path / "once", shakespeare_shards)
    wait_for_steps(first, tmp_path / "once")
    os.killpg(first.pid, signal.SIGINT)
    taken(first, tmp_path / "once")
    out, _ = first.communicate(timeout=180)
    assert first.returncode == 0, out[-3000:]
    assert "pretrain.sh: Ctrl-C: the ranks finish their step" in out, out[-3000:]
    assert "stopped by SIGINT (Ctrl-C) after step" in out, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    stopped = RunEnd.read(tmp_path / "once")
    assert stopped.reason == "SIGINT (Ctrl-C)" and stopped.checkpoint == f"bounded-step{stopped.step}"

    twice = start(tmp_path / "twice", shakespeare_shards, "tracking.enabled=true",
                  env=faults(seconds_per_step=3))  # a step outlasts Ctrl-C
    wait_for_steps(twice, tmp_path / "twice", steps=1)
    processes = psutil.Process(twice.pid).children(recursive=True)
    os.killpg(twice.pid, signal.SIGINT)
    taken(twice, tmp_path / "twice")
    os.killpg(twice.pid, signal.SIGINT)
    out, _ = twice.communicate(timeout=60)
    assert twice.returncode == 130, out[-3000:]
    assert "stopped at once by a second Ctrl-C" in out and "Traceback" not in out
    ends = [line for line in out.splitlines() if "is lost" in line or "had ended" in line or "end_run" in line]
    assert len(ends) == 1 and ends[0].startswith("pretrain.sh: stopped at once by a second Ctrl-C"), out[-3000:]
    assert ends[0].endswith("recorded as KILLED"), ends  # the MLflow run's end, in the same line
    gone, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive, [p.pid for p in alive]
    assert RunEnd.read(tmp_path / "twice").outcome == "killed"  # the rank's last words: not a graceful stop
    from mlflow import MlflowClient  # the killed ranks' run does not stay RUNNING

    run_id = (tmp_path / "twice" / "mlflow_run_id").read_text().strip()
    assert MlflowClient(f"sqlite:///{tmp_path / 'twice' / 'mlflow.db'}").get_run(run_id).info.status == "KILLED"


@pytest.mark.distributed
def test_a_killed_launch_of_two_ranks_is_named_not_a_collectives_traceback(shakespeare_shards, tmp_path):
    """kill -9 of pretrain.sh with two ranks, tracking off: rank 1's watcher ends it first, and rank 0's
    next collective failed ("Connection closed by peer") in a traceback, before its own watcher
    looked. The failed collective now looks first: one line naming the launch."""
    proc = start(tmp_path, shakespeare_shards, env={"NPROC": "2"})
    wait_for_steps(proc, tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    after = out[out.index("step 2/"):]
    assert "Traceback" not in after and "Connection closed" not in after, after[-3000:]
    ends = [line for line in after.splitlines() if "is gone" in line]
    assert len(ends) == 1 and ends[0].startswith("[train] launch/pretrain.sh (process "), after[-3000:]
    assert RunEnd.read(tmp_path).outcome == "killed"


@pytest.mark.distributed
def test_ctrl_c_to_a_rank_run_directly_stops_it_with_a_checkpoint(shakespeare_shards, tmp_path):
    """`python -m implicit_megatron.train` in a terminal: the rank itself gets Ctrl-C."""
    args = ["configs/tiny/mamba2-implicit.yaml", f"data.prefixes=[{shakespeare_shards}]", "data.source=null",
            f"train.output_dir={tmp_path}", "train.steps=300", "train.log_interval=1", "checkpoint.interval=1000",
            "train.eval_interval=1000", "tracking.enabled=false"]
    proc = subprocess.Popen([sys.executable, "-m", "implicit_megatron.train", *args], cwd=ROOT, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    wait_for_steps(proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    assert "stopped by SIGINT (Ctrl-C) after step" in out and "Traceback" not in out, out[-3000:]
    assert RunEnd.read(tmp_path).reason == "SIGINT (Ctrl-C)"


@pytest.mark.distributed
def test_two_runs_on_one_machine_without_master_port_both_finish(shakespeare_shards, tmp_path):
    runs = [start(tmp_path / name, shakespeare_shards, "schedule.warmup_steps=1", steps=5) for name in ("a", "b")]
    for proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        assert "EADDRINUSE" not in out


@pytest.mark.distributed
def test_sigterm_during_start_up_ends_gracefully_and_releases_the_folder(shakespeare_shards, tmp_path):
    proc = start(tmp_path, shakespeare_shards)
    deadline = time.time() + 120
    while not (tmp_path / "run.lock").is_file():  # rank 0 took the folder: the start-up is under way
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    signal_job(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "stopped by SIGTERM during start-up, before the first step" in out
    assert "Traceback" not in out and not (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / "run.lock").exists()
    assert RunEnd.read(tmp_path) == RunEnd("stopped", 0, reason="SIGTERM during start-up")


@pytest.mark.distributed
def test_sigterm_to_the_script_while_the_rank_starts_stops_after_the_first_step(shakespeare_shards, tmp_path):
    """pretrain.sh writes the stop file when the rank's start-up is over but its first step has not
    run (`docker stop` of a launch that resumes): the request is this launch's, and is honoured."""
    proc = start(tmp_path, shakespeare_shards, env=faults(hold_start_up=True))
    deadline = time.time() + 180
    while not (tmp_path / "start-up-held").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    assert "stopped by SIGTERM after step 1" in out
    assert RunEnd.read(tmp_path).checkpoint == "bounded-step1"


@pytest.mark.distributed
def test_sigterm_before_the_ranks_start_ends_the_launch_at_once(shakespeare_shards, tmp_path):
    """SIGTERM while the launch checks the config: no rank starts, the launch ends 0 as a graceful stop.
    The signal is sent once the launch (pretrain.sh's exec of implicit_megatron.launch) catches SIGTERM,
    as the kernel says, which is before it reads the config."""

    def catching_sigterm() -> bool:
        try:
            command = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            return False
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return b"implicit_megatron.launch" in command and bool(caught & (1 << (signal.SIGTERM - 1)))

    proc = start(tmp_path, shakespeare_shards)
    deadline = time.time() + 60
    while not catching_sigterm():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "stopped by SIGTERM before the ranks started" in out and not (tmp_path / "metrics.jsonl").exists()
    assert RunEnd.read(tmp_path) is None  # no rank ran to write one


@pytest.mark.distributed
def test_a_killed_launch_leaves_no_rank_training_and_the_next_a_run_of_its_own(shakespeare_shards, tmp_path):
    """kill -9 of pretrain.sh's process group before the first checkpoint: the rank, in a session of
    its own, notices that the launch is gone, records its MLflow run as KILLED and ends, and the launch's
    end is said once, in one line (torchrun, left behind in its session, adds nothing). The next launch
    starts from step 0 as a run of its own: in MLflow (its params,
    its steps once), metrics.jsonl and TensorBoard nothing of the dead launch is left."""
    import psutil
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracked = ("tracking.enabled=true", "tracking.tensorboard=true")
    proc = start(tmp_path, shakespeare_shards, *tracked)
    wait_for_steps(proc, tmp_path)
    ranks = [p for p in psutil.process_iter(["cmdline"])
             if "implicit_megatron.train" in " ".join(p.info["cmdline"] or [])
             and f"train.output_dir={tmp_path}" in (p.info["cmdline"] or []) and p.pid != proc.pid
             and os.getpgid(p.pid) != proc.pid]  # the rank, not pretrain.sh or torchrun
    assert ranks, "no rank in a session of its own was found"
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)  # until torchrun, which shares the output, has ended too
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks still running after their launcher was killed: {[p.pid for p in alive]}"
    after = out[out.index("step 2/"):].splitlines()[1:]  # what the launch said once it was killed: one line
    ends = [line for line in after if "is gone" in line or "torchrun" in line or "Traceback" in line]
    assert len(ends) == 1 and ends[0].startswith("[train] launch/pretrain.sh (process "), out[-3000:]
    assert "is gone (killed): this launch ends here" in ends[0] and ends[0].endswith("recorded as KILLED")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    dead = client.get_run((tmp_path / "mlflow_run_id").read_text().strip())
    assert dead.info.status == "KILLED" and dead.info.end_time is not None

    again = start(tmp_path, shakespeare_shards, *tracked, steps=6)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    run = client.get_run((tmp_path / "mlflow_run_id").read_text().strip())
    assert run.info.run_id != dead.info.run_id and run.info.status == "FINISHED"
    assert (run.data.params["train.steps"], client.get_run(dead.info.run_id).data.params["train.steps"]) == ("6", "300")
    losses = [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path) if "train/loss" in r]
    assert [step for step, _ in losses] == [1, 2, 3, 4, 5, 6]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for seen in (sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")),
                 [(e.step, e.value) for e in events.Scalars("train/loss")]):  # TensorBoard keeps float32
        assert [step for step, _ in seen] == [step for step, _ in losses]
        assert [value for _, value in seen] == pytest.approx([value for _, value in losses], rel=1e-6)
