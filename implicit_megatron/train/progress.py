"""How far a run has come: steps, samples and tokens trained, the phase, non-finite steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    phase: str | None = None  # of the last step trained (set by the phase of each step)
    nonfinite_steps: int = 0  # in a row; their updates are skipped
    skipped_steps: int = 0  # non-finite steps of this launch, in all

    def count(self, finite: bool, samples: int, tokens: int) -> None:
        """One more step trained, of `samples` sequences and `tokens` tokens."""
        self.step += 1
        self.consumed_samples += samples
        self.consumed_tokens += tokens
        self.nonfinite_steps = 0 if finite else self.nonfinite_steps + 1
        self.skipped_steps += 0 if finite else 1

    def state_dict(self) -> dict:
        return {"step": self.step, "consumed_samples": self.consumed_samples, "consumed_tokens": self.consumed_tokens,
                "phase": self.phase}

    def load_state_dict(self, state: dict) -> None:
        """The counts continue from a checkpoint's; its phase is the next step's to set."""
        self.step, self.consumed_samples = int(state["step"]), int(state["consumed_samples"])
        self.consumed_tokens = int(state["consumed_tokens"])

    @property
    def tag(self) -> str:
        """The checkpoint tag of this step: `{phase}-step{N}`, or `step{N}` outside a curriculum."""
        return f"{self.phase}-step{self.step}" if self.phase else f"step{self.step}"
