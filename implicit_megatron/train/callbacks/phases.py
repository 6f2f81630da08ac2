"""The run's phases over its steps: which phase a step is in, switching the core's solver to it
before the step, and the steps this launch trains. The ranges themselves are computed in
implicit_megatron.config.plan (the launch of a curriculum plans with the same functions); the
ranges a run trained with are kept with each checkpoint and taken back by every launch that starts
from one (a handoff too: steps already trained keep their phase)."""

from __future__ import annotations

from dataclasses import replace

from implicit_megatron.config import Config, PhaseConfig
from implicit_megatron.config.plan import launch_steps, phase_bounds, record, recorded_bounds, run_bounds
from implicit_megatron.train.callbacks import Callback
from implicit_megatron.train.progress import Progress


class Phases(Callback):
    priority = 90  # the solver's settings before anything else sees the step

    def __init__(self, cfg: Config, log, core=None, progress: Progress | None = None) -> None:
        self.cfg, self.log, self.core, self.progress = cfg, log, core, progress
        self.bounds = phase_bounds(cfg)  # as the config's fractions give them, until a resume says otherwise

    def resume(self, state: dict, step: int, same_run: bool) -> None:
        """Keep the phases of the steps already trained (see run_bounds); say so where a raised
        train.steps lengthens the last phase, with the learning rate its extra steps start at."""
        trained = recorded_bounds(state)
        self.bounds, extension = run_bounds(self.cfg, trained, step)
        if extension:
            from implicit_megatron.train.schedule import learning_rate

            assert trained is not None  # run_bounds extends recorded ranges only

            shorter = replace(self.cfg, train=replace(self.cfg.train, steps=trained[-1][2]))
            self.log(f"{extension}, at learning rate {learning_rate(step, self.cfg):.3g} from step {step} (the "
                     f"schedule over {self.cfg.train.steps} steps; step {step - 1} trained at "
                     f"{learning_rate(step - 1, shorter):.3g})")

    def at(self, step: int) -> PhaseConfig | None:
        return next((phase for phase, start, end in self.bounds if start <= step < end), None)

    def ends_after(self, step: int) -> bool:
        """Whether `step` (counted from 1) is the last step of its phase."""
        return self.at(step) is not self.at(step - 1)

    def steps_of_this_launch(self, step: int) -> tuple[int, int]:
        return launch_steps(self.cfg, self.bounds, step)

    def on_step_start(self, step: int) -> None:
        """Switch the core's solver to the phase of `step` when it changes there."""
        phase = self.at(step)
        if phase is None or self.progress is None or phase.name == self.progress.phase:
            return
        gradient = "unrolled_damped" if phase.kind == "unrolled" else self.cfg.implicit.gradient
        self.core.set_phase(**phase.solver_keys(), gradient=gradient)
        self.progress.phase = phase.name
        shape = f"{phase.max_iter} unrolled damped passes" if phase.kind == "unrolled" else \
            f"({phase.max_iter}+{phase.phantom_steps}), tol {phase.tol}"
        self.log(f"phase {phase.name}: {shape}")

    def state_dict(self) -> dict:
        """The ranges the run trains with (taken back by `resume`, at the step the run resumed at)."""
        return {"phase_bounds": record(self.bounds)}
