"""One GPU as torch.cuda's device queries describe it, on a CPU machine.

The graph path has its own emulation (cuda_graph_emulation.py). The other lines that run only where
`torch.cuda.is_available()` is true ask the device for a few facts (its name for MFU, its peak
allocated memory), synchronise it (the step timers), and save and restore its generator (the
checkpoints). `StandInGPU.install(monkeypatch)` answers those calls as one GPU would and records
each one, so that the tests run those lines and see what they asked of the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StandInGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    max_allocated: int = 3 * 2**30  # bytes
    rng_state: torch.Tensor = field(default_factory=lambda: torch.arange(16, dtype=torch.uint8))
    calls: list[tuple] = field(default_factory=list)

    def install(self, monkeypatch) -> StandInGPU:
        """torch.cuda answers as this GPU until the test ends (pytest's monkeypatch undoes it)."""
        answers = {
            "is_available": lambda: True,
            "get_device_name": lambda device=None: self.name,
            "max_memory_allocated": lambda device=None: self.max_allocated,
            "synchronize": lambda device=None: self.calls.append(("synchronize", device)),
            "empty_cache": lambda: self.calls.append(("empty_cache",)),
            "get_rng_state": lambda device="cuda": self.rng_state.clone(),
            "set_rng_state": self._set_rng_state,
        }
        for name, answer in answers.items():
            monkeypatch.setattr(torch.cuda, name, answer)
        return self

    def _set_rng_state(self, state: torch.Tensor, device="cuda") -> None:
        self.calls.append(("set_rng_state",))
        self.rng_state = state.clone()
