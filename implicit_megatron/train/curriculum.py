"""The phases launch/curriculum.sh runs, one launch each, and which of them are finished.

    python -m implicit_megatron.train.curriculum CONFIG [key=value ...]

prints one tab-separated line per phase: name, status (done | todo), number of nodes, processes
per node, hostfile ("-" where the phase leaves the environment's choice) and the run's output
folder. A phase is done when the run's latest complete checkpoint is at or after the phase's last
step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from implicit_megatron.config import Config, load_config, phase_bounds
from implicit_megatron.train.integrity import DamagedCheckpoint, check_tag, newest_complete, read_latest, step_of
from implicit_megatron.utils.typed_yaml import ConfigError, apply_overrides, read_yaml_chain


def finished_step(cfg: Config) -> int:
    """The step of the run's latest complete checkpoint (0 when there is none). A damaged `latest`
    or tag counts as the newest complete one before it, where the phase's launch will resume."""
    folder = Path(cfg.output_dir) / "checkpoints"
    try:
        tag = read_latest(folder)
        if tag is not None:
            check_tag(folder / tag, crc=False)
    except DamagedCheckpoint:
        tag = None
    if tag is None:
        tag, _ = newest_complete(folder, crc=False)
    return step_of(tag) if tag else 0


OWN_LAUNCH_KEYS = ("zero_stage", "micro_batch_size", "launch")


def _raw_phases(config: str, overrides: list[str]) -> tuple[list[dict], dict]:
    data, sources = read_yaml_chain(config)
    data, _ = apply_overrides(data, sources, overrides)
    curriculum = data.get("curriculum") or {}
    return [p for p in curriculum.get("phases") or [] if isinstance(p, dict)], curriculum


def phase_names(config: str, overrides: list[str]) -> list[str]:
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
        launch = phase.get("launch") if isinstance(phase.get("launch"), dict) else {}
        size = world_size
        if isinstance(launch.get("processes_per_node"), int):
            nodes = launch.get("num_nodes")
            size = (nodes if isinstance(nodes, int) else 1) * launch["processes_per_node"]
        configs.append(load_config(config, [*overrides, f"curriculum.run_phase={phase.get('name')}"],
                                   world_size=size, check_files=check_files, check_data=check_data))
    return configs


def plan(config: str, overrides: list[str]) -> list[tuple[str, ...]]:
    """Every phase, its config checked as its own launch will load it, before any of them starts."""
    rows = []
    for cfg in phase_configs(config, overrides):
        name = cfg.curriculum.run_phase
        phase, _, end = next(b for b in phase_bounds(cfg) if b[0].name == name)
        launch = phase.launch
        status = "done" if finished_step(cfg) >= end else "todo"
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
    for row in rows:
        print("\t".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
