"""The phases of a run: where each begins and ends, and which launch/curriculum.sh still runs.

    python -m implicit_megatron.train.curriculum CONFIG [key=value ...]

prints one tab-separated line per phase, as launch/curriculum.sh runs them (one launch each): name,
status (done | todo), number of nodes, processes per node, hostfile ("-" where the phase leaves the
environment's choice) and the run's output folder. A phase is done when the run's latest complete
checkpoint is at or after the phase's last step (as the run's recorded phase ranges say).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import cast

from implicit_megatron.config import Config, PhaseConfig, phase_bounds
from implicit_megatron.errors import RunRefused
from implicit_megatron.prelaunch import load_config, notes
from implicit_megatron.utils.typed_yaml import ConfigError, apply_overrides, read_yaml_chain

Bounds = list[tuple[PhaseConfig, int, int]]


def run_bounds(cfg: Config, trained: list | None, step: int) -> tuple[Bounds, str | None]:
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

    ours = [(phase.name, start, end) for phase, start, end in bounds]
    moved = next((s for s in range(min(step, trained[-1][2])) if phase_of(ours, s) != phase_of(trained, s)), None)
    if moved is None:
        return bounds, None
    last_name, last_start, old_end = trained[-1]
    if [name for name, *_ in trained] == [p.name for p in cfg.curriculum.phases] and step >= last_start \
            and cfg.train.steps >= old_end:
        by_name = {p.name: p for p in cfg.curriculum.phases}
        kept = [(by_name[name], start, end) for name, start, end in trained[:-1]]
        return [*kept, (by_name[last_name], last_start, cfg.train.steps)], (
            f"train.steps raised from {old_end} to {cfg.train.steps}: steps {old_end}-{cfg.train.steps - 1} "
            f"continue the last phase, {last_name!r}; the phases before keep their steps")
    raise RunRefused(f"step {moved} was trained in phase {phase_of(trained, moved)!r}, but train.steps "
                     f"{cfg.train.steps} and the phases' fractions now put it in phase {phase_of(ours, moved)!r}: "
                     f"a run can only lengthen its last phase once it has reached it (this run is at step {step}, "
                     f"phases {', '.join(f'{n} {a}-{b - 1}' for n, a, b in trained)}); restore train.steps "
                     f"{old_end} and the fractions, or start a new run from this checkpoint with checkpoint.load")


class Phases:
    """The run's phases over its steps: which phase a step belongs to, switching the core to it,
    and the steps this launch trains (a phase launched on its own trains only its own)."""

    def __init__(self, cfg: Config, log) -> None:
        self.cfg, self.log = cfg, log
        self.bounds = phase_bounds(cfg)

    def resume(self, state: dict | None, step: int) -> None:
        """Keep the phases of the steps already trained (see run_bounds); say so where a raised
        train.steps lengthens the last phase, with the learning rate its extra steps start at."""
        if state is None:
            return
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
        if self.cfg.curriculum.run_phase is None:
            return step, self.cfg.train.steps
        for phase, start, end in self.bounds:
            if phase.name == self.cfg.curriculum.run_phase:
                if step < start:
                    raise RunRefused(f"phase {phase.name!r} starts at step {start}, but this run is at step {step}: "
                                     "run the earlier phases first")
                return step, end
        raise AssertionError("validated config names an unknown phase")

    def apply(self, step: int, core, progress) -> None:
        """Switch the core's solver to the phase of `step` when it changes there."""
        phase = self.at(step)
        if phase is None or phase.name == progress.phase:
            return
        gradient = "unrolled_damped" if phase.kind == "unrolled" else self.cfg.implicit.gradient
        core.set_phase(**phase.solver_keys(), gradient=gradient)
        progress.phase = phase.name
        shape = f"{phase.max_iter} unrolled damped passes" if phase.kind == "unrolled" else \
            f"({phase.max_iter}+{phase.phantom_steps}), tol {phase.tol}"
        self.log(f"phase {phase.name}: {shape}")

    def recorded(self) -> list[list]:
        return trained_bounds(self.bounds)

    def state_dict(self) -> dict:
        """The ranges the run trains with (taken back by `resume`, at the step the run resumed at)."""
        return {"phase_bounds": self.recorded()}


def trained_bounds(bounds: Bounds) -> list[list]:
    """The ranges to record with a checkpoint."""
    return [[phase.name, start, end] for phase, start, end in bounds]


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


