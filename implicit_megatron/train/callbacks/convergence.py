"""A warning when, in a phase with a tolerance, no solve has converged for train.
warn_unconverged_intervals log intervals in a row (every solve stopped at its cap): the fixed point
is not being found. The count goes with each checkpoint."""

from __future__ import annotations

from implicit_megatron.train.callbacks import Callback


class ConvergenceWatch(Callback):
    priority = 40

    def __init__(self, limit: int, log, core) -> None:
        self.limit, self.log, self.core, self.unconverged = limit, log, core, 0

    def on_metrics(self, metrics: dict[str, float], step: int) -> None:
        settings = self.core.settings
        if "solver/converged_frac" not in metrics or settings is None or settings.tol is None:
            return
        self.unconverged = self.unconverged + 1 if metrics["solver/converged_frac"] == 0 else 0
        if self.limit and self.unconverged == self.limit:
            self.log(f"warning: no solve has converged to tol {settings.tol} in {self.limit} log intervals in a "
                     f"row (step {step}; every solve stops at max_iter {settings.max_iter}): the fixed point is "
                     "not being found; see docs/checkpoints.md, How an implicit model is evaluated")

    def state_dict(self) -> dict:
        return {"unconverged_intervals": self.unconverged}

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        self.unconverged = int(state.get("unconverged_intervals", 0)) if same_run else 0
