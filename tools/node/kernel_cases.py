"""The fused-kernel comparisons, one list for both places that run them.

tools/node/validate_kernels.py runs them on a GPU (the acceptance run); the suite's kernel tier
(tests/kernels/) runs the same cases on CPU with mamba_ssm's Triton kernels under Triton's
interpreter. A case is a geometry relative to the chunk (lengths that are and are not multiples of
it, one shorter than it), packed documents, groups and the injection; `Sizes` scales it to the
machine. Each comparison is (name, fused, PyTorch path) on the same module and weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from implicit_megatron import build_model, load_config
from implicit_megatron.implicit import SolverSettings
from implicit_megatron.models import kernels
from implicit_megatron.models.mamba2 import Mamba2

ROOT = Path(__file__).resolve().parents[2]
Comparison = tuple[str, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Sizes:
    d_model: int
    d_state: int
    headdim: int
    chunk: int
    batch: int = 2


CPU = Sizes(d_model=16, d_state=8, headdim=16, chunk=8)  # two heads: seconds per pass under the interpreter
GPU = Sizes(d_model=768, d_state=128, headdim=64, chunk=256)


@dataclass(frozen=True)
class MixerCase:
    name: str
    mem_eff: bool  # mamba_split_conv1d_scan_combined, else causal_conv1d_fn + mamba_chunk_scan_combined
    ngroups: int
    chunks: float  # the sequence length in chunks
    documents: bool  # packed documents (seq_idx), cut elsewhere in each row
    injection: bool  # an injection added to in_proj's output (the implicit model's)
    d_has_hdim: bool = False  # D of shape (nheads, headdim)

    def length(self, sizes: Sizes) -> int:
        return max(1, round(self.chunks * sizes.chunk))


MIXER_CASES = [
    MixerCase("split conv+scan, packed, 1.5 chunks, 2 groups, injection", True, 2, 1.5, True, True),
    MixerCase("conv1d + chunk scan, packed, 1.5 chunks, 2 groups, injection", False, 2, 1.5, True, True),
    MixerCase("split conv+scan, 2 chunks, D per channel", True, 1, 2.0, False, False, d_has_hdim=True),
    MixerCase("conv1d + chunk scan, packed, 2 chunks", False, 1, 2.0, True, False),
    MixerCase("split conv+scan, packed, shorter than a chunk, injection", True, 1, 0.625, True, True),
    MixerCase("conv1d + chunk scan, shorter than a chunk, 2 groups", False, 2, 0.625, False, False),
]
TRAINING_MODES = {"(4+1)": SolverSettings(max_iter=4, phantom_steps=1, damping=0.8),
                  "(24+4)": SolverSettings(max_iter=24, tol=0.05, phantom_steps=4, damping=0.8)}


@contextlib.contextmanager
def pytorch_path() -> Iterator[None]:
    kernels.set_kernels_enabled(False)
    try:
        yield
    finally:
        kernels.set_kernels_enabled(True)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _away_from_init(mixer: Mamba2, generator: torch.Generator) -> None:
    """D = 1, a norm weight of ones and a zero conv bias hide a wrong shape or a missing term."""
    with torch.no_grad():
        for name in ("D", "dt_bias", "conv1d.bias", "norm.weight"):
            p = mixer.get_parameter(name)
            p.add_(0.5 * torch.randn(p.shape, generator=generator).to(p))


def documents(batch: int, length: int, device) -> torch.Tensor:
    """seq_idx with each row cut elsewhere: row r holds r + 2 documents (where the length allows)."""
    rows = []
    for r in range(batch):
        cuts = torch.linspace(0, length, r + 3)[1:-1].round().long()
        ids = torch.zeros(length, dtype=torch.int32)
        for cut in cuts:
            ids[cut:] += 1
        rows.append(ids)
    return torch.stack(rows).to(device)


def _forward_backward(mixer: Mamba2, u, inj, seq_idx, grad_out) -> dict[str, torch.Tensor]:
    mixer.zero_grad(set_to_none=True)
    u = u.detach().requires_grad_(True)
    inj = None if inj is None else inj.detach().requires_grad_(True)
    y = mixer(u, inj, seq_idx)
    y.backward(grad_out)
    found = {"output": y.detach(), "input gradient": u.grad}
    if inj is not None:
        found["injection gradient"] = inj.grad
    found.update({f"{n} gradient": torch.zeros_like(p) if p.grad is None else p.grad  # none reached it: zero
                  for n, p in mixer.named_parameters()})
    return found


def compare_mixer(case: MixerCase, sizes: Sizes, device, dtype, seed: int = 0) -> list[Comparison]:
    """Output, input and injection gradients and every parameter gradient, fused and PyTorch."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mixer = Mamba2(sizes.d_model, d_state=sizes.d_state, headdim=sizes.headdim, ngroups=case.ngroups,
                   chunk_size=sizes.chunk, use_mem_eff_path=case.mem_eff, D_has_hdim=case.d_has_hdim,
                   device=device, dtype=dtype)
    _away_from_init(mixer, g)
    t = case.length(sizes)
    u = torch.randn(sizes.batch, t, sizes.d_model, generator=g).to(device, dtype)
    inj = (0.3 * torch.randn(sizes.batch, t, mixer.injection_width, generator=g)).to(device, dtype) \
        if case.injection else None
    seq_idx = documents(sizes.batch, t, device) if case.documents else None
    grad_out = torch.randn(sizes.batch, t, sizes.d_model, generator=g).to(device, dtype)
    fused = _forward_backward(mixer, u, inj, seq_idx, grad_out)
    with pytorch_path():
        reference = _forward_backward(mixer, u, inj, seq_idx, grad_out)
    return [(name, fused[name], reference[name]) for name in reference]


