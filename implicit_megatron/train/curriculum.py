"""The phases launch/curriculum.sh runs, one launch each, and which of them are finished.

    python -m implicit_megatron.train.curriculum CONFIG [key=value ...]

prints one tab-separated line per phase: name, status (done | todo), number of nodes, processes
per node and hostfile ("-" where the phase leaves the environment's choice). A phase is done
when the run's latest complete checkpoint is at or after the phase's last step.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from implicit_megatron.config import Config, load_config, phase_bounds
from implicit_megatron.train.handoff import read_latest
from implicit_megatron.utils.typed_yaml import ConfigError, apply_overrides, read_yaml_chain


def finished_step(cfg: Config) -> int:
    """The step of the run's latest complete checkpoint (0 when there is none)."""
    tag = read_latest(Path(cfg.output_dir) / "checkpoints")
    match = re.search(r"step(\d+)$", tag or "")
    return int(match.group(1)) if match else 0


def phase_names(config: str, overrides: list[str]) -> list[str]:
    data, sources = read_yaml_chain(config)
    data, _ = apply_overrides(data, sources, overrides)
    phases = (data.get("curriculum") or {}).get("phases") or []
    return [p.get("name") for p in phases if isinstance(p, dict)]


def plan(config: str, overrides: list[str]) -> list[tuple[str, str, str, str, str]]:
    """Every phase, its config checked as its own launch will load it, before any of them starts."""
    names = phase_names(config, overrides)
    if not names:
        raise ConfigError(config, "curriculum.phases", "no phases; run this config with launch/pretrain.sh")
    rows = []
    for name in names:
        cfg = load_config(config, [*overrides, f"curriculum.run_phase={name}"], check_files=False)
        phase, _, end = next(b for b in phase_bounds(cfg) if b[0].name == name)
        launch = phase.launch
        status = "done" if finished_step(cfg) >= end else "todo"
        rows.append((name, status, *("-" if v is None else str(v)
                                     for v in (launch.num_nodes, launch.processes_per_node, launch.hostfile))))
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
