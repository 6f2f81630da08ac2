"""A curriculum, phase after phase:  python -m implicit_megatron.launch.curriculum CONFIG [key=value ...]

launch/curriculum.sh hands over to this. The plan is made in this process before any phase starts:
each phase's config checked as its launch will load it (implicit_megatron.prelaunch.phase_configs),
and whether the run's checkpoints finish it (implicit_megatron.config.plan.plan_phases, from the step
and phase ranges of the run's latest complete checkpoint). Then each unfinished phase is one launch
(pretrain.py) with the nodes, processes and hostfile the phase names, in this process, so that a
stop signal reaches the running phase as its graceful stop. A phase that stopped early ends the
curriculum with exit 0; a stop asked between phases starts no further phase.
`--plan` prints the plan and starts nothing. The stop signals are taken before anything else is
imported (the config reader takes a second or more on a busy node, in which a stop killed it unsaid).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from implicit_megatron.run_control import StopSignals, install_stop_signals

if TYPE_CHECKING:
    from implicit_megatron.config.plan import PlannedPhase

USAGE = "usage: bash launch/curriculum.sh CONFIG [key=value ...]   (--plan: print the plan, start nothing)"


def saved_progress(output_dir: str) -> tuple[int, list | None]:
    """(step, phase ranges) of the run's latest complete checkpoint; (0, None) where there is none.
    A damaged `latest` or tag counts as the newest complete one before it, where the phase's launch
    will resume. (Reading a tag's record needs torch: imported here, where there are checkpoints.)"""
    folder = Path(output_dir) / "checkpoints"
    if not folder.is_dir() or not any(folder.iterdir()):
        return 0, None  # a new run
    from implicit_megatron.checkpoints.integrity import check_tag, newest_complete
    from implicit_megatron.checkpoints.layout import DamagedCheckpoint, read_client_state, read_latest, step_of
    from implicit_megatron.config.plan import recorded_bounds

    try:
        tag = read_latest(folder)
        if tag is not None:
            check_tag(folder / tag, crc=False)
    except DamagedCheckpoint:
        tag = None
    if tag is None:
        tag, _ = newest_complete(folder, crc=False)
    if tag is None:
        return 0, None
    return step_of(tag) or 0, recorded_bounds(read_client_state(folder / tag))


def plan(config: str, overrides: list[str]) -> list[PlannedPhase]:
    """Every phase, its config checked as its own launch will load it, before any of them starts
    (ConfigError, RunRefused)."""
    from implicit_megatron.config.plan import plan_phases
    from implicit_megatron.prelaunch import phase_configs

    configs = phase_configs(config, overrides)
    return plan_phases(configs, *saved_progress(str(configs[0].output_dir)))


def run(argv: list[str], signals: StopSignals) -> int:
    from implicit_megatron.launch.pretrain import launch

    for phase in plan(argv[0], argv[1:]):
        if phase.done:
            print(f"[curriculum] phase {phase.name}: finished, skipped", flush=True)
            continue
        if signals.asked():
            print(f"[curriculum] stopped by {signals.asked()} before phase {phase.name}; launch the curriculum again "
                  "to resume it", flush=True)
            return 0
        settings = phase.environment()
        said = " ".join(f"{k}={v}" for k, v in settings.items())
        print(f"[curriculum] phase {phase.name}: starting{' with ' + said if said else ''}", flush=True)
        result = launch([*argv, f"curriculum.run_phase={phase.name}"], {**os.environ, **settings}, signals)
        if result.stopped and result.end is not None:  # a graceful stop: the phase is not done
            print(f"[curriculum] phase {phase.name}: stopped early with a checkpoint ({result.end.describe()}); "
                  "launch the curriculum again to resume it", flush=True)
            return 0
        if result.status != 0:
            return result.status
    print(f"[curriculum] every phase of {argv[0]} is finished", flush=True)
    return 0


def show(argv: list[str]) -> int:
    for phase in plan(argv[0], argv[1:]):
        settings = " ".join(f"{k}={v}" for k, v in phase.environment().items())
        print(f"{phase.name}\t{'done' if phase.done else 'todo'}\tsteps {phase.span.start + 1}-{phase.span.end}"
              f"{chr(9) + settings if settings else ''}")
    return 0


def main(argv: list[str] | None = None) -> int:
    signals = install_stop_signals(interrupt=False)  # Ctrl-C: once a phase's ranks run
    # imported once the signals are taken: a stop during these imports is a stop before the first phase
    from implicit_megatron.errors import RunRefused
    from implicit_megatron.launch.environment import LaunchError
    from implicit_megatron.utils.typed_yaml import ConfigError

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n", 1)[1].strip() + "\n\n" + USAGE)
        return 0
    planning = bool(argv) and argv[0] == "--plan"
    argv = argv[1:] if planning else argv
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return show(argv) if planning else run(argv, signals)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except (LaunchError, RunRefused) as err:  # RunRefused: phases that would move trained steps
        print(f"{'' if isinstance(err, LaunchError) else 'curriculum: '}{err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("[curriculum] stopped by Ctrl-C between phases", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
