"""MLflow never stops a run: a store broken by a kill during its creation, or unreadable, is moved
aside with a warning and a new one started; a new store is complete or not there at all."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from support.processes import ROOT, on_a_small_tmpfs

from implicit_megatron import load_config
from implicit_megatron.tracking import tracker as tracker_module
from implicit_megatron.tracking.tracker import STORE, Tracker
from implicit_megatron.train.process.run_lock import RunLock, not_its_own


def config(out):
    return load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [f"train.output_dir={out}"], check_files=False)


def logged(out) -> list[float]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / STORE}")
    run_id = (out / tracker_module.RUN_ID_FILE).read_text().strip()
    return [m.value for m in client.get_metric_history(run_id, "train/loss")]


def half_migrated(db) -> None:
    """What a kill -9 in the middle of MLflow's schema migrations leaves behind."""
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        con.execute("INSERT INTO alembic_version VALUES ('451aebb31d03')")
        con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")


@pytest.mark.processes
@pytest.mark.parametrize("damage", ["half-migrated", "not a database", "a link to another store", "a FIFO"])
@pytest.mark.timeout(120)  # a FIFO opened would wait for ever
def test_an_unopenable_store_is_moved_aside_and_the_run_goes_on(tmp_path, capsys, damage):
    """A link would have the run write into another store, and a FIFO would hang its opening: both are
    moved aside like a damaged store, unopened."""
    (tmp_path / "config.yaml").write_text("name: x\n")
    db, other = tmp_path / STORE, tmp_path / "elsewhere" / STORE
    if damage == "half-migrated":
        half_migrated(db)
    elif damage == "a link to another store":
        other.parent.mkdir()
        tracker_module._create_store(other)
        db.symlink_to(other)
    elif damage == "a FIFO":
        os.mkfifo(db)
    else:
        db.write_bytes(b"\x00garbage" * 100)
    before = other.read_bytes() if other.exists() else None
    (tmp_path / tracker_module.RUN_ID_FILE).write_text("0123456789abcdef\n")  # the broken store's run
    tracker = Tracker(config(tmp_path), active=True)
    tracker.begin(0)
    tracker.log({"train/loss": 3.0}, 1)
    tracker.finish()
    out = capsys.readouterr().out
    aside = sorted(tmp_path.glob(f"{STORE}.unreadable-*"))
    assert len(aside) == 1 and f"the MLflow store {db} could not be opened" in out and str(aside[0]) in out
    assert logged(tmp_path) == [3.0] and db.is_file() and not db.is_symlink()
    assert (other.read_bytes() if other.exists() else None) == before  # the other store untouched


