"""Training on DeepSpeed with 2 CPU processes (gloo): every ZeRO stage learns; runs resume exactly."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import (
    ROOT,
    child_env,
    faults,
    free_port,
    kill_tree,
    run_alone,
    run_torchrun,
    torchrun_command,
)
from support.reference_runs import zero1_overrides

TINY = "configs/tiny/mamba2-implicit.yaml"


def overrides(shards: str, out: Path, *extra: str) -> list[str]:
    return [f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}", "train.log_interval=1",
            *extra]


def train_alone(config: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """A world of one (support.processes.run_alone), for what needs no second rank."""
    return run_alone("-m", "implicit_megatron.train", config, *args, **env)


def records_with(out: Path, key: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if key in r]


def records(out: Path) -> dict[int, dict]:
    """step -> the last train record logged for it (a resumed run re-logs the steps it repeats)."""
    result = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            result[row["step"]] = row
    return result


@pytest.mark.distributed
def test_zero_3_learns(zero3_run):
    """The shared ZeRO-3 run (conftest.zero3_run); ZeRO-0, -1 and -2 learn in the resume and
    non-finite-step tests."""
    run = zero3_run
    losses = [r["train/loss"] for _, r in sorted(records(run).items())]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0, losses
    assert records(run)[30]["train/consumed_samples"] == 30 * 8
    assert (run / "checkpoints" / "latest").read_text().strip() == "free-step30"
    assert not (run / "run.lock").exists()  # released at the end


def kill_after_checkpoint(args: list[str], out: Path, tag: str, timeout: float = 240) -> None:
    """Start a run and SIGKILL its whole process group as soon as `latest` names `tag`."""
    proc = subprocess.Popen(torchrun_command("-m", "implicit_megatron.train", TINY, *args), cwd=ROOT,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + timeout
    try:
        while not (latest.is_file() and latest.read_text().strip() == tag):
            assert proc.poll() is None, "the run ended before it was killed"
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.05)
    finally:
        kill_tree(proc.pid)
        proc.wait()


@pytest.mark.distributed
def test_killed_runs_resume_exactly(zero1_run, shakespeare_shards, tmp_path):
    """ZERO1_RUN killed, crashed while saving and resumed, tracked (MLflow, TensorBoard): the straight
    run's losses, one record per step."""
    straight, interrupted = zero1_run, tmp_path / "interrupted"
    args = zero1_overrides(shakespeare_shards, interrupted, "tracking.enabled=true", "tracking.tensorboard=true")
    kill_after_checkpoint(args, interrupted, "bounded-step6")  # kill -9 in the middle of training
    # Resume, and die again while the final checkpoint is written: `latest` must stay on the previous
    # complete checkpoint, the one that ended the bounded phase at step 10.
    crashed = run_torchrun("-m", "implicit_megatron.train", TINY, *args,
                           **faults(crash_before_latest="free-step12"))
    assert crashed.returncode != 0
    assert (interrupted / "checkpoints" / ".partial-free-step12").is_dir()  # written, never renamed
    assert not (interrupted / "checkpoints" / "free-step12").exists()
    assert (interrupted / "checkpoints" / "latest").read_text().strip() == "bounded-step10"
    resumed = run_torchrun("-m", "implicit_megatron.train", TINY, *args)
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    assert "removed" in resumed.stdout and ".partial-free-step12, a checkpoint whose save was interrupted" in \
        resumed.stdout
    assert "at step 10 (80 samples)" in resumed.stdout
    assert "metrics.jsonl: removed the records of steps 11-12, which this launch trains again" in resumed.stdout
    logged = [r["step"] for r in records_with(interrupted, "train/loss")]
    assert len(logged) == len(set(logged))  # one record per step, the resumed launch's

    a, b = records(straight), records(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    early, late = (sum(b[s]["train/loss"] for s in steps) / 3 for steps in ((1, 2, 3), (10, 11, 12)))
    assert late < early - 0.4, (early, late)  # ZeRO-1 learns: 6.90 -> 6.27 over the first 12 steps
    for step in range(1, 13):
        assert abs(a[step]["train/loss"] - b[step]["train/loss"]) <= 1e-6, (step, a[step], b[step])
        assert a[step]["train/consumed_samples"] == b[step]["train/consumed_samples"] == step * 8
    assert (interrupted / "checkpoints" / "latest").read_text().strip() == "free-step12"
    # every launch of a run saves its run's id; another run has another (a tag copied over is refused)
    from implicit_megatron.checkpoints.layout import RUN_ID, read_client_state

    ours = (interrupted / "checkpoints" / RUN_ID).read_text().strip()
    assert ours != (straight / "checkpoints" / RUN_ID).read_text().strip()
    assert {read_client_state(interrupted / "checkpoints" / tag)["run_id"]
            for tag in ("bounded-step6", "bounded-step10", "free-step12")} == {ours}

    # TensorBoard: one curve over the three launches, each step's value the launch's that kept it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(interrupted / "tensorboard"))
    events.Reload()
    curve = {e.step: e.value for e in events.Scalars("train/loss")}
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 13))
    assert all(abs(curve[step] - b[step]["train/loss"]) <= 1e-5 * b[step]["train/loss"] for step in curve)

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{interrupted / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("implicit-megatron").experiment_id])
    assert run.data.params["model.arch"] == "mamba2" and run.data.params["implicit.enabled"] == "True"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert {m.step for m in history} == set(range(1, 13))  # one run, continued across the resumes
    for name in ("train/lr", "train/grad_norm", "train/tokens_per_s", "solver/iterations", "solver/residual",
                 "solver/converged_frac", "val/loss", "val/ppl", "val/solver_iterations", "val/solver_residual",
                 "val/converged_frac"):
        assert client.get_metric_history(run.info.run_id, name), name
    evaluations = records_with(interrupted, "val/loss")
    assert evaluations and all(0 <= r["val/converged_frac"] <= 1 and r["val/solver_residual"] > 0 for r in evaluations)
    assert "config.yaml" in [f.path for f in client.list_artifacts(run.info.run_id)]
    assert run.info.status == "FINISHED" or client.get_run(run.info.run_id).info.status == "FINISHED"
    from implicit_megatron.tracking.launches_file import read_launches  # where each launch began, for plots

    launches = read_launches(interrupted)
    assert [(launch.step, launch.kind, launch.phase) for launch in launches] == [
        (0, "start", "bounded"), (6, "resume", "bounded"), (10, "resume", "free")]
    assert {launch.world_size for launch in launches} == {2}


