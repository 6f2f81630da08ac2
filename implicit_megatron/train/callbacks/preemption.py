"""A graceful stop (train/stopping.py's Preemption): SIGTERM, SIGINT or SIGHUP to the rank, the
launch's stop file, or train.exit_after_minutes. Asked of any rank, agreed with the step's flags:
every rank saves at once (no validation: grace periods are short) and stops."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.stopping import Preemption


class PreemptionCallback(Callback):
    def __init__(self, preemption: Preemption) -> None:
        self.preemption = preemption

    def before_resume(self, trainer) -> None:
        self.preemption.install()

    def stop_asked(self, trainer) -> bool:
        return self.preemption.asked()

    def on_step_end(self, trainer, result, control) -> None:
        self.preemption.agreed = result.stop_agreed
        if not result.stop_agreed:
            return
        p = trainer.progress
        self.preemption.record(p.step, None if p.nonfinite_steps else trainer.save())
        trainer.log(f"stopped by {self.preemption.why} after step {p.step}; launch again to resume")
        control.end("KILLED", completed=False)
