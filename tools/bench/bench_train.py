"""Training throughput on the machine it runs on: explicit, (4+1), (24+4) and each ZeRO stage.

    python tools/bench/bench_train.py [--config configs/tiny/mamba2-implicit.yaml] [--nproc 2] [--steps 12]
                                [--stages 0,1,2,3] [--modes explicit,(4+1),...] [overrides ...]

Each row is a real launch (torchrun, gloo on CPU or NCCL/RCCL on GPUs) of `implicit_megatron.train`
on the bundled corpus; the figures are medians over the steps after the first two. MFU appears
where the peak FLOPs of the device are known (GPUs) or given with train.peak_tflops=...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {
    "explicit": ["implicit.enabled=false", "curriculum.phases=[]"],
    "(4+1)": ["curriculum.phases=[]", "implicit.max_iter=4", "implicit.phantom_steps=1", "implicit.tol=null"],
    "(24+4) eps=0.05": ["curriculum.phases=[]", "implicit.max_iter=24", "implicit.phantom_steps=4",
                        "implicit.tol=0.05"],
}


def launch(config: str, nproc: int, out: Path, overrides: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "implicit_megatron.train", config, f"train.output_dir={out}", "train.log_interval=1",
           "tracking.enabled=false", "checkpoint.interval=100000", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, os.cpu_count() // nproc)))}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"launch failed ({' '.join(overrides)}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    for line in (result.stdout + result.stderr).splitlines():  # the passes' CUDA graph status, if not plain
        if "CUDA graph" in line:
            print(f"  {' '.join(o for o in overrides if 'implicit' in o)}: {line.strip()}", flush=True)
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]


def summarise(rows: list[dict], tokens_per_step: int) -> dict:
    steady = rows[2:] or rows
    tps = statistics.median(r["train/tokens_per_s"] for r in steady)
    mfu = [r["train/mfu"] for r in steady if "train/mfu" in r]
    passes = [r.get("solver/iterations", 0) for r in steady]
    return {"tokens/s": tps, "ms/step": 1e3 * tokens_per_step / tps, "mfu": statistics.median(mfu) if mfu else None,
            "passes": statistics.mean(passes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny/mamba2-implicit.yaml")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from implicit_megatron import load_config
    from implicit_megatron.train.tasks.shards import prepare_shards

    cfg = load_config(ROOT / args.config, args.overrides, world_size=args.nproc)
    prepare_shards(cfg)
    tokens = cfg.train.global_batch_size * cfg.data.seq_len
    base = [f"train.steps={args.steps}", f"train.eval_interval={10 * args.steps}", "schedule.warmup_steps=1",
            *args.overrides]
    modes = args.modes.split(",")
    runs = [(mode, 1, MODES[mode]) for mode in modes]
    runs += [("(4+1)", int(s), MODES["(4+1)"]) for s in args.stages.split(",") if int(s) != 1 and "(4+1)" in modes]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (mode, stage, extra) in enumerate(runs):
            rows = launch(args.config, args.nproc, Path(tmp) / str(i),
                          [*base, *extra, f"distributed.zero_stage={stage}"])
            results.append((mode, stage, summarise(rows, tokens)))
    explicit = results[0][2]["ms/step"]
    zero1 = {mode: r["ms/step"] for mode, stage, r in results if stage == 1}
    header = ("mode", "ZeRO", "passes", "ms/step", "tokens/s", "vs explicit", "vs ZeRO-1", "MFU")
    table = [header]
    for mode, stage, r in results:
        table.append((mode, str(stage), f"{r['passes']:.1f}", f"{r['ms/step']:.0f}", f"{r['tokens/s']:.0f}",
                      f"{r['ms/step'] / explicit:.2f}x", f"{r['ms/step'] / zero1[mode]:.2f}x",
                      f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for j, row in enumerate(table):
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))
        if j == 0:
            print(" | ".join("-" * w for w in widths))
    batch = f"{cfg.train.global_batch_size} x {cfg.data.seq_len}"
    print(f"\n{args.config}, {args.nproc} processes, {batch} tokens per step")


if __name__ == "__main__":
    main()
