"""Typed run configuration: YAML files (with `base:`), dotted overrides, validation.

    schema.py     every key, its type, domain (utils.domains) and default, as dataclasses
    plan.py       the curriculum's phases over a run's steps (phase_bounds, run_bounds, plan_phases)
    reading.py    read_config: a YAML file, its `base:` chain and overrides, then the rules
    rules.py      the config's own rules across fields (shapes, solver, curriculum, batches)
    __main__.py   `python -m implicit_megatron.config CONFIG [key=value ...]`: check and print a config

Plain data: nothing here imports the trainer, evaluation or the data pipeline. What needs files,
data or a task is implicit_megatron.prelaunch's (`implicit_megatron.load_config` runs both).
"""

from implicit_megatron.config.plan import phase_bounds
from implicit_megatron.config.reading import blame, read_config
from implicit_megatron.config.schema import (
    AndersonSettings,
    CatbabiConfig,
    CheckpointConfig,
    Config,
    CurriculumConfig,
    DataConfig,
    DistributedConfig,
    ImplicitConfig,
    LlamaSettings,
    Mamba2Settings,
    ModelConfig,
    OptimizerConfig,
    PhaseConfig,
    PhaseLaunchConfig,
    ScheduleConfig,
    SolverSettings,
    TaskConfig,
    TrackingConfig,
    TrainConfig,
    WandbConfig,
    WordProblemConfig,
)

__all__ = ["AndersonSettings", "CatbabiConfig", "CheckpointConfig", "Config", "CurriculumConfig", "DataConfig",
           "DistributedConfig", "ImplicitConfig", "LlamaSettings", "Mamba2Settings", "ModelConfig",
           "OptimizerConfig", "PhaseConfig", "PhaseLaunchConfig", "ScheduleConfig", "SolverSettings", "TaskConfig",
           "TrackingConfig", "TrainConfig", "WandbConfig", "WordProblemConfig", "blame", "phase_bounds", "read_config"]
