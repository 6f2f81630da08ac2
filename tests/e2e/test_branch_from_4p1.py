"""The paper's (24+4) model branches from a standalone (4+1) run at 80 % (docs/training.md, "Standalone (4+1)
runs"): the 4p1 run writes bounded-step<N> where the curriculum's free phase starts, and the free
phase's launch starts from it with `checkpoint.load`, continuing step, schedule and data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.processes import run_alone

TINY = "configs/tiny/mamba2-implicit.yaml"
FOUR_PLUS_ONE = ("curriculum.phases=[{name: bounded, kind: bounded, fraction: 0.8, max_iter: 4, phantom_steps: 1},"
                 " {name: bounded-end, kind: bounded, fraction: 0.2, max_iter: 4, phantom_steps: 1}]")


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.distributed
def test_the_free_phase_branches_from_the_standalone_run(shakespeare_shards, tmp_path):
    common = [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", "train.steps=10", "train.log_interval=1",
              "train.eval_interval=100", "tracking.enabled=false", "checkpoint.interval=100"]
    standalone, branch = tmp_path / "4p1", tmp_path / "curriculum"
    result = run_alone("-m", "implicit_megatron.train", TINY, *common, FOUR_PLUS_ONE, f"train.output_dir={standalone}")
    assert result.returncode == 0, result.stdout[-4000:]
    checkpoints = standalone / "checkpoints"
    assert (checkpoints / "bounded-step8").is_dir()
    assert (checkpoints / "latest").read_text().strip() == "bounded-end-step10"
    assert all(r.get("solver/iterations", 4) == 4 for r in rows(standalone))  # (4+1) throughout

    result = run_alone("-m", "implicit_megatron.train", TINY, *common, "curriculum.run_phase=free",
                       f"checkpoint.load={checkpoints / 'bounded-step8'}", f"train.output_dir={branch}")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "at step 8 (64 samples)" in result.stdout
    trained = [r for r in rows(branch) if "train/loss" in r]
    assert [r["step"] for r in trained] == [9, 10] and trained[-1]["train/consumed_samples"] == 80
    assert (branch / "checkpoints" / "latest").read_text().strip() == "free-step10"
    first = {r["step"]: r for r in rows(standalone) if "train/loss" in r}
    assert trained[0]["train/lr"] == first[9]["train/lr"]  # the schedule continues
    # The branch trained step 9 from bounded-step8's weights: its loss is theirs on step 9's samples
    # under the free phase's solver, computed here without the trainer.
    assert trained[0]["train/loss"] == pytest.approx(free_loss_from(checkpoints / "bounded-step8",
                                                                    shakespeare_shards), rel=1e-5)


def free_loss_from(tag: Path, shards: str) -> float:
    import torch

    from data_pipeline.packed import build_packed_dataset
    from implicit_megatron import load_config
    from implicit_megatron.builder import build_model
    from implicit_megatron.hf.export import read_checkpoint

    state, cfg = read_checkpoint(tag.parent, tag.name)  # the standalone (4+1) run's weights and config
    free = next(phase for phase in load_config(TINY, check_files=False).curriculum.phases if phase.name == "free")
    model = build_model(cfg)
    model.load_state_dict(state)
    model.core.set_phase(max_iter=free.max_iter, tol=free.tol, phantom_steps=free.phantom_steps)
    model.train()
    data = build_packed_dataset([shards], None, "train", cfg.data.seq_len, seed=cfg.data.seed,
                                num_samples=cfg.train.steps * cfg.train.global_batch_size)
    losses = []
    for first in range(64, 72, cfg.train.micro_batch_size):  # step 9: samples 64-71, in micro-batches
        batch = torch.stack([torch.from_numpy(data[i]) for i in range(first, first + cfg.train.micro_batch_size)])
        with torch.no_grad():
            losses.append(model(batch[:, :-1], labels=batch[:, 1:]).item())
    return sum(losses) / len(losses)