def finished_tag(cfg: Config) -> str | None:
    """The run's latest complete checkpoint (None when there is none). A damaged `latest` or tag
    counts as the newest complete one before it, where the phase's launch will resume. (The
    checkpoint modules, which import torch, are imported here: the config check before every
    launch, `python -m implicit_megatron.config`, reads this module and needs no torch.)"""
    from implicit_megatron.checkpoints.integrity import check_tag, newest_complete
    from implicit_megatron.checkpoints.layout import DamagedCheckpoint, read_latest

    folder = Path(cfg.output_dir) / "checkpoints"
    try:
        tag = read_latest(folder)
        if tag is not None:
            check_tag(folder / tag, crc=False)
    except DamagedCheckpoint:
        tag = None
    if tag is None:
        tag, _ = newest_complete(folder, crc=False)
    return tag


OWN_LAUNCH_KEYS = ("zero_stage", "micro_batch_size", "launch")


def _raw_phases(config: str, overrides: list[str]) -> tuple[list[dict], dict]:
    data, sources = read_yaml_chain(config)
    data, _ = apply_overrides(data, sources, overrides)
    curriculum = data.get("curriculum") or {}
    return [p for p in curriculum.get("phases") or [] if isinstance(p, dict)], curriculum


def phase_names(config: str, overrides: list[str]) -> list[str | None]:
    return [p.get("name") for p in _raw_phases(config, overrides)[0]]


def needs_own_launches(config: str, overrides: list[str]) -> bool:
    """Whether the config is a curriculum of separate launches (a phase with its own ZeRO stage,
    micro batch or launch) that no `curriculum.run_phase` narrows to one phase."""
    phases, curriculum = _raw_phases(config, overrides)
    return curriculum.get("run_phase") is None and any(k in p for p in phases for k in OWN_LAUNCH_KEYS)


def phase_configs(config: str, overrides: list[str], world_size: int | None = None,
                  check_files: bool = False, check_data: bool = False) -> list[Config]:
    """Every phase's config as its own launch will load it; a phase that names its processes is
    checked for its own data-parallel size, the others for `world_size`."""
    phases = _raw_phases(config, overrides)[0]
    if not phases:
        raise ConfigError(config, "curriculum.phases", "no phases; run this config with launch/pretrain.sh")
    configs = []
    for phase in phases:
        launch = cast(dict, phase.get("launch")) if isinstance(phase.get("launch"), dict) else {}
        size = world_size
        if isinstance(launch.get("processes_per_node"), int):
            nodes = launch.get("num_nodes")
            size = (nodes if isinstance(nodes, int) else 1) * launch["processes_per_node"]
        configs.append(load_config(config, [*overrides, f"curriculum.run_phase={phase.get('name')}"],
                                   world_size=size, check_files=check_files, check_data=check_data))
    return configs


def checked_configs(config: str, overrides: list[str], world_size: int | None = None,
                    check: bool = True) -> list[Config]:
    """CONFIG as each launch will load it (a curriculum whose phases run as launches of their own:
    one per phase), its files and data checked with `check`; what a user should know is printed as
    notes. Raises ConfigError."""
    if needs_own_launches(config, overrides):
        configs = phase_configs(config, overrides, world_size=world_size, check_files=check, check_data=check)
    else:
        configs = [load_config(config, overrides, world_size=world_size, check_files=check, check_data=check)]
    for note in dict.fromkeys(n for cfg in configs for n in notes(cfg)):
        print(f"note: {note}", file=sys.stderr)
    return configs


def plan(config: str, overrides: list[str]) -> list[tuple[str, ...]]:
    """Every phase, its config checked as its own launch will load it, before any of them starts."""
    from implicit_megatron.checkpoints.layout import read_client_state, step_of

    rows = []
    for cfg in phase_configs(config, overrides):
        name = cast(str, cfg.curriculum.run_phase)  # each phase's launch names its phase
        tag = finished_tag(cfg)
        step = cast(int, step_of(tag)) if tag else 0  # a checkpoint tag
        trained = recorded_bounds(read_client_state(Path(cfg.output_dir) / "checkpoints" / tag)) if tag else None
        bounds, _ = run_bounds(cfg, trained, step)
        phase, _, end = next(b for b in bounds if b[0].name == name)
        launch = phase.launch
        status = "done" if step >= end else "todo"
        rows.append((name, status, *("-" if v is None else str(v)
                                     for v in (launch.num_nodes, launch.processes_per_node, launch.hostfile)),
                     str(cfg.output_dir)))
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m implicit_megatron.train.curriculum CONFIG [key=value ...]", file=sys.stderr)
        return 2
    try:
        rows = plan(argv[0], argv[1:])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # the phases would move steps already trained
        print(f"curriculum: {err}", file=sys.stderr)
        return 2
    for row in rows:
        print("\t".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
