"""A checkpoint every checkpoint.interval steps, at a phase's last step and at the run's, where
every callback allows it (the loss-jump guard may not); the checkpointer keeps checkpoint.keep_last
of them (train/checkpointer.py: saving, the `latest` pointer, retention)."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback


class CheckpointCallback(Callback):
    def on_step_end(self, trainer, result, control) -> None:
        step = trainer.progress.step
        due = step % trainer.cfg.checkpoint.interval == 0 or step == trainer.last_step \
            or trainer.phases.ends_after(step)
        if due and trainer.hooks.allow_save(trainer, step):
            trainer.hooks.activity(trainer, f"the checkpoint of step {step}")
            trainer.save()
