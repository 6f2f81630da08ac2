"""Validation every train.eval_interval steps and after the last one (train/validation.py evaluates)."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback


class ValidationCallback(Callback):
    def on_step_end(self, trainer, result, control) -> None:
        step = trainer.progress.step
        if step % trainer.cfg.train.eval_interval == 0 or step == trainer.last_step:
            trainer.hooks.activity(trainer, f"the validation after step {step}")
            trainer.reporter.validation(trainer.evaluate(), step)
