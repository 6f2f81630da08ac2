"""Check the fused kernels against the PyTorch path on a GPU.

    python tools/node/validate_kernels.py [--dtype fp32|bf16] [--batch 2] [--seq-len 1000]

For the Mamba2 mixer (mamba_ssm / causal_conv1d) it runs the cases of kernel_cases.py, the ones
the suite's kernel tier runs on CPU under Triton's interpreter (tests/kernels/), at GPU sizes: both
fused paths forward and backward over packed documents, lengths that are and are not multiples of
the chunk and one shorter than it, one and two groups, the injection; generation one token at a
time; an implicit model's (4+1) and (24+4) training step. For Llama attention (flash-attn, half
precision only) the layer's output and gradients. It prints the max relative error, max|a - b| /
max|b|, of each output, gradient and state, and the forward + backward tokens/s of each path. Exits
1 when an error exceeds the tolerance of the dtype, and 0 with "skipped: ..." on a machine without a
GPU or without the kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_cases  # noqa: E402 - beside this script: the suite's kernel tier reads the same cases

from implicit_megatron.models import kernels  # noqa: E402
from implicit_megatron.models.llama import LlamaDecoderLayer  # noqa: E402
from implicit_megatron.models.mamba2 import Mamba2  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 5e-2}  # the kernels use tf32 / bf16 matmuls


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def pytorch_path(fn: Callable[[], object]) -> object:
    kernels.set_kernels_enabled(False)
    try:
        return fn()
    finally:
        kernels.set_kernels_enabled(True)


def forward_backward(module: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor, **kw):
    """Output, input gradient and parameter gradients of one forward + backward."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y = module(x, **kw)
    y.backward(grad_out)
    return y.detach(), x.grad, {n: p.grad for n, p in module.named_parameters() if p.grad is not None}


def sync(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def tokens_per_s(module: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor, steps: int, **kw) -> float:
    forward_backward(module, x, grad_out, **kw)
    sync(x)
    start = time.perf_counter()
    for _ in range(steps):
        forward_backward(module, x, grad_out, **kw)
    sync(x)
    return x.shape[0] * x.shape[1] * steps / (time.perf_counter() - start)


class Report:
    """Prints each comparison and remembers those above the tolerance of their dtype."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, err: float, dtype: torch.dtype, scale: float = 1.0) -> None:
        ok = err <= scale * TOLERANCE[dtype]
        print(f"  {name:<62} rel. error {err:.2e}  {'ok' if ok else 'FAIL'}")
        if not ok:
            self.failed.append(name)

    def same(self, name: str, fused: float, reference: float, dtype: torch.dtype) -> None:
        """A count (the solver's passes): equal in float32; bf16 may stop a pass apart (not a failure)."""
        ok = fused == reference or dtype != torch.float32
        print(f"  {name:<62} {fused:g} and {reference:g}  {'ok' if ok else 'FAIL'}")
        if not ok:
            self.failed.append(name)

    def compare(self, case: str, fused, reference) -> None:
        y_f, gx_f, gp_f = fused
        y_r, gx_r, gp_r = reference
        self.check(f"{case}: output", rel_err(y_f, y_r), y_r.dtype)
        self.check(f"{case}: input gradient", rel_err(gx_f, gx_r), y_r.dtype)
        worst = max(gp_r, key=lambda n: rel_err(gp_f[n], gp_r[n]))
        self.check(f"{case}: parameter gradients (worst: {worst})", rel_err(gp_f[worst], gp_r[worst]), y_r.dtype)


def validate_mamba2(args, device: torch.device, dtype: torch.dtype, report: Report) -> None:
    """The cases of kernel_cases.py (the ones the suite's kernel tier runs on CPU) at GPU sizes."""
    sizes = dataclasses.replace(kernel_cases.GPU, d_model=args.d_model, batch=args.batch)
    print(f"Mamba2 mixer: d_model {sizes.d_model}, chunk {sizes.chunk}, batch {sizes.batch}, {dtype}")
    for case in kernel_cases.MIXER_CASES:
        for name, fused, reference in kernel_cases.compare_mixer(case, sizes, device, dtype):
            report.check(f"{case.name}: {name}", rel_err(fused, reference), dtype)
    comparisons = kernel_cases.compare_generation(sizes, device, dtype, tokens=args.step_tokens)
    for name, fused, reference in comparisons:
        report.check(f"generation: {name}", rel_err(fused, reference), dtype)
    for mode in kernel_cases.TRAINING_MODES:
        comparisons = kernel_cases.compare_training_step(mode, sizes, device, dtype, length=sizes.chunk * 3 // 2)
        for name, fused, reference in comparisons:
            if "passes" in name:
                report.same(f"implicit {mode} training step: {name}", fused.item(), reference.item(), dtype)
            else:
                report.check(f"implicit {mode} training step: {name}", rel_err(fused, reference), dtype,
                             scale=10.0 if name == "residuals" else 1.0)

    mixer = Mamba2(args.d_model, d_state=sizes.d_state, headdim=sizes.headdim, chunk_size=sizes.chunk,
                   device=device, dtype=dtype)
    x = torch.randn(args.batch, args.seq_len, args.d_model, device=device, dtype=dtype)
    grad_out = torch.randn_like(x)
    fused_tps = tokens_per_s(mixer, x, grad_out, args.steps)
    torch_tps = pytorch_path(lambda: tokens_per_s(mixer, x, grad_out, args.steps))
    print(f"  forward+backward tokens/s (split conv+scan, seq_len {args.seq_len}): fused {fused_tps:,.0f}   "
          f"pytorch {torch_tps:,.0f}")


def validate_llama(args, device: torch.device, report: Report) -> None:
    dtype = torch.bfloat16  # flash-attn runs in half precision only
    ffn_dim = 256 * math.ceil(8 * args.d_model / 3 / 256)
    layer = LlamaDecoderLayer(args.d_model, args.d_model // 64, ffn_dim, device=device, dtype=dtype)
    x = torch.randn(args.batch, args.seq_len, args.d_model, device=device, dtype=dtype)
    grad_out = torch.randn_like(x)
    print(f"Llama layer: flash-attn vs SDPA, d_model {args.d_model}, batch {args.batch}, seq_len {args.seq_len}, "
          f"{dtype}")
    report.compare("flash-attn", forward_backward(layer, x, grad_out),
                   pytorch_path(lambda: forward_backward(layer, x, grad_out)))
    fused_tps = tokens_per_s(layer, x, grad_out, args.steps)
    torch_tps = pytorch_path(lambda: tokens_per_s(layer, x, grad_out, args.steps))
    print(f"  forward+backward tokens/s: flash-attn {fused_tps:,.0f}   sdpa {torch_tps:,.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1000, help="of the timed passes and of Llama's comparison")
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--step-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="timed forward+backward passes")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 0
    installed = kernels.installed()
    if not any(installed.values()):
        print("skipped: kernels not installed (mamba_ssm + causal_conv1d, flash_attn)")
        return 0
    torch.manual_seed(0)
    dtype = DTYPES[args.dtype]
    device = torch.device("cuda")
    report = Report()
    print(f"device: {torch.cuda.get_device_name()}; kernels: {installed}")
    if installed["mamba_ssm+causal_conv1d"]:
        validate_mamba2(args, device, dtype, report)
    else:
        print("Mamba2: skipped: mamba_ssm / causal_conv1d not installed")
    if installed["flash_attn"]:
        validate_llama(args, device, report)
    else:
        print("Llama: skipped: flash_attn not installed")
    if report.failed:
        print(f"FAILED: {', '.join(report.failed)}")
        return 1
    print("all fused paths agree with the PyTorch path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
