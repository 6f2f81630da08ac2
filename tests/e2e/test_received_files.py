"""A run folder from someone else runs no code and steers no write outside itself, read by the tools
and the trainer as users run them. The run: the tiny implicit Mamba2 in the paper's layout (bf16,
ZeRO-1: DeepSpeed's BF16_Optimizer) on two processes, trained once per test run; each test
works on a copy. Every payload only writes a marker file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.payloads import WritesMarker
from support.processes import ROOT, child_env, run_torchrun
from support.shared import built_once

TINY = "configs/tiny/mamba2-implicit.yaml"
TAG = "free-step3"
ONE_MORE_STEP = ("train.steps=4", "curriculum.phases.bounded.fraction=0.5", "curriculum.phases.free.fraction=0.5")


def plant(path: Path, marker: Path) -> None:
    torch.save({"module": {}, "optimizer_state_dict": {"zero_stage": 1}, "x": WritesMarker(marker)}, path)
    assert path.read_bytes()[:2] == b"PK"


def settings(shards: str, out: Path, *extra: str) -> list[str]:
    return [f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}", "tracking.enabled=false",
            "distributed.zero_stage=1", "distributed.precision=bf16", "checkpoint.interval=1",
            "schedule.warmup_steps=1", *extra]


@pytest.fixture(scope="session")
def trained(shakespeare_shards, tmp_path_factory) -> Path:
    """Trained once per test run, whichever worker asks first (support.shared); tests copy it."""

    def train(run: Path) -> None:
        steps = settings(shakespeare_shards, run, "train.steps=3")
        result = run_torchrun("-m", "implicit_megatron.train", TINY, *steps)
        assert result.returncode == 0, result.stdout[-3000:]
        assert (run / "checkpoints" / "latest").read_text().strip() == TAG

    return built_once(tmp_path_factory, "received-run", train)


@pytest.fixture
def run(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run", symlinks=True))


def tool(name: str, *args, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"tools/{name}.py", *map(str, args)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)


def train(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "implicit_megatron.train", TINY, *args], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=timeout)


def test_the_export_of_bf16_zero1_is_deepspeeds_own_reading_of_the_shards(run, tmp_path):
    """BF16_Optimizer's shards, which DeepSpeed's zero_to_fp32 cannot read, merged across the two
    ranks: every tensor equals the one DeepSpeed's universal conversion writes from them."""
    from implicit_megatron.checkpoints.consolidate import consolidated_weights
    from implicit_megatron.checkpoints.layout import saved_layout

    converted = tool("convert_checkpoint", "universal", run)
    assert converted.returncode == 0, converted.stderr[-3000:]
    tag = run / "checkpoints" / TAG
    weights = consolidated_weights(tag, saved_layout(tag))
    assert len(weights) == len([p for p in (tag / "universal" / "zero").iterdir() if p.is_dir()])
    assert not any(t.requires_grad for t in weights.values())
    for name, tensor in weights.items():
        theirs = torch.load(tag / "universal" / "zero" / name / "fp32.pt", weights_only=False)
        assert torch.equal(theirs["param"].view(tensor.shape), tensor), name


@pytest.mark.parametrize("planted", ["zz_model_states.pt", "zz_optim_states.pt"])
def test_a_file_planted_in_a_tag_is_refused_by_the_export(planted, run, tmp_path):
    marker = tmp_path / "marker"
    plant(run / "checkpoints" / TAG / planted, marker)
    exported = tool("convert_checkpoint", "export", run, tmp_path / "export")
    assert exported.returncode == 2, exported.stderr[-3000:]
    assert f"{run / 'checkpoints' / TAG / planted}: refused" in exported.stderr
    assert not marker.exists() and not (tmp_path / "export").exists()


