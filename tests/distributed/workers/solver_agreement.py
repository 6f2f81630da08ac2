"""Worker for test_solver_agreement.py (run by torchrun with 2 processes on gloo).

Rank 0's batch converges after fewer passes than rank 1's. The solver's stop rule, agreed over
the data-parallel group, must make both ranks run the same number of passes; a DeepSpeed ZeRO-3
training step (which gathers parameters with collectives in every pass) must then complete.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from implicit_megatron import build_model, load_config
from implicit_megatron.implicit import solve
from implicit_megatron.train.engine import build_engine, init_distributed

ROOT = Path(__file__).resolve().parents[3]


def gathered(value: int) -> list[int]:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def main() -> None:
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      ["distributed.zero_stage=3", "model.vocab_size=101", "train.global_batch_size=4",
                       "train.micro_batch_size=2", "implicit.weight_norm=false"], world_size=2, check_files=False)
    init_distributed(cfg)
    rank = dist.get_rank()
    own_group = [dist.new_group([r], backend="gloo") for r in range(dist.get_world_size())][rank]

    # 1. The solver alone: a faster contraction on rank 0 than on rank 1.
    rate = 0.2 if rank == 0 else 0.9
    f = lambda z: rate * z + 1.0  # noqa: E731  fixed point 1 / (1 - rate)
    z0 = torch.zeros(2, 8)
    solo = gathered(solve(f, z0, max_iter=200, tol=1e-6, group=own_group)[1].passes)
    agreed = gathered(solve(f, z0, max_iter=200, tol=1e-6)[1].passes)
    assert solo[0] < solo[1], solo
    assert agreed == [solo[1], solo[1]], (solo, agreed)

    # 2. The model under ZeRO-3: find a tolerance at which the two ranks' batches, solved alone,
    #    need different numbers of passes, then train with the agreed stop rule.
    torch.manual_seed(0)
    model = build_model(cfg)
    generator = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, 101, (2, 32), generator=generator)
    if rank == 0:
        ids[:] = 7  # a constant sequence
    x = model.embedding(ids).detach()
    chosen = None
    for tol in (0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005):
        model.core.set_phase(max_iter=24, tol=tol, phantom_steps=2)
        model.core.group = own_group
        with torch.no_grad():
            model.core(x)
        passes = gathered(model.core.last_stats.passes)
        if passes[0] != passes[1]:
            chosen = tol
            break
    assert chosen is not None, "no tolerance separates the ranks' pass counts"
    model.core.group = None  # the data-parallel group: every rank
    engine = build_engine(cfg, model)
    losses = []
    for _ in range(2):
        logits = engine(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        stats = engine.module.core.last_stats
        training_passes = gathered(stats.passes)
        assert training_passes[0] == training_passes[1], training_passes
    assert all(torch.isfinite(torch.tensor(losses)))
    if rank == 0:
        print(f"solver agreement OK: solo passes {passes} at tol {chosen}, agreed {training_passes}, "
              f"losses {losses}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
