"""catbAbI through the same trainer on 2 CPU processes (gloo): the implicit model's unrolled warm-up
hands off to the fixed-point phase, and validation reports the answer accuracy overall and per task."""

from __future__ import annotations

import json

from support.processes import ROOT, run_torchrun

FIXTURE = ROOT / "tests/fixtures/catbabi"


def test_catbabi_trains_and_reports_accuracy_per_task(tmp_path):
    args = [f"task.catbabi.folder={FIXTURE}", "model.vocab_size=32", "model.d_model=32", "model.mamba2.headdim=16",
            "data.seq_len=24", "train.global_batch_size=8", "train.micro_batch_size=2", "train.steps=4",
            "train.eval_interval=2", "train.log_interval=1", "train.eval_samples=9", f"train.output_dir={tmp_path}",
            "tracking.enabled=false", "distributed.precision=fp32", "distributed.zero_stage=1",
            "schedule.warmup_steps=1", "implicit.eval_max_iter=16",
            "curriculum.phases=[{name: unrolled, kind: unrolled, fraction: 0.5, max_iter: 3, phantom_steps: 0}, "
            "{name: deq, kind: free, fraction: 0.5, max_iter: 8, phantom_steps: 2, tol: 0.03}]"]
    result = run_torchrun("-m", "implicit_megatron.train", "configs/catbabi/mamba2-implicit.yaml", *args)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "done at step 4: validation accuracy" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in rows if "train/loss" in r}
    assert train[1]["solver/iterations"] == 0 and train[4]["solver/iterations"] >= 1  # unrolled, then the DEQ
    evals = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        per_task = [r["val/accuracy_task1"], r["val/accuracy_task2"]]
        assert min(per_task) <= r["val/accuracy"] <= max(per_task) and "val/accuracy_task3" not in r
        assert "val/ppl" not in r  # an accuracy task
        assert 1 <= r["val/solver_iterations"] <= 16
    assert json.loads((tmp_path / "catbabi_vocab.json").read_text())["words"][:3] == ["<pad>", "<eos>", "<unk>"]
