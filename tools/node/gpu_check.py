"""The first command on a new GPU node: kernels, CUDA graphs, NCCL, memory and a short speed table.

    python tools/node/gpu_check.py [--config mamba2/130m-implicit] [--batch 8] [--seq-len 2048] [--dtype bf16]
    torchrun --nproc_per_node=8 tools/node/gpu_check.py      # the all-reduce over every GPU of the node

One line per check, `ok` or `FAIL` with its figure, in this order:

  kernels   which fused kernels import (mamba_ssm + causal-conv1d, flash-attn)
  nccl      an all-reduce of 256 MiB over the ranks (bus bandwidth where there are several)
  graphs    three training steps of two accumulated micro-batches each, with an optimizer updating
            the weights in place between them, implicit.cuda_graphs=on against eager, for the
            explicit model, (4+1), (24+4) and (24+4) at eps 0.05 (the implicit ones with weight
            norm): the worst loss and gradient relative error (graphs captured and replayed)
  memory    peak memory of a training step of each mode, eager and with graphs (FAIL where graphs
            add more than 15 %)
  fused     each fused kernel against the PyTorch path (tools/node/validate_kernels.py's comparisons);
            last, since compiling and autotuning every fused variant takes minutes on a fresh node

then the speed table of tools/bench/bench_implicit.py for the config (ms/step, tokens/s, MFU, ratio to
explicit; eager and graphs). The graph check runs at --check-batch x --check-seq-len; the table at
--batch x --seq-len. Exits 0 when every check is ok, 1 when one fails, and 2 with one line on a
machine without a GPU. On one H100 at the 130M shapes it takes a few minutes, the kernels'
autotuning included.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import sys
import time
from argparse import Namespace
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_implicit  # noqa: E402
import validate_kernels  # noqa: E402

from implicit_megatron import build_model, load_config  # noqa: E402
from implicit_megatron.implicit import SolverSettings  # noqa: E402
from implicit_megatron.models import kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4, torch.bfloat16: 3e-2}
MODES = {"explicit": None, "(4+1)": SolverSettings(max_iter=4, phantom_steps=1),
         "(24+4)": SolverSettings(max_iter=24, phantom_steps=4),
         "(24+4) eps 0.05": SolverSettings(max_iter=24, tol=0.05, phantom_steps=4)}
MEMORY_LIMIT = 1.15  # graphs may add 15 % to eager's peak memory


@dataclass
class Line:
    check: str
    ok: bool
    figure: str

    def __str__(self) -> str:
        return f"{self.check:<8} {'ok  ' if self.ok else 'FAIL'}  {self.figure}"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def build(config: str, explicit: bool, device, dtype, *overrides: str):
    mode = ["implicit.enabled=false", "curriculum.phases=[]"] if explicit else []
    cfg = load_config(ROOT / "configs" / f"{config}.yaml", [*mode, *overrides], check_files=False)
    torch.manual_seed(0)
    return build_model(cfg).to(device=device, dtype=dtype).train()


def accumulated_step(model, batches) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and accumulated gradients of one step over the micro-batches."""
    model.zero_grad(set_to_none=True)
    losses = []
    for ids in batches:
        loss = model(ids, labels=torch.roll(ids, -1, 1))
        loss.backward()
        losses.append(loss.item())
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def graph_lines(config: str, device, dtype, batch: int, seq_len: int, *overrides: str) -> Iterator[Line]:
    """Graphs against eager for each mode, over three steps of an optimizer that updates the weights
    in place (the first step sees the shape, the second captures, the third replays on moved-on
    weights), the implicit modes with weight norm on (its graph feeds the solver's): the worst loss
    and gradient error over the steps, one line per mode as it is done."""
    for mode, settings in MODES.items():
        normed = () if settings is None else ("implicit.weight_norm=true",)
        models = {graphs: build(config, settings is None, device, dtype, *normed, *overrides)
                  for graphs in ("off", "on")}
        models["on"].load_state_dict(models["off"].state_dict())
        g = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, models["off"].config.vocab_size, (batch, seq_len), generator=g).to(device)
                   for _ in range(2)]
        steps: dict[str, list[tuple[list[float], dict[str, torch.Tensor]]]] = {}
        for graphs, model in models.items():
            if settings is not None:
                model.core.settings = settings
            model.core.cuda_graphs = graphs
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            steps[graphs] = []
            for _ in range(3):
                steps[graphs].append(accumulated_step(model, batches))
                optimizer.step()
        loss_err = grad_err = 0.0
        worst, complete = "", True
        for (eager_losses, eager), (losses, graphed) in zip(steps["off"], steps["on"], strict=True):
            loss_err = max(loss_err, *(abs(a - b) / abs(b) for a, b in zip(losses, eager_losses, strict=True)))
            complete &= set(graphed) == set(eager)
            for name in eager:
                err = rel_err(graphed[name], eager[name]) if name in graphed else float("inf")
                if err >= grad_err:
                    worst, grad_err = name, err
        used = any(key[0] == "grad" for key in models["on"].core.graphs.cache)
        ok = used and complete and max(loss_err, grad_err) <= TOLERANCE[dtype]
        yield Line("graphs", ok, f"{mode}{' with weight norm' if normed else ''}: loss {loss_err:.1e}, "
                                 f"worst gradient {grad_err:.1e} ({worst}), 3 steps with updated weights"
                                 + ("" if used else "; the step ran eagerly"))


