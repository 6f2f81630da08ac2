"""A training run as MLflow's users expect to find it, read back through MlflowClient: who ran which
commit, tags to filter by, the shards as dataset inputs, one parameter per config field, a name of
its own kept across resumes, an end status, each step's metrics once, MLflow's own environment
variables and its system metrics switch."""

from __future__ import annotations

import time

import pytest
from mlflow import MlflowClient
from support.processes import ROOT

from implicit_megatron import load_config
from implicit_megatron.tracking.run_record import apply_environment, git_state, run_page
from implicit_megatron.tracking.tracker import RUN_ID_FILE, STORE, Tracker


def config(out, shards, *extra):
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"train.output_dir={out}", f"data.prefixes=[{shards}]", "data.source=null", *extra],
                      check_files=False)
    (out / "config.yaml").parent.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text("name: x\n")
    return cfg


def the_run(out):
    client = MlflowClient(tracking_uri=f"sqlite:///{out / STORE}")
    return client, client.get_run((out / RUN_ID_FILE).read_text().strip())


def train(cfg, start: int, steps, value: float, status: str, phase: str = "bounded") -> None:
    tracker = Tracker(cfg, active=True)
    tracker.begin(start, parameters=1_234_567, resumed=start > 0)
    tracker.set_phase(phase)
    for step in steps:
        tracker.log({"train/loss": value + step}, step)
    tracker.finish(status)


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_a_run_records_who_what_and_which_data(tmp_path, shakespeare_shards, capsys):
    cfg = config(tmp_path, shakespeare_shards)
    train(cfg, 0, range(1, 5), 10.0, "KILLED")
    client, run = the_run(tmp_path)
    # the launch names the run's page in the UI's training view (MLflow 3.17 opens GenAI's otherwise)
    assert (f"[train] MLflow run {run.info.run_name}: mlflow ui --backend-store-uri sqlite:///{tmp_path / STORE}, "
            f"then http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
            "?workflowType=machine_learning") in capsys.readouterr().out
    tags = run.data.tags
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"] == "implicit_megatron.train"
    assert tags["mlflow.source.git.commit"] == git_state()["commit"] and len(tags["mlflow.source.git.commit"]) == 40
    assert (tags["architecture"], tags["implicit"], tags["size"], tags["phase"]) == ("mamba2", "true", "1.23M",
                                                                                      "bounded")
    assert tags["curriculum"] == " -> ".join(f"{p.name} ({p.max_iter}+{p.phantom_steps})"
                                             for p in cfg.curriculum.phases)
    assert run.info.run_name.startswith(f"{cfg.name}-") and run.info.status == "KILLED"
    params = run.data.params
    assert "curriculum.phases" not in params
    for i, phase in enumerate(cfg.curriculum.phases):
        assert params[f"curriculum.phases.{i}.name"] == phase.name
        assert params[f"curriculum.phases.{i}.max_iter"] == str(phase.max_iter)
    (data,) = run.inputs.dataset_inputs
    assert data.dataset.name == "bpe1000" and data.dataset.source_type == "local" and len(data.dataset.digest) == 16
    assert '"train_tokens": ' in data.dataset.profile
    assert {t.key: t.value for t in data.tags}["mlflow.data.context"] == "training"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # not the GenAI view


def test_a_servers_run_page_opens_the_training_view():
    assert (run_page("http://127.0.0.1:5000/", "3", "abc")
            == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning")
    assert run_page("databricks", "3", "abc") is None


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_a_resume_keeps_the_name_and_sends_no_step_twice(tmp_path, shakespeare_shards, capsys):
    """Steps 1-4, killed; the resume from step 2 trains 3-5 again: MLflow holds each step once."""
    cfg = config(tmp_path, shakespeare_shards)
    train(cfg, 0, range(1, 5), 10.0, "KILLED")
    _, first = the_run(tmp_path)
    capsys.readouterr()
    train(cfg, 2, range(3, 6), 100.0, "FINISHED", phase="free")
    assert f"[train] MLflow run {first.info.run_name}: mlflow ui" in capsys.readouterr().out  # the resume says so too
    client, run = the_run(tmp_path)
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]
    assert run.info.run_name == first.info.run_name and run.info.status == "FINISHED"
    assert run.data.tags["phase"] == "free"


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_a_launch_from_step_0_after_a_dead_one_is_a_run_of_its_own(tmp_path, shakespeare_shards, capsys):
    """The dead launch (120 steps at batch 16, killed before its first checkpoint: its run left
    RUNNING) and the next (60 at 8, from step 0): two runs, each with its own params and steps."""
    dead = Tracker(config(tmp_path, shakespeare_shards, "train.steps=120", "train.global_batch_size=16"), active=True)
    dead.begin(0)
    for step in range(1, 11):
        dead.log({"train/loss": 10.0 + step}, step)
    _, first = the_run(tmp_path)
    time.sleep(1.1)  # run names carry the second they start in
    train(config(tmp_path, shakespeare_shards, "train.steps=60", "train.global_batch_size=8"), 0, range(1, 6), 100.0,
          "FINISHED")
    assert f"[train] MLflow run {first.info.run_name} was a launch that left no checkpoint to resume" in \
        capsys.readouterr().out
    client, run = the_run(tmp_path)
    assert run.info.run_id != first.info.run_id and run.info.run_name != first.info.run_name
    assert (run.data.params["train.steps"], run.data.params["train.global_batch_size"]) == ("60", "8")
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")) == [
        (s, 100.0 + s) for s in range(1, 6)]
    assert client.list_artifacts(run.info.run_id)[0].path == "config.yaml"
    old = client.get_run(first.info.run_id)
    assert old.info.status == "KILLED" and old.data.params["train.steps"] == "120"


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_two_runs_of_one_config_get_two_names(tmp_path, shakespeare_shards):
    names = []
    for folder in ("a", "b"):
        train(config(tmp_path / folder, shakespeare_shards), 0, [1], 1.0, "FINISHED")
        names.append(the_run(tmp_path / folder)[1].info.run_name)
        time.sleep(1.1)
    assert names[0] != names[1]


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_mlflows_environment_names_the_store_and_experiment_unless_the_config_does(tmp_path, shakespeare_shards,
                                                                                  monkeypatch):
    store = tmp_path / "elsewhere.db"
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts in ./mlruns, as for any client of it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-the-environment")
    cfg = config(tmp_path / "run", shakespeare_shards)
    apply_environment(cfg)
    assert (cfg.tracking.uri, cfg.tracking.experiment) == (f"sqlite:///{store}", "from-the-environment")
    train(cfg, 0, [1], 1.0, "FINISHED")
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("from-the-environment").experiment_id])
    assert run.info.status == "FINISHED" and not (tmp_path / "run" / STORE).exists()
    named = config(tmp_path / "named", shakespeare_shards, "tracking.experiment=mine", "tracking.uri=sqlite:///x.db")
    apply_environment(named)
    assert (named.tracking.uri, named.tracking.experiment) == ("sqlite:///x.db", "mine")


