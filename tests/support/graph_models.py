"""Tiny models for the CUDA-graph tests, and a training loop that records what graphs must reproduce."""

from __future__ import annotations

import contextlib

import torch

from implicit_megatron.builder import weight_normed_layers
from implicit_megatron.implicit import SolverSettings

TARGETS = [("emulated", torch.float64), ("cuda", torch.float32), ("cuda", torch.bfloat16)]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4, torch.bfloat16: 3e-2}
MODES = {"explicit": None, "(4+1)": SolverSettings(max_iter=4, phantom_steps=1),
         "(24+4)": SolverSettings(max_iter=24, phantom_steps=4),
         "free": SolverSettings(max_iter=40, tol=1e-3, phantom_steps=2)}


def graph_model(make_model, arch: str, target, mode: str = "(4+1)", *overrides: str):
    """A tiny implicit model with weight norm (g away from ||v||, so a wrong g or v gradient shows),
    or the explicit one, on the target device and dtype in training mode."""
    device, dtype = target
    if mode == "explicit":
        model = make_model(arch, "implicit.enabled=false", "curriculum.phases=[]", "model.vocab_size=512", *overrides)
    else:
        model = make_model(arch, "implicit.weight_norm=true", "model.vocab_size=512", *overrides, contractive=True)
        model.core.settings = MODES[mode]
        with torch.no_grad():
            for layer in weight_normed_layers(model.core.backbone):
                layer.parametrizations.weight.original0.mul_(1.1)
    return model.to(device=device, dtype=dtype).train()


class TimedSections:
    """The trainer's timer (train.timers) as the core sees it: records which parts it timed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str):
        self.names.append(name)
        return contextlib.nullcontext()


def train(model, graphs: str, batches, steps: int = 3, set_to_none: bool = True):
    """Per step: the losses and every accumulated gradient; SGD updates the weights in place."""
    model.core.cuda_graphs = graphs
    model.core.timer = TimedSections()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history, passes = [], []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        losses = []
        for ids in batches:
            loss = model(ids, labels=torch.roll(ids, -1, 1))
            loss.backward()
            losses.append(loss.item())
            passes.append(model.core.last_stats.passes if model.core.implicit else 1)
        history.append((losses, {n: p.grad.double().clone() for n, p in model.named_parameters()
                                 if p.grad is not None}))
        optimizer.step()
    return history, passes


def close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item() <= TOLERANCE[dtype]


def batches(device, n: int, length: int = 16):
    g = torch.Generator().manual_seed(n)
    return [torch.randint(0, 512, (2, length), generator=g).to(device) for _ in range(n)]


