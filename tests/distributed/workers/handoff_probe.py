"""Worker for test_handoff.py: start a Trainer, load its checkpoint as a launch would, and save
what it loaded (full fp32 weights, Adam moments, step, LR, data position) for comparison.

    torchrun ... handoff_probe.py OUT.pt CONFIG [overrides]
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

from implicit_megatron import load_config
from implicit_megatron.train.loop import Trainer
from implicit_megatron.train.schedule import learning_rate


def main() -> None:
    out, config, *overrides = sys.argv[1:]
    cfg = load_config(config, overrides, world_size=int(os.environ["WORLD_SIZE"]))
    trainer = Trainer(cfg)
    trainer.resume()
    weights, moments = {}, {}
    link = getattr(trainer.engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:  # ZeRO-1/2 link each parameter to its optimizer state at the first step only
        link()
    for name, param in trainer.engine.module.named_parameters():  # collectives under ZeRO-3: all ranks
        full = safe_get_full_fp32_param(param)  # None under ZeRO-0: the parameter is the fp32 weight
        weights[name] = (param if full is None else full).detach().float().clone()
        # None under ZeRO-0, or before the first step of a fresh optimizer
        moments[name] = tuple(safe_get_full_optimizer_state(param, key) for key in ("exp_avg", "exp_avg_sq"))
    groups = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in trainer.engine.optimizer.param_groups]
    p = trainer.progress
    if dist.get_rank() == 0:
        torch.save({"weights": weights, "moments": moments, "step": p.step, "consumed_samples": p.consumed_samples,
                    "lr": learning_rate(p.step, cfg), "data": trainer.batches.state_dict(), "how": trainer.source.how,
                    "groups": groups}, out)
    dist.barrier()


if __name__ == "__main__":
    main()
