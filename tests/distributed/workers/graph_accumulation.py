"""Worker for test_graph_accumulation.py (torchrun).

Trains the tiny implicit Mamba2 with weight norm in its (4+1) phase through DeepSpeed engines, two
micro-batches per step, four steps, with the passes eager and as CUDA graphs, under the ZeRO stages
and precisions named on the command line. The micro-batches change length between steps, and the
core keeps at most three shapes' graphs, so graphs are captured in the middle of an accumulation,
evicted and captured again. At every accumulation boundary it takes each parameter's full gradient
(deepspeed.utils.safe_get_full_grad, any stage) and prints, per setting, both runs' losses and the
largest relative difference of any parameter's gradient.

    --device cpu    CUDA graphs emulated on the CPU (tests/support/cuda_graph_emulation.py), gloo
    --device cuda   the GPU itself, NCCL
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from implicit_megatron import build_model, load_config  # noqa: E402
from implicit_megatron.implicit import graph_runtime  # noqa: E402
from implicit_megatron.train.engine import build_engine, init_distributed  # noqa: E402
from implicit_megatron.utils.lean_imports import import_deepspeed  # noqa: E402

LENGTHS = [(16, 16), (16, 24), (24, 32), (16, 16)]  # per step, per micro-batch


def run(stage: int, precision: str, graphs: str, device: str) -> tuple[list[float], list[dict]]:
    import_deepspeed()  # as a rank does (without MLflow: 1.6 s of CPU per rank)
    from deepspeed.utils import safe_get_full_grad

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"distributed.zero_stage={stage}", f"distributed.precision={precision}",
                       "model.vocab_size=101", "train.global_batch_size=8", "train.micro_batch_size=2",
                       "implicit.weight_norm=true", f"implicit.cuda_graphs={graphs}"],
                      world_size=dist.get_world_size() if dist.is_initialized() else 2, check_files=False)
    init_distributed(cfg)
    torch.manual_seed(0)
    engine = build_engine(cfg, build_model(cfg))
    generator = torch.Generator().manual_seed(dist.get_rank())
    losses, grads = [], []
    for step_lengths in LENGTHS:
        for length in step_lengths:
            ids = torch.randint(0, 101, (2, length), generator=generator).to(device)
            loss = engine(ids, labels=torch.roll(ids, -1, 1))
            engine.backward(loss)
            if engine.is_gradient_accumulation_boundary():
                grads.append({name: safe_get_full_grad(p).float().cpu().clone()
                              for name, p in engine.module.named_parameters() if p.requires_grad})
            engine.step()
            losses.append(loss.item())
    used = [key[0] for key in engine.module.core.graphs.cache]
    assert (graphs == "on") == ("grad" in used), used
    return losses, grads


def largest_difference(graphed: list[dict], eager: list[dict]) -> float:
    worst = 0.0
    for got, expected in zip(graphed, eager, strict=True):
        assert set(got) == set(expected)
        for name, e in expected.items():
            worst = max(worst, ((got[name] - e).norm() / e.norm().clamp_min(1e-30)).item())
    return worst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--stages", default="0,1,2")
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args()
    undo = None
    if args.device == "cpu":
        from support.cuda_graph_emulation import install

        undo = install()
    graph_runtime.MAX_SHAPE_GRAPHS = 3  # so that four lengths evict and capture again
    try:
        for stage in map(int, args.stages.split(",")):
            for precision in args.precisions.split(","):
                eager_losses, eager_grads = run(stage, precision, "off", args.device)
                losses, grads = run(stage, precision, "on", args.device)
                if dist.get_rank() == 0:
                    print("RESULT " + json.dumps({"stage": stage, "precision": precision, "eager": eager_losses,
                                                  "graphed": losses, "steps": len(grads),
                                                  "gradient_difference": largest_difference(grads, eager_grads)}),
                          flush=True)
    finally:
        if undo is not None:
            undo()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
