"""The curriculum's phase of each step: its solver settings applied to the model before the step
(train/curriculum.py's Phases says which phase a step is in)."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback


class PhasesCallback(Callback):
    def on_step_start(self, trainer, step: int) -> None:
        trainer.phases.apply(step, trainer.engine.module.core, trainer.progress)