@pytest.mark.processes
def test_a_store_is_complete_or_not_there(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.yaml").write_text("name: x\n")
    from mlflow import MlflowClient

    real = MlflowClient.search_experiments

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the schema is being written when the process dies

    monkeypatch.setattr(MlflowClient, "search_experiments", killed)
    with pytest.raises(KeyboardInterrupt):
        tracker_module.local_store(tmp_path)
    assert not (tmp_path / STORE).exists()  # only the temporary store is left
    assert list(tmp_path.glob(f"{STORE}.creating-*"))
    monkeypatch.setattr(MlflowClient, "search_experiments", real)
    tracker = Tracker(config(tmp_path), active=True)  # the next launch: leftovers go, a store is made
    tracker.begin(0)
    tracker.log({"train/loss": 2.0}, 1)
    assert not list(tmp_path.glob(f"{STORE}.creating-*")) and logged(tmp_path) == [2.0]
    assert "warning" not in capsys.readouterr().out


def test_any_other_tracking_failure_leaves_the_run_without_mlflow(tmp_path, capsys):
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={tmp_path}", "tracking.uri=http://127.0.0.1:9"], check_files=False)
    import os

    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        tracker = Tracker(cfg, active=True)
        tracker.begin(0)
    finally:
        del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    tracker.log({"train/loss": 1.0}, 1)
    assert tracker.run_id is None
    assert "MLflow tracking is off for this launch" in capsys.readouterr().out


def test_tensorboard_continues_a_resumed_run_at_the_right_steps(tmp_path):
    """A launch logs steps 1-4, a resume from step 2 logs 3-5: TensorBoard's reader shows one curve,
    steps 1-5, the resumed launch's values at 3 and 4."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={tmp_path}", "tracking.enabled=false", "tracking.tensorboard=true"],
                      check_files=False)
    first = Tracker(cfg, active=True)
    first.begin(0)
    for step in range(1, 5):
        first.log({"train/loss": 10.0 - step}, step)
    first.finish("KILLED")
    again = Tracker(cfg, active=True)
    again.begin(2, resumed=True)
    for step in range(3, 6):
        again.log({"train/loss": 100.0 + step}, step)
    again.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (1, 9.0), (2, 8.0), (3, 103.0), (4, 104.0), (5, 105.0)]
    assert not Tracker(cfg, active=False).dashboards.writers  # other ranks write nothing


def test_a_launch_from_step_0_draws_none_of_a_dead_launchs_points(tmp_path):
    """A launch killed before its first checkpoint logged steps 1-10; the next starts at step 0 and
    logs 1-5: TensorBoard's reader shows its points only (it drew 10 -> 5 -> 10 before)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={tmp_path}", "tracking.enabled=false", "tracking.tensorboard=true"],
                      check_files=False)
    for steps, value in ((range(1, 11), 10.0), (range(1, 6), 100.0)):
        tracker = Tracker(cfg, active=True)
        tracker.begin(0)
        for step in steps:
            tracker.log({"train/loss": value + step}, step)
        tracker.finish("KILLED")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(s, 100.0 + s) for s in range(1, 6)]


@pytest.mark.processes
def test_weights_and_biases_offline_writes_a_run_that_a_resume_continues(tmp_path):
    wandb = pytest.importorskip("wandb")
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={tmp_path}", "tracking.enabled=false", "tracking.wandb.project=tests",
                       "tracking.wandb.mode=offline"], check_files=False)
    try:
        for start, steps in ((0, (1, 2)), (2, (3,))):
            tracker = Tracker(cfg, active=True)
            tracker.begin(start, resumed=start > 0)
            for step in steps:
                tracker.log({"train/loss": float(step)}, step)
            tracker.finish()
    finally:  # W&B's service process and its threads outlive the run: a later fork in this worker could hang
        wandb.teardown()
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 2 and all((r / f"run-{run_id}.wandb").is_file() for r in runs)  # one run, resumed
    # the client's own links (latest-run, debug.log, ...) leave the folder a run's own: a launch takes it
    assert [p for p in (tmp_path / "wandb").rglob("*") if p.is_symlink()], "W&B made no link: nothing tested"
    assert not_its_own(tmp_path) is None
    RunLock.acquire(tmp_path).release()
    # any other link is refused, every one named in the same line, W&B's folder included
    (tmp_path / "notes.txt").symlink_to("/etc/hostname")
    (tmp_path / "wandb" / "latest-run").unlink()
    (tmp_path / "wandb" / "latest-run").symlink_to(tmp_path.parent)
    said = not_its_own(tmp_path)
    assert said is not None and "\n" not in said
    assert f"{tmp_path / 'notes.txt'} is a symbolic link (to /etc/hostname)" in said
    assert f"{tmp_path / 'wandb' / 'latest-run'} is a symbolic link (to {tmp_path.parent})" in said
    assert said.count("is a symbolic link") == 2


