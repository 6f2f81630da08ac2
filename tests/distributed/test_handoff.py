"""Phase handoff across world sizes and ZeRO stages through DeepSpeed universal checkpoints: phase 1
on 2 processes with ZeRO-2, phase 2 on 2 processes with ZeRO-3, and its checkpoint back on 1 process
with ZeRO-2. What a launch loaded is compared with what the launch before it saved, both gathered
in full by the probe worker (workers/handoff_probe.py); the losses with those of the shared
uninterrupted run of the same 12 steps (support.reference_runs.ZERO1_RUN)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.processes import ROOT, run_alone, run_torchrun
from support.reference_runs import ZERO1_RUN, losses

from implicit_megatron import load_config
from implicit_megatron.train.schedule import learning_rate

TINY = "configs/tiny/mamba2-implicit.yaml"
PROBE = "tests/distributed/workers/handoff_probe.py"


STEPS = "train.steps=12"  # as ZERO1_RUN: the bounded phase ends at step 10 (80 %)
assert STEPS in ZERO1_RUN


def args(shards: str, out: Path, *extra: str) -> list[str]:
    return [f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}", STEPS,
            "train.eval_interval=100", "train.log_interval=1", "tracking.enabled=false", *extra]


@pytest.mark.distributed
@pytest.mark.slow
def test_handoff_to_other_world_sizes_and_zero_stages(zero1_run, shakespeare_shards, tmp_path):
    """Each phase's launch records what it loaded and what its last checkpoint saved (the probe
    worker), so that three launches check both directions of the handoff."""
    phase1 = tmp_path / "phase1"
    run = run_torchrun(PROBE, tmp_path / "phase1", "--train", TINY,
                       *args(shakespeare_shards, phase1, "distributed.zero_stage=2", "curriculum.run_phase=bounded"))
    assert run.returncode == 0, run.stdout[-4000:]
    assert (phase1 / "checkpoints" / "latest").read_text().strip() == "bounded-step10"  # 80 % of 12 steps
    ref = torch.load(tmp_path / "phase1-saved.pt", weights_only=False)  # what phase 1 saved, in its layout
    assert ref["step"] == 10 and ref["consumed_samples"] == 80

    # Phase 2 on 2 processes with ZeRO-3 reads it through the universal checkpoint and holds the same
    # weights, Adam moments, step, LR and data position. (From 2 processes to 1 is checked on the way
    # back below, and launch/curriculum.sh's end-to-end test hands off from 2 to 1.)
    cfg = load_config(TINY, [STEPS])
    out = tmp_path / "2proc-zero3"
    shutil.copytree(phase1, out)
    free_zero3 = ["distributed.zero_stage=3", "curriculum.run_phase=free"]
    run = run_torchrun(PROBE, tmp_path / "phase2", "--train", TINY, *args(shakespeare_shards, out, *free_zero3))
    assert run.returncode == 0, run.stdout[-4000:]
    got = torch.load(tmp_path / "phase2-loaded.pt", weights_only=False)
    assert got["how"] == "universal"
    assert (out / "checkpoints" / "bounded-step10" / "universal").is_dir()
    assert got["step"] == 10 and got["consumed_samples"] == 80
    assert got["lr"] == learning_rate(10, cfg) == ref["lr"]
    assert got["data"]["consumed_samples"] == 80
    assert got["groups"] == ref["groups"]  # weight decay stays per group
    assert got["weights"].keys() == ref["weights"].keys()
    for key, tensor in ref["weights"].items():
        assert torch.equal(got["weights"][key], tensor), key
        assert torch.equal(got["moments"][key][0], ref["moments"][key][0]), key
        assert torch.equal(got["moments"][key][1], ref["moments"][key][1]), key

    # Phase 2 trained on in the ZeRO-3 layout: the step count and LR schedule continue, and the losses
    # follow those of one uninterrupted launch of the whole curriculum on 2 processes (ZeRO-1, whose
    # updates are ZeRO-2's: both reduce the whole gradient before the partitioned optimizer step).
    handed, whole = losses(out), losses(zero1_run)
    assert sorted(handed) == list(range(1, 13))  # phase 1's records, then steps 11 and 12
    for step in range(1, 12):  # phase 1, then the same weights at the handoff
        assert handed[step] == pytest.approx(whole[step], rel=1e-6), step
    # Step 12 follows the first update of phase 2: the free phase's tolerance stop may take another
    # pass where ZeRO-3 sums gradients in another order, so it agrees less tightly.
    assert handed[12] == pytest.approx(whole[12], rel=2e-3)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["step"] == 12 and "train/lr" in r][-1]
    assert last["train/consumed_samples"] == 96 and last["train/lr"] == pytest.approx(learning_rate(11, cfg))
    assert (out / "checkpoints" / "latest").read_text().strip() == "free-step12"

    # And back: the ZeRO-3 checkpoint resumed on 1 process with ZeRO-2 holds what phase 2 saved.
    layout = ["distributed.zero_stage=2", "curriculum.run_phase=free"]
    probe = run_alone(PROBE, tmp_path / "back", TINY, *args(shakespeare_shards, out, *layout))
    assert probe.returncode == 0, probe.stdout[-4000:]
    saved, back = (torch.load(tmp_path / f"{name}.pt", weights_only=False) for name in ("phase2-saved", "back-loaded"))
    assert back["how"] == "universal"
    assert back["step"] == saved["step"] == 12 and back["consumed_samples"] == 96
    for key, tensor in saved["weights"].items():
        assert torch.equal(back["weights"][key], tensor), key
        assert all(torch.equal(a, b) for a, b in zip(back["moments"][key], saved["moments"][key])), key


@pytest.mark.distributed
def test_training_starts_from_an_imported_explicit_model(shakespeare_shards, tmp_path):
    """checkpoint.load naming a model folder: the weights arrive, the injection starts fresh, step 0."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from implicit_megatron.hf.import_explicit import import_explicit

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                 num_attention_heads=4, tie_word_embeddings=True)).save_pretrained(tmp_path / "hf")
    import_explicit(tmp_path / "hf", tmp_path / "imported",  # an explicit folder: no injection module in it
                    tokenizer=ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz")
    result = run_alone(PROBE, tmp_path / "probe", "configs/tiny/llama-implicit.yaml",
                       *args(shakespeare_shards, tmp_path / "run", f"checkpoint.load={tmp_path / 'imported'}"))
    assert result.returncode == 0, result.stdout[-4000:]
    assert ("kept the fresh initialisation of 3 tensors: core.injection.norm.weight, core.injection.proj.weight, "
            "core.injection.proj.bias") in result.stdout
    got = torch.load(tmp_path / "probe-loaded.pt", weights_only=False)
    assert got["how"] == "pretrained" and got["step"] == 0 and got["consumed_samples"] == 0
    imported = load_file(str(tmp_path / "imported" / "model.safetensors"))
    assert {k for k in got["weights"] if not k.startswith("core.injection.")} == set(imported)
    for name, tensor in imported.items():
        assert torch.equal(got["weights"][name], tensor), name