@pytest.mark.parametrize("switch", ["config", "environment"])
@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_system_metrics_when_asked(tmp_path, shakespeare_shards, monkeypatch, switch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    extra = ["tracking.system_metrics=true"] if switch == "config" else []
    if switch == "environment":
        monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
    wanted = {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"}
    tracker = Tracker(config(tmp_path, shakespeare_shards, *extra), active=True)
    tracker.begin(0)
    deadline = time.monotonic() + 60  # one sample a second, later on a loaded machine
    try:
        while not wanted <= set(the_run(tmp_path)[1].data.metrics) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        tracker.finish()
    _, run = the_run(tmp_path)
    assert wanted <= set(run.data.metrics)


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_no_system_metrics_unless_asked(tmp_path, shakespeare_shards, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    train(config(tmp_path, shakespeare_shards), 0, [1], 1.0, "FINISHED")
    assert not [k for k in the_run(tmp_path)[1].data.metrics if k.startswith("system/")]


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_end_run_records_a_killed_launch_once(tmp_path, shakespeare_shards):
    """What the launch runs after a second Ctrl-C killed the ranks before they could record it: in
    the store of the config it launched (here none: the folder's own), never the one a config.yaml
    left in the folder names (a received folder's, when the ranks died before writing theirs)."""
    import subprocess
    import sys

    cfg = config(tmp_path, shakespeare_shards)
    tracker = Tracker(cfg, active=True)
    tracker.begin(0)
    tracker.log({"train/loss": 1.0}, 1)  # then the ranks are killed: no finish()
    assert the_run(tmp_path)[1].info.status == "RUNNING"
    outside = tmp_path.parent / f"{tmp_path.name}-sender.db"
    (tmp_path / "config.yaml").write_text(f"tracking:\n  uri: sqlite:///{outside}\n")
    command = [sys.executable, "-m", "implicit_megatron.tracking.end_run", str(tmp_path), "KILLED", "None"]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "recorded as KILLED" in first.stderr, first.stderr
    assert the_run(tmp_path)[1].info.status == "KILLED" and not outside.exists()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "recorded as KILLED" in again.stderr  # by whichever came first
    from implicit_megatron.tracking.end_run import end_run

    assert end_run(tmp_path, "FINISHED").endswith("had ended already (KILLED)")


@pytest.mark.processes  # the run record asks git for the commit (git_state)
def test_a_rank_ends_the_run_in_its_own_store_never_where_the_folder_says(tmp_path, shakespeare_shards):
    """A rank whose launcher is gone records KILLED in the store it tracks into (passed by the launch),
    not the one a saved config from before names (a received folder could name a server of theirs);
    a store that is a link is not opened."""
    from implicit_megatron.tracking.end_run import end_run

    cfg = config(tmp_path, shakespeare_shards)
    tracker = Tracker(cfg, active=True)
    tracker.begin(0)
    (tmp_path / "config.yaml").write_text("tracking:\n  uri: http://sender.example:5000\n")
    assert end_run(tmp_path, "KILLED", f"sqlite:///{tmp_path / STORE}").endswith("recorded as KILLED")
    assert the_run(tmp_path)[1].info.status == "KILLED"
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / STORE).rename(other / STORE)
    (tmp_path / STORE).symlink_to(other / STORE)
    assert end_run(tmp_path, "FAILED", f"sqlite:///{tmp_path / STORE}") == (
        f"the MLflow store {tmp_path / STORE} is not used (it is a symbolic link)")