def test_a_file_planted_in_a_tag_is_refused_by_generation_and_a_weights_only_start(run, tmp_path, shakespeare_shards):
    marker = tmp_path / "marker"
    plant(run / "checkpoints" / TAG / "zz_model_states.pt", marker)
    refused = f"{run / 'checkpoints' / TAG / 'zz_model_states.pt'}: refused"
    generated = tool("generate", run / "checkpoints", "--prompt", "ROMEO:", "--max-new-tokens", "1")
    assert generated.returncode == 2 and refused in generated.stderr, generated.stderr[-3000:]
    started = train(*settings(shakespeare_shards, tmp_path / "new", "train.steps=4",
                              f"checkpoint.load={run / 'checkpoints'}", "checkpoint.load_optimizer=false"))
    assert started.returncode == 2 and refused in started.stderr, started.stderr[-3000:]
    assert not marker.exists()


def test_shards_are_the_ones_the_saved_precision_names(run, tmp_path, shakespeare_shards):
    """A bf16 tag's optimizer shards are `bf16_*`, as DeepSpeed's engine loads them: a planted shard of
    the other naming, which an alphabetical guess would have taken for the tag's own, is refused on
    resume before the engine loads anything."""
    marker = tmp_path / "marker"
    plant(run / "checkpoints" / TAG / "a_optim_states.pt", marker)
    resumed = train(*settings(shakespeare_shards, run, *ONE_MORE_STEP))
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert f"{run / 'checkpoints' / TAG / 'a_optim_states.pt'}: refused" in resumed.stderr
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["config.yaml", "metrics.jsonl", "checkpoints/zero_to_fp32.py",
                                   "checkpoints/.latest.tmp", "checkpoints"])
def test_a_link_in_a_run_folder_is_refused_before_the_run_writes_through_it(entry, run, tmp_path,
                                                                            shakespeare_shards):
    victim = tmp_path / "outside" / Path(entry).name
    victim.parent.mkdir()
    if entry == "checkpoints":  # another run's checkpoints, shared through a link
        shutil.move(run / entry, victim)
    else:
        victim.write_text("not the run's\n")
        (run / entry).unlink(missing_ok=True)
    (run / entry).symlink_to(victim, target_is_directory=victim.is_dir())
    before = {p: p.read_bytes() for p in victim.parent.rglob("*") if p.is_file()}
    resumed = train(*settings(shakespeare_shards, run, *ONE_MORE_STEP))  # a resume that trains and saves
    assert resumed.returncode == 2 and f"{run / entry} is a symbolic link" in resumed.stderr, resumed.stderr[-3000:]
    assert {p: p.read_bytes() for p in victim.parent.rglob("*") if p.is_file()} == before
    checked = subprocess.run([sys.executable, "-m", "implicit_megatron.train.process.run_lock", str(run)], cwd=ROOT,
                             capture_output=True, text=True)  # launch/pretrain.sh's check, before any process
    assert checked.returncode == 2 and f"{run / entry} is a symbolic link" in checked.stderr


@pytest.mark.parametrize("entry", ["metrics.jsonl", "checkpoints/latest"])
def test_a_hard_linked_file_in_a_run_folder_is_refused_before_the_run_writes_through_it(entry, run, tmp_path,
                                                                                       shakespeare_shards):
    """A run folder copied with `cp -al` shares its files' data with the original: appending to
    metrics.jsonl or rewriting `latest` in place would change the other run's."""
    other = tmp_path / "other-run"
    other.mkdir()
    os.link(run / entry, other / Path(entry).name)
    before = (other / Path(entry).name).read_bytes()
    resumed = train(*settings(shakespeare_shards, run, *ONE_MORE_STEP))  # a resume that trains and saves
    assert resumed.returncode == 2 and f"{run / entry} is hard-linked" in resumed.stderr, resumed.stderr[-3000:]
    assert "cp -a (not -l)" in resumed.stderr
    assert (other / Path(entry).name).read_bytes() == before
    checked = subprocess.run([sys.executable, "-m", "implicit_megatron.train.process.run_lock", str(run)], cwd=ROOT,
                             capture_output=True, text=True)  # launch/pretrain.sh's check, before any process
    assert checked.returncode == 2 and f"{run / entry} is hard-linked" in checked.stderr


