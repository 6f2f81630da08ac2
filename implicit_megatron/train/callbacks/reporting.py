"""What a launch reports (train/reporting.py's Reporter): its start in MLflow, each log interval's
metrics (the log line, metrics.jsonl, MLflow), and its end: the run's last line where it reached its
last step, and MLflow's status however it ended."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback


class ReportingCallback(Callback):
    def on_fit_start(self, trainer, start: int, end: int) -> None:
        trainer.reporter.begin(start, end, sum(param.numel() for param in trainer.model.parameters()),
                               resumed=trainer.checkpointer.from_own_folder)
        trainer.interval.reset()

    def on_step_start(self, trainer, step: int) -> None:
        trainer.reporter.tracker.set_phase(getattr(trainer.phases.at(step), "name", None))

    def on_step_end(self, trainer, result, control) -> None:
        step = trainer.progress.step
        if step % trainer.cfg.train.log_interval == 0 or step == trainer.last_step or result.stop_agreed:
            metrics = trainer.reporter.report(trainer.interval_metrics(), step)
            if metrics:
                trainer.hooks.metrics(trainer, metrics, step)

    def on_fit_end(self, trainer, status: str, completed: bool) -> None:
        if completed:
            trainer.reporter.summary(trainer.progress.step, trainer.progress.skipped_steps)
        trainer.reporter.tracker.finish(status)