@pytest.mark.processes
def test_a_tensorboard_folder_that_takes_no_files_is_one_warning(tmp_path):
    """On a read-only file system the writer's own thread would fail with a traceback on stderr; the
    launch says it once and goes on."""
    snippet = ("from implicit_megatron import load_config\n"
               "from implicit_megatron.tracking.dashboards import Dashboards\n"
               "cfg = load_config('configs/tiny/mamba2-implicit.yaml', [f'train.output_dir={OUT}', "
               "'tracking.tensorboard=true'], check_files=False)\n"
               "d = Dashboards(); d.start(cfg, 0, False); d.log({'train/loss': 1.0}, 1); d.finish('FINISHED')\n"
               "import time; time.sleep(0.5)\n")
    result = on_a_small_tmpfs(tmp_path, 'mount -t tmpfs -o size=1m tmpfs "$OUT" && mkdir "$OUT/tensorboard" && '
                                        'mount -o remount,ro "$OUT"', snippet)
    assert "TensorBoard is off for this launch (OSError: [Errno 30] Read-only file system" in result.stdout
    assert "Traceback" not in result.stderr and "Exception in thread" not in result.stderr, result.stderr[-3000:]


@pytest.mark.processes
def test_logging_stopped_by_a_full_disk_says_the_disk_is_full(tmp_path):
    """MLflow's error on a full disk starts with SQLAlchemy's "(raised as a result of Query-invoked
    autoflush; ...)": the warning names the cause at the bottom of the chain instead."""
    snippet = ("import yaml\n"
               "from implicit_megatron import load_config\n"
               "from implicit_megatron.tracking.tracker import Tracker\n"
               "cfg = load_config('configs/tiny/mamba2-implicit.yaml', [f'train.output_dir={OUT}'], "
               "check_files=False)\n"
               "open(f'{OUT}/config.yaml', 'w').write(yaml.safe_dump(cfg.to_dict()))\n"
               "tracker = Tracker(cfg, active=True); tracker.begin(0); tracker.log({'train/loss': 1.0}, 1)\n"
               "fill = open(f'{OUT}/fill', 'wb')\n"
               "try:\n    while True: fill.write(bytes(65536))\nexcept OSError: fill.close()\n"
               "step = 2\n"
               "while tracker.run_id is not None and step < 1000:\n"
               "    tracker.log({f'm{i}': float(step) for i in range(50)}, step); step += 1\n")
    result = on_a_small_tmpfs(tmp_path, 'mount -t tmpfs -o size=3m tmpfs "$OUT"', snippet)
    warned = [line for line in result.stdout.splitlines() if "MLflow logging stopped at step" in line]
    assert len(warned) == 1, result.stdout[-3000:]
    assert "from OperationalError: database or disk is full" in warned[0], warned[0]


def test_a_resume_drops_the_steps_it_trains_again_and_a_line_a_kill_cut(tmp_path):
    import json

    from implicit_megatron.tracking.metrics_file import METRICS_FILE, append_metrics, drop_metrics_after, read_metrics

    for step in range(1, 7):
        append_metrics(tmp_path, step, {"train/loss": 10.0 - step})
    with open(tmp_path / METRICS_FILE, "a") as handle:
        handle.write('{"step": 7, "train/lo')  # killed mid-write
    assert drop_metrics_after(tmp_path, 4) == ([5, 6], 1)
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]  # every line whole JSON
    (tmp_path / METRICS_FILE).write_text((tmp_path / METRICS_FILE).read_text() + '{"st')
    assert drop_metrics_after(tmp_path, 4) == ([], 1)
    assert (tmp_path / METRICS_FILE).read_text().endswith("}\n") and len(read_metrics(tmp_path)) == 4


