"""A step whose loss or gradient is not finite: its update was skipped (train_step.py); here it is
said and tracked, the run stops after train.max_nonfinite_in_row of them in a row (naming the last
intact checkpoint), and the step is neither validated nor saved, unless it is the last: then the
weights of the last finite update are."""

from __future__ import annotations

from implicit_megatron.checkpoints.layout import checkpoint_dir
from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.guards import nonfinite_stop


class NonFiniteCallback(Callback):
    def on_step_end(self, trainer, result, control) -> None:
        p = trainer.progress
        if not p.nonfinite_steps:
            return
        trainer.log(f"step {p.step}: non-finite loss ({p.nonfinite_steps} in a row); its update is skipped")
        trainer.reporter.tracker.log({"train/nonfinite_steps": p.nonfinite_steps}, p.step)
        nonfinite_stop(p.nonfinite_steps, trainer.cfg.train.max_nonfinite_in_row, checkpoint_dir(trainer.cfg))
        if p.step < trainer.last_step:
            control.skip_rest = True
            return
        trainer.save()
        control.end("FINISHED", completed=True)
