"""MLflow never stops a run: a store broken by a kill during its creation, or unreadable, is moved
aside with a warning and a new one started; a new store is complete or not there at all."""

from __future__ import annotations

import sqlite3

import pytest
from support.processes import ROOT

from implicit_megatron import load_config
from implicit_megatron.tracking import tracker as tracker_module
from implicit_megatron.tracking.tracker import STORE, Tracker


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


@pytest.mark.parametrize("damage", ["half-migrated", "not a database"])
def test_an_unopenable_store_is_moved_aside_and_the_run_goes_on(tmp_path, capsys, damage):
    (tmp_path / "config.yaml").write_text("name: x\n")
    db = tmp_path / STORE
    if damage == "half-migrated":
        half_migrated(db)
    else:
        db.write_bytes(b"\x00garbage" * 100)
    (tmp_path / tracker_module.RUN_ID_FILE).write_text("0123456789abcdef\n")  # the broken store's run
    tracker = Tracker(config(tmp_path), active=True)
    tracker.log({"train/loss": 3.0}, 1)
    tracker.finish()
    out = capsys.readouterr().out
    aside = sorted(tmp_path.glob(f"{STORE}.unreadable-*"))
    assert len(aside) == 1 and f"the MLflow store {db} could not be opened" in out and str(aside[0]) in out
    assert logged(tmp_path) == [3.0]


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
    again.begin(2)
    for step in range(3, 6):
        again.log({"train/loss": 100.0 + step}, step)
    again.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (1, 9.0), (2, 8.0), (3, 103.0), (4, 104.0), (5, 105.0)]
    assert not Tracker(cfg, active=False).dashboards.writers  # other ranks write nothing


def test_weights_and_biases_offline_writes_a_run_that_a_resume_continues(tmp_path):
    pytest.importorskip("wandb")
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={tmp_path}", "tracking.enabled=false", "tracking.wandb.project=tests",
                       "tracking.wandb.mode=offline"], check_files=False)
    for start, steps in ((0, (1, 2)), (2, (3,))):
        tracker = Tracker(cfg, active=True)
        tracker.begin(start)
        for step in steps:
            tracker.log({"train/loss": float(step)}, step)
        tracker.finish()
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 2 and all((r / f"run-{run_id}.wandb").is_file() for r in runs)  # one run, resumed