def compare_generation(sizes: Sizes, device, dtype, tokens: int, seed: int = 0) -> list[Comparison]:
    """One token at a time through selective_state_update and causal_conv1d_update, with an
    injection, against the PyTorch path's whole sequence at once and its own steps' states."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mixer = Mamba2(sizes.d_model, d_state=sizes.d_state, headdim=sizes.headdim, ngroups=2, chunk_size=sizes.chunk,
                   device=device, dtype=dtype)
    _away_from_init(mixer, g)
    u = torch.randn(sizes.batch, tokens, sizes.d_model, generator=g).to(device, dtype)
    inj = (0.3 * torch.randn(sizes.batch, tokens, mixer.injection_width, generator=g)).to(device, dtype)
    with torch.no_grad():
        fused, outs = mixer.allocate_state(sizes.batch), []
        for i in range(tokens):
            out, fused = mixer.step(u[:, i], fused, inj[:, i])
            outs.append(out)
        with pytorch_path():
            whole = mixer(u, inj)
            reference = mixer.allocate_state(sizes.batch)
            for i in range(tokens):
                _, reference = mixer.step(u[:, i], reference, inj[:, i])
    return [("step outputs vs the whole sequence", torch.stack(outs, 1), whole),
            ("conv state", fused.conv, reference.conv), ("ssm state", fused.ssm, reference.ssm)]


def implicit_model(mode: str, sizes: Sizes, device, dtype, seed: int = 0):
    """The tiny implicit Mamba2 (one layer) at these sizes, in training mode."""
    overrides = ["model.n_layers=1", f"model.d_model={sizes.d_model}", "model.vocab_size=64",
                 f"model.mamba2.d_state={sizes.d_state}", f"model.mamba2.headdim={sizes.headdim}",
                 f"model.mamba2.chunk_size={sizes.chunk}", "implicit.weight_norm=false"]
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", overrides, check_files=False)
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():  # the injection dominates: the free phase converges and stops on its own (9 passes)
        model.core.injection.proj.weight.mul_(20.0)
    model.core.settings = TRAINING_MODES[mode]
    return model.to(device=device, dtype=dtype).train()


def training_step(model, ids: torch.Tensor, seq_idx) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=torch.roll(ids, -1, 1), seq_idx=seq_idx)
    loss.backward()
    stats = model.core.last_stats
    found = {"loss": loss.detach(), "passes": torch.tensor(float(stats.passes)),
             "phantom passes": torch.tensor(float(stats.phantom_passes)), "residuals": stats.residual.detach()}
    found.update({f"{n} gradient": p.grad for n, p in model.named_parameters() if p.grad is not None})
    return found


def compare_training_step(mode: str, sizes: Sizes, device, dtype, length: int, seed: int = 0) -> list[Comparison]:
    """One training step of packed documents: loss, the solver's passes and residuals, every gradient."""
    model = implicit_model(mode, sizes, device, dtype, seed)
    ids = torch.randint(0, 64, (sizes.batch, length), generator=torch.Generator().manual_seed(seed)).to(device)
    seq_idx = documents(sizes.batch, length, device)
    fused = training_step(model, ids, seq_idx)
    with pytorch_path():
        reference = training_step(model, ids, seq_idx)
    return [(name, fused[name], reference[name]) for name in reference]
