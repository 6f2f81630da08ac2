"""Cost of the implicit core relative to the explicit model, on the machine it runs on.

    python tools/bench/bench_implicit.py [--configs tiny/mamba2-implicit,tiny/llama-implicit] [--device cpu|cuda]
        [--dtype fp32|bf16] [--batch 8] [--seq-len 128] [--graphs off,auto] [--modes explicit,(4+1),...]
        [--loss chunked|plain] [--vocab-size N] [--profile] [--extras]

    # the GPU table of the paper's sizes (language-model training step without optimizer):
    python tools/bench/bench_implicit.py --device cuda --dtype bf16 --configs mamba2/130m-implicit \\
        --batch 8 --seq-len 2048 --graphs off,auto

One row per (config, mode, graphs): a training step (forward, loss, backward) of explicit, (4+1),
(4+4), (24+4) at 24 fixed passes, (24+4) with eps 0.05 and unrolled 28; ms/step, tokens/s, MFU
(counted as train/flops.py counts), peak memory, the host's share (time until the step's Python
returns, before waiting for the GPU), with --profile the GPU's busy share of the step, and the
ratio to explicit under the same graph setting. On CPU, the bytes autograd saved for backward
(flat in s, growing in k). --extras adds passes to eps 0.05 with plain and Anderson iteration and
sequential-mode time per token. With the GPT-NeoX vocabulary the head dominates a tiny model's
step; --vocab-size 512 shows the backbone's share, which is what the solver multiplies.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from implicit_megatron import build_model, load_config
from implicit_megatron.config import AndersonSettings
from implicit_megatron.implicit import SolverSettings
from implicit_megatron.train.flops import peak_flops_per_device, step_flops

ROOT = Path(__file__).resolve().parents[2]
MODES = {
    "explicit": None,
    "(4+1)": SolverSettings(max_iter=4, phantom_steps=1),
    "(4+4)": SolverSettings(max_iter=4, phantom_steps=4),
    "(24+4) fixed": SolverSettings(max_iter=24, phantom_steps=4),
    "(24+4) eps=0.05": SolverSettings(max_iter=24, tol=0.05, phantom_steps=4),
    "unrolled 28": SolverSettings(max_iter=28, gradient="unrolled"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_step(model, ids, labels, loss: str):
    def run():
        model.zero_grad(set_to_none=True)
        if loss == "chunked":
            out = model(ids, labels=labels)
        else:
            out = F.cross_entropy(model(ids).float().flatten(0, 1), labels.flatten())
        out.backward()
    return run


def timed(fn, device: torch.device, repeats: int) -> tuple[float, float]:
    """Median wall and host seconds per call, after two warm-up calls (capture, autotuning)."""
    for _ in range(2):
        fn()
    sync(device)
    walls, hosts = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        hosts.append(time.perf_counter() - start)
        sync(device)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), statistics.median(hosts)


def gpu_busy_seconds(fn, top: int, label: str) -> float:
    """Kernel time of one call, from the profiler (the GPU's work, without its idle gaps); with
    top > 0 the most expensive kernels are printed."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if top:
        by_name: dict[str, float] = {}
        for e in kernels:
            by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time
        print(f"top kernels of {label} (ms):")
        for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {us / 1e3:8.2f}  {name[:110]}")
    return sum(e.device_time for e in kernels) / 1e6


def saved_mib(fn) -> float:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total / 2**20


def emit(rows: list, row: tuple) -> None:
    """Keep the row for the table and show it at once (a long run that dies still shows its rows)."""
    rows.append(row)
    print("  ".join(str(v) for v in row if v != ""), flush=True)


def build(name: str, args, explicit: bool, device, dtype):
    extra = [f"model.vocab_size={args.vocab_size}"] if args.vocab_size else []
    mode = ["implicit.enabled=false", "curriculum.phases=[]"] if explicit else ["implicit.enabled=true"]
    cfg = load_config(ROOT / "configs" / f"{name}.yaml", [*mode, *extra], check_files=False)
    torch.manual_seed(0)
    model = build_model(cfg).to(device=device, dtype=dtype).train()
    if args.compile:
        model.core.backbone.compile_blocks()
    return cfg, model


def bench_config(name: str, args, device, dtype) -> list[tuple]:
    cfg, implicit_model = build(name, args, False, device, dtype)
    _, explicit_model = build(name, args, True, device, dtype)
    ids = torch.randint(0, cfg.model.vocab_size, (args.batch, args.seq_len + 1), device=device)
    ids, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    tokens = args.batch * args.seq_len
    backbone_params = sum(p.numel() for p in explicit_model.core.backbone.parameters())
    peak = peak_flops_per_device(cfg) if device.type == "cuda" else None
    rows, base = [], {}
    for graphs in args.graphs.split(","):
        for mode in args.modes.split(","):
            settings = MODES[mode]
            model = explicit_model if settings is None else implicit_model
            model.core.cuda_graphs = graphs
            model.core.graphs.drop()
            model.core.settings = settings
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            step = train_step(model, ids, labels, args.loss)
            try:
                seconds, host = timed(step, device, args.repeats)
            except torch.OutOfMemoryError:
                emit(rows, (name, mode, graphs, "OOM", "", "", "", "", "", "", "", ""))
                model.zero_grad(set_to_none=True)
                continue
            stats = model.core.last_stats
            passes, phantom = (stats.passes, stats.phantom_passes) if settings else (0, 1)
            if settings is not None and settings.gradient == "unrolled":
                passes, phantom = 0, settings.max_iter
            base.setdefault(graphs, seconds)
            flops = step_flops(cfg, backbone_params, tokens, args.seq_len, passes, phantom)
            mfu = f"{100 * flops / seconds / peak:.1f}%" if peak else "-"
            memory = f"{torch.cuda.max_memory_allocated() / 2**30:.1f}" if device.type == "cuda" else "-"
            busy = "-"
            if args.profile and device.type == "cuda":
                busy = f"{100 * gpu_busy_seconds(step, args.top_kernels, f'{mode} {graphs}') / seconds:.0f}%"
            saved = f"{saved_mib(step):.1f}" if device.type == "cpu" and graphs == "off" else "-"
            emit(rows, (name, mode, graphs, f"{seconds * 1e3:.1f}", f"{tokens / seconds:,.0f}", mfu,
                         f"{seconds / base[graphs]:.2f}x", f"{passes}+{phantom}", memory,
                         f"{100 * host / seconds:.0f}%", busy, saved))
            model.zero_grad(set_to_none=True)
    if args.extras:
        rows += extras(name, implicit_model, explicit_model, ids, args)
    return rows


def extras(name: str, model, explicit_model, ids, args) -> list[tuple]:
    """Passes to eps 0.05 (plain and Anderson) and sequential mode per token."""
    rows = []
    x = model.embedding(ids).detach()
    with torch.no_grad():
        for label, anderson in (("plain", AndersonSettings()), ("anderson", AndersonSettings(enabled=True))):
            model.core.settings = SolverSettings(max_iter=100, tol=0.05, phantom_steps=0, anderson=anderson)
            model.core(x)
            stats = model.core.last_stats
            rows.append((name, f"passes to eps=0.05 ({label})", "", "", "", "", "", f"{stats.passes}", "", "",
                         "", f"converged {stats.converged_frac:.2f}"))
    model.eval()
    explicit_model.eval()
    tokens = x[:1, : min(32, args.seq_len)]
    explicit = timed(lambda: explicit_model.core.forward_sequential(tokens), x.device, 1)[0] / tokens.shape[1]
    model.core.settings = SolverSettings(max_iter=24, tol=0.05, phantom_steps=4, eval_factor=1)
    implicit = timed(lambda: model.core.forward_sequential(tokens), x.device, 1)[0] / tokens.shape[1]
    rows.append((name, "sequential per token (24+4)", "off", f"{implicit * 1e3:.2f}", "", "",
                 f"{implicit / explicit:.2f}x", "", "", "", "", f"explicit step {explicit * 1e3:.2f} ms"))
    return rows


def print_table(rows: list[tuple]) -> None:
    header = ("config", "mode", "graphs", "ms/step", "tokens/s", "MFU", "vs explicit", "passes", "peak GiB",
              "host", "GPU busy", "saved MiB / note")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="tiny/mamba2-implicit,tiny/llama-implicit")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--graphs", default="off", help="implicit.cuda_graphs settings to compare, e.g. off,auto")
    parser.add_argument("--loss", default="chunked", choices=["chunked", "plain"],
                        help="chunked: the trainer's loss; plain: float32 logits + F.cross_entropy")
    parser.add_argument("--vocab-size", type=int, default=None, help="override the vocabulary (default: config's)")
    parser.add_argument("--profile", action="store_true", help="GPU busy share of a step (torch.profiler)")
    parser.add_argument("--top-kernels", type=int, default=0, help="with --profile: print the N costliest kernels")
    parser.add_argument("--compile", action="store_true", help="torch.compile the blocks (train.compile)")
    parser.add_argument("--extras", action="store_true", help="solver passes to eps and sequential mode")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    print_table([row for name in args.configs.split(",") for row in bench_config(name, args, device, dtype)])
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"\ntorch {torch.__version__}, {where}, {args.dtype}, batch {args.batch} x {args.seq_len} tokens, "
          f"vocabulary {args.vocab_size or 'config'}, {args.loss} loss{', compiled blocks' if args.compile else ''}")


if __name__ == "__main__":
    main()
