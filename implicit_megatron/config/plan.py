"""The curriculum's phases over a run's steps, computed here and nowhere else.

    phase_bounds(cfg)                 each phase's steps as the config's fractions of train.steps give them
    run_bounds(cfg, recorded, step)   ... as a run that trained some of them keeps them
    recorded_bounds(client_state)     the ranges a checkpoint recorded (older ones: its config's fractions)
    launch_steps(cfg, bounds, step)   the steps one launch trains
    plan_phases(configs, step, recorded)  a curriculum of launches: each phase's launch and whether it is done

Plain data: the run's step and recorded ranges are read from its checkpoints by the caller
(implicit_megatron/launch/curriculum.py, train/callbacks/phases.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, cast

from implicit_megatron.config.schema import Config, PhaseConfig
from implicit_megatron.errors import RunRefused


class PhaseSpan(NamedTuple):
    phase: PhaseConfig
    start: int  # the phase's first step, counted from 0
    end: int  # one past its last

    @property
    def name(self) -> str:
        return self.phase.name


def phase_bounds(cfg: Config) -> list[PhaseSpan]:
    """Each phase with its [first_step, end_step) over train.steps."""
    bounds, start, acc = [], 0, 0.0
    for phase in cfg.curriculum.phases:
        acc += phase.fraction
        end = cfg.train.steps if phase is cfg.curriculum.phases[-1] else round(acc * cfg.train.steps)
        bounds.append(PhaseSpan(phase, start, end))
        start = end
    return bounds


def record(bounds: list[PhaseSpan]) -> list[list]:
    """The ranges to record with a checkpoint: [name, start, end] per phase."""
    return [[span.name, span.start, span.end] for span in bounds]


def recorded_bounds(client_state: dict) -> list | None:
    """The phase ranges a checkpoint's run trained with: recorded, or (older checkpoints) those its
    saved config's fractions of train.steps give."""
    if "phase_bounds" in client_state:
        return client_state["phase_bounds"]
    saved = client_state.get("config") or {}
    phases, steps = (saved.get("curriculum") or {}).get("phases") or [], (saved.get("train") or {}).get("steps")
    if not phases or not steps:
        return None
    ranges, start, acc = [], 0, 0.0
    for i, phase in enumerate(phases):
        acc += phase["fraction"]
        end = steps if i == len(phases) - 1 else round(acc * steps)
        ranges.append([phase["name"], start, end])
        start = end
    return ranges


def run_bounds(cfg: Config, trained: list | None, step: int) -> tuple[list[PhaseSpan], str | None]:
    """The phases' step ranges for a run at `step` whose checkpoint recorded the ranges it trained
    with (`trained`: [name, start, end] per phase; None for a fresh run or an old checkpoint).

    Steps already trained keep their phase. When the config's own ranges (its fractions of
    train.steps) keep every trained step in its phase, they are used. Otherwise the run must have
    reached its last phase, which a raised train.steps then lengthens (returned with a sentence for
    the log); anything else is refused: training would go back to an earlier phase."""
    bounds = phase_bounds(cfg)
    if not trained or not step or not bounds:
        return bounds, None

    def phase_of(ranges, s):
        return next((name for name, start, end in ranges if start <= s < end), None)

    ours = record(bounds)
    moved = next((s for s in range(min(step, trained[-1][2])) if phase_of(ours, s) != phase_of(trained, s)), None)
    if moved is None:
        return bounds, None
    last_name, last_start, old_end = trained[-1]
    if [name for name, *_ in trained] == [p.name for p in cfg.curriculum.phases] and step >= last_start \
            and cfg.train.steps >= old_end:
        by_name = {p.name: p for p in cfg.curriculum.phases}
        kept = [PhaseSpan(by_name[name], start, end) for name, start, end in trained[:-1]]
        return [*kept, PhaseSpan(by_name[last_name], last_start, cfg.train.steps)], (
            f"train.steps raised from {old_end} to {cfg.train.steps}: steps {old_end}-{cfg.train.steps - 1} "
            f"continue the last phase, {last_name!r}; the phases before keep their steps")
    raise RunRefused(f"step {moved} was trained in phase {phase_of(trained, moved)!r}, but train.steps "
                     f"{cfg.train.steps} and the phases' fractions now put it in phase {phase_of(ours, moved)!r}: "
                     f"a run can only lengthen its last phase once it has reached it (this run is at step {step}, "
                     f"phases {', '.join(f'{n} {a}-{b - 1}' for n, a, b in trained)}); restore train.steps "
                     f"{old_end} and the fractions, or start a new run from this checkpoint with checkpoint.load")


def launch_steps(cfg: Config, bounds: list[PhaseSpan], step: int) -> tuple[int, int]:
    """The steps a launch at `step` trains, start+1..end: to the run's end, or to its phase's end
    where the launch runs one phase (curriculum.run_phase)."""
    if cfg.curriculum.run_phase is None:
        return step, cfg.train.steps
    span = next(s for s in bounds if s.name == cfg.curriculum.run_phase)  # the rules checked the name
    if step < span.start:
        raise RunRefused(f"phase {span.name!r} starts at step {span.start}, but this run is at step {step}: run "
                         "the earlier phases first")
    return step, span.end


def own_launches(phases: list[PhaseConfig]) -> bool:
    """Whether a curriculum's phases run as launches of their own (a phase sets its own ZeRO stage,
    micro batch or launch)."""
    return any(p.zero_stage is not None or p.micro_batch_size is not None or p.launch.num_nodes is not None
               or p.launch.processes_per_node is not None or p.launch.hostfile is not None for p in phases)


@dataclass(frozen=True)
class PlannedPhase:
    """One phase of a curriculum of launches: its launch's config and whether the run has done it."""

    config: Config  # as the phase's launch loads it (curriculum.run_phase set)
    span: PhaseSpan  # its steps, as the run keeps them
    done: bool  # the run's latest complete checkpoint is at or after the phase's last step

    @property
    def name(self) -> str:
        return self.span.name

    def environment(self) -> dict[str, str]:
        """The launch settings the phase names (the rest stay the environment's)."""
        launch, settings = self.span.phase.launch, {}
        if launch.num_nodes is not None:
            settings["NUM_NODES"] = str(launch.num_nodes)
        if launch.processes_per_node is not None:
            settings.update(GPUS_PER_NODE=str(launch.processes_per_node), NPROC=str(launch.processes_per_node))
        if launch.hostfile is not None:
            settings["HOSTFILE"] = launch.hostfile
        return settings


def plan_phases(configs: list[Config], step: int, recorded: list | None) -> list[PlannedPhase]:
    """Each phase's launch (`configs`, one per phase) for a run whose latest complete checkpoint is
    at `step` and recorded `recorded` ranges; RunRefused where they would move trained steps."""
    planned = []
    for cfg in configs:
        bounds, _ = run_bounds(cfg, recorded, step)
        span = next(s for s in bounds if s.name == cast(str, cfg.curriculum.run_phase))
        planned.append(PlannedPhase(cfg, span, done=step >= span.end))
    return planned