@pytest.mark.distributed
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(shakespeare_shards, tmp_path):
    """... and while it trains, a second run on its folder is refused by name."""
    args = overrides(shakespeare_shards, tmp_path, "train.steps=200", "checkpoint.interval=1000",
                     "train.eval_interval=1000", "tracking.enabled=false")
    env = child_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))
    proc = subprocess.Popen([sys.executable, "-m", "implicit_megatron.train", TINY, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    # meanwhile a second run on the same output folder is refused by name
    holder = json.loads((tmp_path / "run.lock").read_text())
    second = subprocess.run([sys.executable, "-m", "implicit_megatron.train", TINY, *args], cwd=ROOT,
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    assert f"error: {tmp_path} is in use by another run (host {holder['host']}, process {holder['pid']}" \
        in second.stderr
    assert proc.poll() is None, "the first run stopped"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    last = max(records(tmp_path))
    assert last < 200
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == f"bounded-step{last}"
    assert not (tmp_path / "run.lock").exists()  # released at the end


@pytest.mark.distributed
def test_nonfinite_losses_stop_the_run_and_keep_the_last_good_checkpoint(shakespeare_shards, tmp_path):
    args = overrides(shakespeare_shards, tmp_path, "train.steps=30", "tracking.enabled=false", "optimizer.lr=1e6",
                     "schedule.warmup_steps=1", "schedule.min_lr=0", "optimizer.grad_clip=0",
                     "checkpoint.interval=1", "train.max_nonfinite_in_row=2")
    result = run_torchrun("-m", "implicit_megatron.train", "configs/tiny/mamba2-explicit.yaml", *args)
    assert result.returncode != 0
    assert "2 non-finite losses in a row" in result.stdout
    assert "[rank0]: Traceback" not in result.stdout and "[rank1]: Traceback" not in result.stdout  # one line
    rows = records(tmp_path)
    last_good = max(step for step, row in rows.items() if row["train/loss"] == row["train/loss"])  # not NaN
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == f"step{last_good}"
    assert f"the last checkpoint before them, {tmp_path / 'checkpoints' / f'step{last_good}'}, is intact" in \
        result.stdout


@pytest.mark.distributed
def test_honest_endings(shakespeare_shards, tmp_path):
    """A non-finite last step still ends with a checkpoint and says what was skipped; a step whose loss
    jumps gets no checkpoint; a solve that never converges is warned about; a finished run launched
    again says so."""
    never = "[{name: free, kind: free, fraction: 1.0, max_iter: 2, phantom_steps: 1, tol: 1.0e-30}]"
    args = overrides(shakespeare_shards, tmp_path, "train.steps=4", "tracking.enabled=false", "train.eval_interval=2",
                     "schedule.warmup_steps=1", f"curriculum.phases={never}", "train.warn_unconverged_intervals=2",
                     "checkpoint.interval=1", "checkpoint.keep_last=5")
    result = train_alone(TINY, *args, **faults(nan_loss_at_step=4, loss_jump_at_step=3))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "warning: no checkpoint at step 3: the loss jumped beyond checkpoint.max_loss_jump=4.0" in result.stdout
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == ["free-step1", "free-step2",
                                                                                         "free-step4"]
    assert "warning: no solve has converged to tol 1e-30 in 2 log intervals in a row (step 2" in result.stdout
    assert "done at step 4: validation perplexity" in result.stdout
    assert "; 1 steps skipped with non-finite losses" in result.stdout
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "free-step4"
    again = train_alone(TINY, *args)
    assert again.returncode == 0 and "already complete: step 4 of 4" in again.stdout
    assert "the last one, at step 2: validation perplexity" in again.stdout  # its last metrics, again


@pytest.mark.distributed
def test_a_diverging_run_is_warned_about_and_keeps_its_best_checkpoint(shakespeare_shards, tmp_path):
    """lr 1.0: the loss doubles and stays far above ln(vocabulary). The log warns once, naming the
    checkpoint before the rise, which keep_last=1 then never prunes (nor the best-validated one)."""
    args = overrides(shakespeare_shards, tmp_path, "train.steps=6", "optimizer.lr=1.0", "schedule.warmup_steps=1",
                     "tracking.enabled=false", "train.eval_interval=3", "train.eval_samples=8",
                     "checkpoint.interval=1", "checkpoint.keep_last=1", "checkpoint.max_loss_jump=null")
    result = train_alone("configs/tiny/mamba2-explicit.yaml", *args)
    assert result.returncode == 0, result.stdout[-3000:]
    warnings = [line for line in result.stdout.splitlines() if "the run is diverging" in line]
    assert len(warnings) == 1, result.stdout[-3000:]
    assert "warning: the training loss rose from 6.9" in warnings[0] and "(step 1) to " in warnings[0]
    assert f"the last checkpoint before the rise is {tmp_path / 'checkpoints' / 'step1'}" in warnings[0]
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    validated = {row["step"]: row["val/loss"] for row in records_with(tmp_path, "val/loss")}
    best = min(validated, key=validated.get)
    assert sorted(validated) == [3, 6] and kept == sorted({"step1", f"step{best}", "step6"})


@pytest.mark.distributed
def test_resume_with_a_fresh_optimizer_follows_the_zero_stage_advice(shakespeare_shards, tmp_path):
    """ZeRO-0 fp32 state does not convert to ZeRO-1; the error's advice, load_optimizer=false, resumes.
    Then a raised train.steps extends the run. The first launch, under ZeRO-0, skips a non-finite
    step (ZeRO-0's own skip: zero gradients, zero learning rate; ZeRO-2's is in the test below) and
    learns."""
    args = overrides(shakespeare_shards, tmp_path, "train.steps=6", "checkpoint.interval=4", "tracking.enabled=false",
                     "train.eval_interval=100", "checkpoint.keep_last=5")
    first = train_alone(TINY, *args, **faults(nan_loss_at_step=3))
    assert first.returncode == 0, first.stdout[-3000:]
    assert "step 3: non-finite loss (1 in a row)" in first.stdout
    straight = {step: row["train/loss"] for step, row in records(tmp_path).items()}
    assert 3 not in straight and all(math.isfinite(straight[s]) for s in (1, 2, 4, 5, 6))  # NaN gradients unused
    assert straight[6] < straight[5] < straight[4] and straight[6] < straight[1] - 0.1, straight
    checkpoints = tmp_path / "checkpoints"
    for tag in ("bounded-step5", "free-step6"):
        shutil.rmtree(checkpoints / tag)
    (checkpoints / "latest").write_text("bounded-step4\n")
    # without load_optimizer=false this resume is refused (test_handoff.py, before any process starts)
    resumed = train_alone(TINY, *args, "distributed.zero_stage=1", "checkpoint.load_optimizer=false")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "at step 4 (32 samples)" in resumed.stdout
    again = {step: row["train/loss"] for step, row in records(tmp_path).items()}
    assert abs(again[5] - straight[5]) <= 1e-6  # the weights and the data position were restored
    assert abs(again[6] - straight[6]) > 1e-4  # step 5's update came from a fresh Adam state
    # raising train.steps extends the run: the samples already seen keep their order, no switch needed
    extended = train_alone(TINY, *args, "distributed.zero_stage=1", "train.steps=8")
    assert extended.returncode == 0, extended.stdout[-3000:]
    assert "train.steps raised to 8: the 48 samples already seen come in the same order" in extended.stdout
    assert sorted(records(tmp_path)) == [1, 2, 4, 5, 6, 7, 8]  # step 3 skipped, as said above
    # the finished curriculum's last phase is lengthened: step 5 stays free, the bounded phase never returns
    assert "train.steps raised from 6 to 8: steps 6-7 continue the last phase, 'free'" in extended.stdout
    assert "phase free: (24+4), tol 0.05" in extended.stdout and "phase bounded" not in extended.stdout
    assert records(tmp_path)[7]["solver/iterations"] > 4


@pytest.mark.distributed
def test_a_nonfinite_step_is_skipped_and_training_goes_on(shakespeare_shards, tmp_path):
    """... under ZeRO-2 (ZeRO-0's skip: the test above), and the launch's log reads at a glance: one
    line per interval, validation apart, where the time went (train.timers), no line repeated per rank
    by the libraries or by us, and none of MLflow's INFO lines."""
    args = overrides(shakespeare_shards, tmp_path, "train.steps=6", "train.eval_interval=6",  # MLflow on
                     "distributed.zero_stage=2", "train.timers=true")
    result = run_torchrun("-m", "implicit_megatron.train", TINY, *args, **faults(nan_loss_at_step=3))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "step 3: non-finite loss (1 in a row)" in result.stdout
    out = result.stdout
    assert "Setting accelerator to CPU" not in out and "Warning" not in out, out[-3000:]
    assert " INFO " not in out, out[-3000:]
    assert "CUDA graphs off" not in out  # no GPU: not missed, said at info level only
    lines = out.splitlines()
    last = next(line for line in lines if line.startswith("[train] step 6/6 | "))
    assert re.fullmatch(r"\[train\] step 6/6 \| loss \d+\.\d{4} \| lr \d\.\d\de-\d\d \| grad \S+ \| passes [\d.]+ res "
                        r"\S+ conv \d+% \| [\d,]+ ms/step \| [\d,]+ tok/s \| RSS \d+\.\d GiB \| \d:\d\d:\d\d elapsed, "
                        r"ETA 0:00:00", last), last
    timers = lines[lines.index(last) + 1]
    assert re.fullmatch(r"\[train\] time per step \(ms\): data [\d.]+ \| forward [\d.,]+ \(solve [\d.,]+, phantom "
                        r"[\d.,]+\) \| backward [\d.,]+ \| optimizer [\d.,]+", timers), timers
    assert any(re.fullmatch(r"\[train\] val  step 6 \| loss \d+\.\d{4} \| ppl [\d.]+ \| passes .*", line)
               for line in lines), out[-3000:]
    losses = {step: row["train/loss"] for step, row in records(tmp_path).items()}
    assert 3 not in losses  # a non-finite step is reported as such, not as metrics
    assert all(math.isfinite(losses[s]) for s in (1, 2, 4, 5, 6))  # the NaN gradients were never applied
    # and it learns (from ln(1000) = 6.91 at step 1)
    assert losses[6] < losses[5] < losses[4] and losses[6] < losses[1] - 0.1, losses


@pytest.mark.distributed
def test_word_problem_trains_on_two_processes(tmp_path):
    """The state-tracking task through the same entry: accuracy on every evaluation set, both ranks."""
    args = ["data.seq_len=16", "train.global_batch_size=16", "train.micro_batch_size=4", "train.steps=6",
            "train.eval_interval=3", "train.log_interval=1", "model.d_model=32", "model.mamba2.headdim=16",
            "task.word_problem.eval_words=9", "task.word_problem.eval_lengths=[32]", f"train.output_dir={tmp_path}",
            "tracking.enabled=false", "distributed.precision=fp32", "distributed.zero_stage=1",
            "schedule.warmup_steps=1", "implicit.eval_factor=2"]  # at most 64 passes at test time, not 2048
    result = run_torchrun("-m", "implicit_megatron.train", "configs/state_tracking/mamba2-implicit.yaml", *args)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "done at step 6: validation accuracy" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in evals] == [3, 6]
    # 9 words over 2 ranks: 5 (micro-batches of 4 and 1) and 4, padded to 5 so that both ranks run two
    # forwards (the free phase agrees on every pass over the ranks: unequal counts would hang it)
    for key in ("val", "val_p0.5", "val_len32"):
        assert 0.0 <= evals[-1][f"{key}/accuracy"] <= 1.0 and evals[-1][f"{key}/solver_iterations"] > 1
        assert 0.0 <= evals[-1][f"{key}/converged_frac"] <= 1.0 and evals[-1][f"{key}/solver_residual"] > 0
    # It learns within six steps: training accuracy rises from about 0 (0.0-0.004 at step 1 over
    # seeds 1-3) to 0.10-0.41 at step 6, validation accuracy 0.14-0.42; Mᵃ x A5 has 240 labels (chance 1/240)
    accuracy = [r["train/accuracy"] for r in rows if "train/loss" in r]
    assert accuracy[-1] >= accuracy[0] + 0.05 and evals[-1]["val/accuracy"] >= 0.08, (accuracy, evals[-1])
    assert not any("val/ppl" in r for r in evals)  # accuracy, not perplexity
