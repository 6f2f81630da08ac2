"""Exporting a trained checkpoint: the exported folder computes what the training model computed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from support.processes import ROOT, run_torchrun

from implicit_megatron import build_model, from_pretrained
from implicit_megatron.export import read_checkpoint


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [0, 2])
def test_export_then_from_pretrained_gives_the_training_models_logits(stage, shakespeare_shards, tmp_path):
    run = tmp_path / "run"
    args = [f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={run}", "train.steps=6",
            "train.eval_interval=6", "tracking.enabled=false", "implicit.weight_norm=true",
            f"distributed.zero_stage={stage}"]
    result = run_torchrun("-m", "implicit_megatron.train", "configs/tiny/llama-implicit.yaml", *args)
    assert result.returncode == 0, result.stdout[-3000:]
    out = tmp_path / "export"
    converted = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "export", str(run / "checkpoints"),
                                str(out)], cwd=ROOT, capture_output=True, text=True)
    assert converted.returncode == 0, converted.stderr[-3000:]

    # The training model: the checkpoint's module weights (fp32 training: the master weights), weight norm on.
    saved = torch.load(run / "checkpoints" / "free-step6" / "mp_rank_00_model_states.pt", weights_only=False)
    state, cfg = read_checkpoint(run / "checkpoints")
    trained = build_model(cfg).eval()
    trained.load_state_dict(saved["module"] if stage == 0 else state, strict=True)
    if stage != 0:  # ZeRO-2 keeps full fp32 module weights on rank 0 too: an independent copy
        for name, tensor in saved["module"].items():
            assert torch.equal(tensor.float(), state[name]), name
    assert any("parametrizations" in name for name in state)

    exported = from_pretrained(out)
    assert not any("parametrizations" in name for name in exported.state_dict())
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "gpt-neox-20b.json.xz", "model.safetensors"]
    ids = torch.randint(0, 50277, (2, 24))
    with torch.no_grad():
        expected, got = trained(ids), exported(ids)
    assert (got - expected).abs().max().item() < 1e-5 * expected.abs().max().item()


def test_clear_errors(tmp_path):
    bad = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "export", str(tmp_path), str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a checkpoint folder" in bad.stderr
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path)
