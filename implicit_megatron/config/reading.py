"""Reading a run config: a YAML file and its `base:` chain, dotted overrides from the command line,
then the config's own rules (config.rules), every error naming the file or the command line that
set the key at fault.
"""

from __future__ import annotations

import os

from implicit_megatron.config.rules import validate
from implicit_megatron.config.schema import Config, CurriculumConfig
from implicit_megatron.utils.typed_yaml import (
    COMMAND_LINE,
    ConfigError,
    apply_overrides,
    build_dataclass,
    read_yaml_chain,
    source_of,
)


def read_config(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (),
                world_size: int | None = None) -> Config:
    """Read CONFIG (and its `base:` chain), apply overrides, build the config and check its own
    rules (types, ranges, batch sizes for `world_size`, the curriculum), raising ConfigError naming
    the file and key at fault. What needs files, data or a task is implicit_megatron.prelaunch's
    (`implicit_megatron.load_config` runs both)."""
    data, sources = read_yaml_chain(path)
    data, sources = apply_overrides(data, sources, list(overrides))
    cfg = build_dataclass(Config, data, sources)
    cfg.source, cfg.sources, cfg.overrides = str(path), sources, list(overrides)
    _apply_run_phase(cfg, sources)
    validate(cfg, blame(cfg), world_size)
    return cfg


def read_curriculum(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> CurriculumConfig:
    """CONFIG's curriculum section, typed, before the rules: what a curriculum of launches is made
    of (each phase's launch then reads and checks the whole config, curriculum.run_phase set)."""
    data, sources = read_yaml_chain(path)
    data, sources = apply_overrides(data, sources, list(overrides))
    return build_dataclass(Config, data, sources).curriculum


def blame(cfg: Config):
    """`fail(key, message, *also)`: raise a ConfigError naming `key` and the file that set it. A check
    over several keys (`also`), or over a key whose parts were set apiece (`curriculum.phases`, whose
    `[0].fraction` an override set), blames the command line when it set one of them: the override
    is what to change."""

    def fail(key: str, message: str, *also: str) -> None:
        if any(_set_on_command_line(cfg.sources, k) for k in (key, *also)):
            raise ConfigError(COMMAND_LINE, key, message)
        raise ConfigError(source_of(cfg.sources, key) or cfg.source or "defaults", key, message)

    return fail


def _set_on_command_line(sources: dict[str, str], key: str) -> bool:
    """Whether the command line set `key`, or anything within it."""
    return source_of(sources, key) == COMMAND_LINE or any(
        source == COMMAND_LINE for name, source in sources.items() if name.startswith((f"{key}.", f"{key}[")))


def _apply_run_phase(cfg: Config, sources: dict[str, str]) -> None:
    """A phase launched on its own brings its ZeRO stage and micro batch; everything else is shared."""
    for i, phase in enumerate(cfg.curriculum.phases):
        if phase.name != cfg.curriculum.run_phase:
            continue
        if phase.zero_stage is not None:
            cfg.distributed.zero_stage = phase.zero_stage
            sources["distributed.zero_stage"] = source_of(sources, f"curriculum.phases[{i}].zero_stage") or ""
        if phase.micro_batch_size is not None:
            cfg.train.micro_batch_size = phase.micro_batch_size
            sources["train.micro_batch_size"] = source_of(sources, f"curriculum.phases[{i}].micro_batch_size") or ""
