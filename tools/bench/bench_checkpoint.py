"""What a checkpoint's integrity costs: save, manifest and the complete-tag check of a real checkpoint.

    python tools/bench/bench_checkpoint.py [--config configs/mamba2/130m-implicit.yaml] [--stage 1]
                                     [--precision fp32] [--output /tmp/bench-checkpoint] [overrides ...]

One process (gloo on CPU, NCCL on a GPU) builds the config's model in a DeepSpeed engine, takes one
optimizer step (so that Adam's moments exist), then saves with `train.checkpointer.save` as training
does. It prints the tag's size, the whole save, the part of it spent writing `manifest.json` (sizes
and the zip directories' CRC-32s), and the check a resume, handoff or export makes first
(`integrity.check_tag`: manifest, every record's data against its CRC-32, weights-only unpickling).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/mamba2/130m-implicit.yaml"))
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--output", default="/tmp/bench-checkpoint")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    from implicit_megatron import build_model, load_config
    from implicit_megatron.checkpoints import integrity
    from implicit_megatron.train import checkpointer as checkpoint
    from implicit_megatron.train.engine import build_engine, init_distributed

    out = Path(args.output)
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(args.config, [f"train.output_dir={out}", f"distributed.zero_stage={args.stage}",
                                    f"distributed.precision={args.precision}", "train.global_batch_size=1",
                                    "train.micro_batch_size=1", "data.seq_len=32", *args.overrides],
                      world_size=1, check_files=False)
    init_distributed(cfg)
    engine = build_engine(cfg, build_model(cfg))
    ids = torch.randint(0, cfg.model.vocab_size, (1, 32), device=engine.device)
    engine.backward(engine(ids, labels=ids))
    engine.step()

    timed = {}
    write_manifest = checkpoint.write_manifest

    def timed_manifest(tag_dir):
        start = time.perf_counter()
        write_manifest(tag_dir)
        timed["manifest"] = time.perf_counter() - start

    checkpoint.write_manifest = timed_manifest
    start = time.perf_counter()
    tag = checkpoint.save(engine, cfg, "step1", {"step": 1})
    save = time.perf_counter() - start
    start = time.perf_counter()
    integrity.check_tag(tag)
    check = time.perf_counter() - start
    size = sum(p.stat().st_size for p in tag.rglob("*") if p.is_file()) / 1e9
    params = sum(p.numel() for p in engine.module.parameters()) / 1e6
    print("| model | ZeRO | precision | checkpoint | save | of it: manifest | complete-tag check |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {Path(args.config).stem} ({params:.0f}M) | {args.stage} | {args.precision} | {size:.2f} GB | "
          f"{save:.2f} s | {1000 * timed['manifest']:.1f} ms ({100 * timed['manifest'] / save:.2f} %) | "
          f"{check:.2f} s ({size / check:.1f} GB/s) |")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