def test_damaged_metrics_lines_are_dropped_and_counted_not_a_crash(tmp_path):
    """A line that is not UTF-8, or whose step is not an integer (an edited or damaged file), is one
    more line that is no record: readers skip it, a resume drops it and says how many it dropped."""
    from implicit_megatron.tracking.metrics_file import METRICS_FILE, append_metrics, drop_metrics_after, read_metrics

    for step in range(1, 4):
        append_metrics(tmp_path, step, {"train/loss": 1.0})
    with open(tmp_path / METRICS_FILE, "ab") as handle:
        handle.write(b'{"step": 4, "train/loss": \xff\xfe}\n{"step": "5", "train/loss": 1.0}\n[1, 2]\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert drop_metrics_after(tmp_path, 2) == ([3], 3)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


@pytest.mark.parametrize("whose", ["experiment", "run"])
def test_a_received_store_that_keeps_artifacts_elsewhere_is_not_written_to(tmp_path, capsys, whose):
    """A run folder from elsewhere may bring an MLflow store whose experiment (or run) keeps its
    artifacts outside the folder: MLflow stays off for the launch, with a warning naming both."""
    from mlflow import MlflowClient

    deep = tmp_path.joinpath(*["a-cluster-scratch-folder"] * 6)  # the warning is whole, however long the paths
    out, outside = deep / "run", deep / "outside"
    out.mkdir(parents=True)
    outside.mkdir()
    (out / "config.yaml").write_text("name: x\n")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / STORE}")
    if whose == "experiment":
        client.create_experiment("implicit-megatron", artifact_location=outside.as_uri())
    else:  # the experiment is the folder's own, the run the folder names is not
        theirs = client.create_experiment("theirs", artifact_location=outside.as_uri())
        client.create_experiment("implicit-megatron", artifact_location=(out / "mlflow-artifacts").as_uri())
        (out / tracker_module.RUN_ID_FILE).write_text(client.create_run(theirs).info.run_id + "\n")
    tracker = Tracker(config(out), active=True)
    tracker.begin(0, resumed=whose == "run")  # a launch from step 0 would start a run of its own
    tracker.log({"train/loss": 3.0}, 1)
    tracker.finish()
    assert tracker.run_id is None and not any(outside.iterdir())
    said = capsys.readouterr().out
    assert f"outside the run folder {out}; " in said and f"(remove {out / STORE} to start a new one" in said


@pytest.mark.processes  # MLflow asks the machine (uname) and git of the commit
def test_each_launch_of_a_curriculum_is_recorded_in_the_run(tmp_path):
    """A curriculum over two launches into one folder (bounded on 2 processes, then free on 1): the
    MLflow run holds each launch's config file, overrides, world size, ZeRO stage and phase as params
    launch.<n>.*, the newest as tags, and each launch's config.yaml (read as users read it: MlflowClient)."""
    from mlflow import MlflowClient

    curriculum = ROOT / "configs/tiny/mamba2-curriculum.yaml"
    launches = [(curriculum, ["curriculum.run_phase=bounded"], 2, 0),
                (curriculum, ["curriculum.run_phase=free"], 1, 32)]
    for number, (path, overrides, world, step) in enumerate(launches, 1):
        cfg = load_config(path, [f"train.output_dir={tmp_path}", *overrides], world_size=world, check_files=False)
        (tmp_path / "config.yaml").write_text(f"launch: {number}\n")  # the trainer writes this launch's
        tracker = Tracker(cfg, active=True)
        tracker.begin(step, resumed=step > 0, world_size=world)
        tracker.finish()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / STORE}")
    run = client.get_run((tmp_path / tracker_module.RUN_ID_FILE).read_text().strip())
    params, tags = run.data.params, run.data.tags
    assert {k: params[f"launch.1.{k}"] for k in ("overrides", "world_size", "zero_stage", "phase", "start_step")} == {
        "overrides": f"train.output_dir={tmp_path} curriculum.run_phase=bounded", "world_size": "2", "zero_stage": "2",
        "phase": "bounded", "start_step": "0"}
    assert {k: params[f"launch.2.{k}"] for k in ("world_size", "zero_stage", "phase", "start_step")} == {
        "world_size": "1", "zero_stage": "3", "phase": "free", "start_step": "32"}
    assert params["launch.1.config"] == params["launch.2.config"] == str(curriculum)
    newest = (tags["launches"], tags["world_size"], tags["zero_stage"], tags["config"])
    assert newest == ("2", "1", "3", str(curriculum))
    for n in (1, 2):
        local = client.download_artifacts(run.info.run_id, f"launches/{n}/config.yaml", str(tmp_path / f"got{n}"))
        assert Path(local).read_text() == f"launch: {n}\n"