def memory_lines(config: str, batch: int, seq_len: int, dtype, *overrides: str) -> Iterator[Line]:
    for mode, settings in MODES.items():
        model = build(config, settings is None, "cuda", dtype, *overrides)
        if settings is not None:
            model.core.settings = settings
        ids = torch.randint(0, model.config.vocab_size, (batch, seq_len), device="cuda")
        peaks = {}
        for graphs in ("off", "on"):
            model.core.cuda_graphs = graphs
            model.core.graphs.drop()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            for _ in range(3):  # eager, capture, replay
                accumulated_step(model, [ids])
            peaks[graphs] = torch.cuda.max_memory_allocated() / 2**30
        ratio = peaks["on"] / peaks["off"]
        yield Line("memory", ratio <= MEMORY_LIMIT,
                   f"{mode}: eager {peaks['off']:.2f} GiB, graphs {peaks['on']:.2f} GiB ({ratio:.2f}x)")
        del model
        torch.cuda.empty_cache()


def collective_line(device) -> Line:
    """An all-reduce of 256 MiB of float32 over every rank (a process group of one where torchrun
    started none)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    world = dist.get_world_size()
    x = torch.ones(64 * 2**20, device=device)
    dist.all_reduce(x)  # warm-up: the communicators are made on first use
    x.fill_(1.0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ok = bool((x == world).all())
    busbw = 2 * (world - 1) / world * x.numel() * 4 / seconds / 1e9
    return Line("nccl" if device.type == "cuda" else "gloo", ok,
                f"{world} rank{'s' if world > 1 else ''}, {seconds * 1e3:.1f} ms" +
                (f", bus bandwidth {busbw:.0f} GB/s" if world > 1 else ""))


def fused_lines(dtype) -> list[Line]:
    installed = kernels.installed()
    if not any(installed.values()):
        return []
    report = validate_kernels.Report()
    args = Namespace(batch=2, seq_len=1000, d_model=768, step_tokens=16, steps=5)
    device = torch.device("cuda")
    if installed["mamba_ssm+causal_conv1d"]:
        validate_kernels.validate_mamba2(args, device, dtype, report)
    if installed["flash_attn"]:
        validate_kernels.validate_llama(args, device, report)
    return [Line("fused", not report.failed, "every fused path agrees with the PyTorch path" if not
                 report.failed else f"differs from the PyTorch path: {', '.join(report.failed)}")]


def speed_table(config: str, batch: int, seq_len: int, dtype_name: str) -> None:
    args = Namespace(configs=config, batch=batch, seq_len=seq_len, repeats=3, graphs="off,auto", loss="chunked",
                     modes="explicit,(4+1),(24+4) fixed,(24+4) eps=0.05", vocab_size=None, profile=False,
                     top_kernels=0, compile=False, extras=False)
    rows = bench_implicit.bench_config(config, args, torch.device("cuda"), DTYPES[dtype_name])
    bench_implicit.print_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="mamba2/130m-implicit", help="under configs/, without .yaml")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--check-batch", type=int, default=2, help="micro-batch of the graph check")
    parser.add_argument("--check-seq-len", type=int, default=512)
    parser.add_argument("--skip-speed", action="store_true", help="the checks only, no speed table")
    parser.add_argument("--skip-fused", action="store_true",
                        help="no fused-against-PyTorch comparisons (tools/node/validate_kernels.py runs them alone)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no GPU on this machine (torch.cuda.is_available() is False); nothing to check")
        return 2
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank0 = int(os.environ.get("RANK", "0")) == 0
    dtype = DTYPES[args.dtype]
    lines = [collective_line(torch.device("cuda"))]
    if rank0:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.config}, {args.dtype}", flush=True)
        lines = [Line("kernels", True, ", ".join(f"{name} {'yes' if ok else 'no'}"
                                                 for name, ok in kernels.installed().items())), *lines]
        for line in lines:
            print(line, flush=True)
        # our own code first (graphs, memory), then the third-party kernels against the PyTorch path:
        # their comparisons compile and autotune every fused variant, minutes on a fresh node
        checks: list[Iterable[Line]] = [
            graph_lines(args.config, torch.device("cuda"), dtype, args.check_batch, args.check_seq_len),
            memory_lines(args.config, args.batch, args.seq_len, dtype)]
        if not args.skip_fused:
            checks.append(fused_lines(dtype))
        for line in itertools.chain(*checks):  # each printed as it is done
            print(line, flush=True)
            lines.append(line)
        if not args.skip_speed:
            speed_table(args.config, args.batch, args.seq_len, args.dtype)
        failed = [line for line in lines if not line.ok]
        print(f"{len(lines) - len(failed)} ok, {len(failed)} FAIL", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if rank0 and any(not line.ok for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