def test_a_tag_name_that_leaves_its_checkpoints_folder_is_refused(run, trained, tmp_path):
    other = Path(shutil.copytree(trained, tmp_path / "V", symlinks=True))
    manifest = (other / "checkpoints" / TAG / "manifest.json").read_bytes()
    converted = tool("convert_checkpoint", "universal", run / "checkpoints", "--tag", f"../../V/checkpoints/{TAG}")
    assert converted.returncode == 2 and "checkpoint tag" in converted.stderr, converted.stderr[-3000:]
    assert (other / "checkpoints" / TAG / "manifest.json").read_bytes() == manifest
    assert not (other / "checkpoints" / TAG / "universal").exists()
    (run / "checkpoints" / "latest").write_text(f"../../V/checkpoints/{TAG}\n")
    exported = tool("convert_checkpoint", "export", run, tmp_path / "export")
    assert exported.returncode == 2 and "does not hold a checkpoint tag name" in exported.stderr


def test_a_received_phase_name_never_reaches_a_path(tmp_path, shakespeare_shards):
    """A phase named `../../outside/victim` would tag its checkpoint `../../outside/victim-step3`: the
    save's replace of an older copy of that tag would delete a folder outside the run."""
    victim = tmp_path / "outside" / "victim-step3"
    victim.mkdir(parents=True)
    (victim / "important.txt").write_text("keep me")
    started = train(*settings(shakespeare_shards, tmp_path / "new", "train.steps=3",
                              "curriculum.phases.free.name=../../outside/victim"))
    assert started.returncode == 2 and "curriculum.phases[1].name" in started.stderr, started.stderr[-3000:]
    assert (victim / "important.txt").read_text() == "keep me"


def test_evaluation_logs_where_the_run_folder_says_never_where_the_model_says(run, trained, tmp_path,
                                                                           shakespeare_shards):
    export, outside = tmp_path / "export", tmp_path / "outside"
    assert tool("convert_checkpoint", "export", run, export).returncode == 0
    config = json.loads((export / "config.json").read_text())
    config["implicit_megatron"]["tracking"].update(uri=f"sqlite:///{outside / 'theirs.db'}", experiment="theirs")
    (export / "config.json").write_text(json.dumps(config))
    outside.mkdir()
    evaluated = tool("evaluate", export, "--tasks", "ppl", "--data", shakespeare_shards, "--seq-lens", "32",
                     "--max-windows", "1", "--batch-size", "1", "--run", run)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert not any(outside.iterdir())

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    logged = client.get_run(json.loads((export / "evaluation" / "results.json").read_text())["mlflow_run_id"])
    assert "eval/ppl" in logged.data.metrics
    assert client.get_experiment(logged.info.experiment_id).name == "implicit-megatron"  # the run's own config's

    # a store received with the run, whose experiment keeps its artifacts elsewhere: refused by name, up front
    received = Path(shutil.copytree(run, tmp_path / "received", symlinks=True))
    (received / "mlflow.db").unlink()
    store = MlflowClient(tracking_uri=f"sqlite:///{received / 'mlflow.db'}")
    store.create_experiment("implicit-megatron", artifact_location=outside.as_uri())
    refused = tool("evaluate", export, "--tasks", "ppl", "--data", shakespeare_shards, "--seq-lens", "32",
                   "--max-windows", "1", "--batch-size", "1", "--run", received, "--output", tmp_path / "results")
    assert refused.returncode == 2 and "outside the run folder" in refused.stderr, refused.stderr[-3000:]
    assert not any(outside.iterdir()) and not (tmp_path / "results").exists()

    # a link inside the artifact folder, where the new experiment's artifacts would go: refused by name
    linked = Path(shutil.copytree(trained, tmp_path / "linked", symlinks=True))
    (linked / "mlflow-artifacts").mkdir()
    (linked / "mlflow-artifacts" / "1").symlink_to(outside, target_is_directory=True)
    refused = tool("evaluate", export, "--tasks", "ppl", "--data", shakespeare_shards, "--seq-lens", "32",
                   "--max-windows", "1", "--batch-size", "1", "--run", linked, "--output", tmp_path / "results")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"{linked / 'mlflow-artifacts' / '1'} is a symbolic link" in refused.stderr, refused.stderr[-3000:]
    assert not any(outside.iterdir()) and not (tmp_path / "results").exists()
