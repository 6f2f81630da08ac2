"""Forward + backward throughput of the explicit backbones on the machine it runs on.

    python tools/bench/bench_backbones.py [--configs tiny/mamba2-explicit,mamba2/130m-explicit] \
        [--seq-len 2048] [--batch 8] [--steps 10] [--dtype bf16] [--device cuda] [--threads N]

One table row per config: parameters, the path taken (fused kernels or PyTorch), time per
training step (language-model loss, forward + backward, no optimizer) and tokens per second.
Configs are names under configs/ (without .yaml) or paths to YAML files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from implicit_megatron import build_model, load_config
from implicit_megatron.models import kernels
from implicit_megatron.models.registry import spec_of

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIGS = "tiny/mamba2-explicit,tiny/llama-explicit,mamba2/130m-explicit,llama/130m-explicit"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def config_path(name: str) -> Path:
    path = Path(name)
    return path if path.suffix in (".yaml", ".yml") else ROOT / "configs" / f"{name}.yaml"


def kernel_path(arch: str, device: torch.device, dtype: torch.dtype) -> str:
    return spec_of(arch).kernels_in_use(torch.empty(0, device=device, dtype=dtype))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    cfg = load_config(config_path(name), check_files=False).model
    model = build_model(cfg, device=device, dtype=dtype).train()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
    inputs, targets = ids[:, :-1], ids[:, 1:]

    def train_step() -> None:
        logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        train_step()
    sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    sync(device)
    seconds = (time.perf_counter() - start) / args.steps
    return {"config": name, "arch": cfg.arch, "params": f"{model.num_parameters() / 1e6:.1f}M",
            "path": kernel_path(cfg.arch, device, dtype), "shape": f"{args.batch}x{args.seq_len}",
            "ms/step": f"{seconds * 1e3:.1f}", "tokens/s": f"{args.batch * args.seq_len / seconds:,.0f}"}


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print(" | ".join(c.ljust(widths[c]) for c in cols))
    print("-+-".join("-" * widths[c] for c in cols))
    for r in rows:
        print(" | ".join(str(r[c]).ljust(widths[c]) for c in cols))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated config names or paths")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="parameter and activation dtype (default: bf16 on GPU, fp32 on CPU)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {where}; dtype: {dtype}; kernels installed: {kernels.installed()}")
    rows = [bench(name.strip(), args, device, dtype) for name in args.configs.split(",") if name.strip()]
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
