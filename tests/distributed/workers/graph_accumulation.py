"""Worker for test_graph_accumulation.py (torchrun, 2 processes on gloo).

Trains the tiny implicit Mamba2 in its (4+1) phase through DeepSpeed engines, two micro-batches per
step, three steps, with the passes eager and as CUDA graphs (emulated on the CPU), under ZeRO-0, -1
and -2 in fp32 and bf16. Prints one line per setting with both runs' losses and gradient norms.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from support.cuda_graph_emulation import install  # noqa: E402

from implicit_megatron import build_model, load_config  # noqa: E402
from implicit_megatron.train.engine import build_engine, init_distributed  # noqa: E402


def run(stage: int, precision: str, graphs: str) -> tuple[list[float], list[float]]:
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      [f"distributed.zero_stage={stage}", f"distributed.precision={precision}",
                       "model.vocab_size=101", "train.global_batch_size=8", "train.micro_batch_size=2",
                       "implicit.weight_norm=true", f"implicit.cuda_graphs={graphs}"],
                      world_size=2, check_files=False)
    init_distributed(cfg)
    torch.manual_seed(0)
    engine = build_engine(cfg, build_model(cfg))
    assert engine.gradient_accumulation_steps() == 2
    generator = torch.Generator().manual_seed(dist.get_rank())
    losses, norms = [], []
    for _ in range(3):
        for _ in range(2):
            ids = torch.randint(0, 101, (2, 16), generator=generator)
            loss = engine(ids, labels=torch.roll(ids, -1, 1))
            engine.backward(loss)
            if engine.is_gradient_accumulation_boundary() and stage == 0 and precision == "fp32":
                norms.append(torch.linalg.vector_norm(torch.stack(
                    [p.grad.norm() for p in engine.module.parameters() if p.grad is not None])).item())
            engine.step()
            losses.append(loss.item())
        if not (stage == 0 and precision == "fp32"):
            norms.append(float(engine.get_global_grad_norm()))
    used = [key[0] for key in engine.module.core._graphs]
    assert (graphs == "on") == ("grad" in used), used
    return losses, norms


def main() -> None:
    undo = install()
    try:
        for stage in (0, 1, 2):
            for precision in ("fp32", "bf16"):
                eager = run(stage, precision, "off")
                graphed = run(stage, precision, "on")
                if dist.get_rank() == 0:
                    print("RESULT " + json.dumps({"stage": stage, "precision": precision, "eager": eager,
                                                  "graphed": graphed}), flush=True)
    finally:
        undo()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
