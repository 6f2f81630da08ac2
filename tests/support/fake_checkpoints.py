"""Checkpoint tag folders with the files a real one has (torch.save'd stand-ins), for the tests of
what a launch decides from them without training: which kind of start, which phases are done."""

from __future__ import annotations

from pathlib import Path

import torch

from implicit_megatron import load_config
from support.processes import ROOT

TINY = str(ROOT / "configs/tiny/mamba2-implicit.yaml")


def fake_checkpoint(out: Path, tag: str, world_size: int, zero_stage: int, precision: str = "fp32",
                    *overrides: str, client: dict | None = None) -> Path:
    """A tag folder of run folder `out`, named by `latest`; its model states hold the run config (with
    `overrides`) and `client`. Its folder."""
    cfg = load_config(TINY, [f"distributed.zero_stage={zero_stage}", f"distributed.precision={precision}",
                             *overrides])
    folder = out / "checkpoints" / tag
    folder.mkdir(parents=True)
    states = {"dp_world_size": world_size, "config": cfg.to_dict(), **(client or {})}
    for rank in range(world_size):
        torch.save({}, folder / f"rng_rank{rank}.pt")
        if zero_stage == 3:
            torch.save(states, folder / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
        if zero_stage:  # named as DeepSpeed names them: by the precision
            prefix = "bf16_" if precision == "bf16" else ""
            torch.save({}, folder / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    if zero_stage != 3:
        torch.save(states, folder / "mp_rank_00_model_states.pt")
    (out / "checkpoints" / "latest").write_text(tag + "\n")
    return folder
