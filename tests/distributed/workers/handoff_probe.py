"""Worker for test_handoff.py: start a Trainer, load its checkpoint as a launch would, and save
what it loaded (full fp32 weights, Adam moments, step, LR, data position) for comparison.

    torchrun ... handoff_probe.py OUT CONFIG [overrides]           OUT-loaded.pt
    torchrun ... handoff_probe.py OUT --train CONFIG [overrides]   OUT-loaded.pt, then trains on as the
                                                                   launch would: OUT-saved.pt holds
                                                                   what its last checkpoint saved
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from implicit_megatron import load_config
from implicit_megatron.train.loop import Trainer
from implicit_megatron.train.schedule import learning_rate
from implicit_megatron.utils.lean_imports import import_deepspeed


def record(trainer: Trainer, path: str, how: str | None) -> None:
    """The trainer's state as a launch sees it, gathered from every rank (collectives: all ranks call)."""
    import_deepspeed()  # imported by the trainer already; here for whoever calls this first
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    weights, moments = {}, {}
    optimizer = trainer.engine.optimizer
    if hasattr(optimizer, "_hp_optimizer_states_linked"):  # ZeRO-1/2
        # DeepSpeed links each parameter to its optimizer state once, right after the first group's
        # first step, when the other groups have no state yet (or after a load): link again now.
        optimizer._hp_optimizer_states_linked = False
        optimizer._lazy_init_hp_params_optimizer_state()
    for name, param in trainer.engine.module.named_parameters():  # collectives under ZeRO-3: all ranks
        full = safe_get_full_fp32_param(param)  # None under ZeRO-0: the parameter is the fp32 weight
        weights[name] = (param if full is None else full).detach().float().clone()
        # None under ZeRO-0, or before the first step of a fresh optimizer
        moments[name] = tuple(safe_get_full_optimizer_state(param, key) for key in ("exp_avg", "exp_avg_sq"))
    groups = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in trainer.engine.optimizer.param_groups]
    p = trainer.progress
    if dist.get_rank() == 0:
        torch.save({"weights": weights, "moments": moments, "step": p.step, "consumed_samples": p.consumed_samples,
                    "lr": learning_rate(p.step, trainer.cfg), "data": trainer.batches.state_dict(), "how": how,
                    "groups": groups}, path)
    dist.barrier()


def main() -> None:
    out, *rest = sys.argv[1:]
    train = rest[0] == "--train"
    config, *overrides = rest[1:] if train else rest
    cfg = load_config(config, overrides, world_size=int(os.environ["WORLD_SIZE"]))
    trainer = Trainer(cfg)
    resume, save = trainer.resume, trainer.save

    def resume_and_record() -> None:
        resume()
        if trainer.source is not None:  # a fresh optimizer has no state to gather before its first step
            record(trainer, f"{out}-loaded.pt", trainer.source.how)

    def save_and_record() -> str:
        tag = save()
        record(trainer, f"{out}-saved.pt", "saved")  # the last save's stays
        return tag

    if not train:
        resume_and_record()
        return
    trainer.resume, trainer.save = resume_and_record, save_and_record  # type: ignore[method-assign]
    trainer.fit()


if __name__ == "__main__":
    main()
