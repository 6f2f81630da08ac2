"""The order of the loop's concerns is their priorities': a trainer whose callbacks are registered
shuffled trains the same run, in-process on a one-rank gloo group: the same losses, validations,
checkpoints and log lines, a non-finite step and a loss jump included."""

from __future__ import annotations

import json
import random
import re

import pytest
from support.processes import ROOT

from implicit_megatron import load_config
from implicit_megatron.train import callbacks, loop


class Faults(callbacks.Callback):
    """A NaN loss at step 3 and a reported loss 1000x at step 6 (a jump: no checkpoint there)."""

    def on_loss(self, step, loss):
        return loss * float("nan") if step == 3 else loss

    def on_step_losses(self, step, losses):
        return [loss * 1000.0 for loss in losses] if step == 6 else losses


def run(shards: str, out, capsys, shuffle: int | None) -> tuple[list[dict], list[str], list[str], list]:
    class Shuffled(callbacks.Hooks):
        def __init__(self, given):
            given = list(given)
            if shuffle is not None:
                random.Random(shuffle).shuffle(given)
            super().__init__(given)

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"data.prefixes=[{shards}]", "data.source=null", f"train.output_dir={out}", "train.steps=9",
                       "train.eval_interval=2", "checkpoint.interval=3", "checkpoint.keep_last=10",
                       "train.log_interval=1", "tracking.enabled=false", "train.global_batch_size=2",
                       "train.micro_batch_size=2", "data.seq_len=32", "schedule.warmup_steps=1",
                       "checkpoint.max_loss_jump=4"], world_size=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(callbacks, "Hooks", Shuffled)
        patch.setattr(callbacks, "registered", lambda: [Faults()])
        trainer = loop.Trainer(cfg)
        order = [(type(c).__name__, c.priority) for c in trainer.hooks]
        end = trainer.fit()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # what depends on the machine's speed, not on the run
        for key in [k for k in row if k.startswith(("train/tokens_per_s", "train/mfu", "train/step_seconds", "memory/",
                                                    "time/", "val/seconds"))]:
            del row[key]
    said = [" | ".join(field for field in line.split(" | ") if not re.search(r"elapsed|/step|tok/s|RSS|MFU", field))
            for line in capsys.readouterr().out.splitlines() if line.startswith("[train]")]  # less the timings
    tags = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert end.outcome == "finished"
    return rows, tags, said, order


@pytest.mark.processes  # the MLflow run record asks git for the commit
def test_callbacks_registered_shuffled_train_the_same_run(one_rank, shakespeare_shards, tmp_path, capsys):
    rows, tags, said, order = run(shakespeare_shards, tmp_path / "given", capsys, shuffle=None)
    again = run(shakespeare_shards, tmp_path / "shuffled", capsys, shuffle=7)
    assert [s for s in said if "non-finite" in s] and [s for s in said if "no checkpoint at step 6" in s]
    assert tags == ["bounded-step7", "free-step9"]  # 3 non-finite, 6 a jump: held back; 7 ends the phase
    assert (rows, tags, [s.replace("shuffled", "given") for s in again[2]], again[3]) == (again[0], again[1], said,
                                                                                          order)
    own = [priority for name, priority in order if name != "Faults"]
    assert len(set(own)) == len(own) == 11  # no tie among the loop's own: their order is theirs alone
