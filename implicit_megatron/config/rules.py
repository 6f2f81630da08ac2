"""A config's own rules across fields: model shapes, the solver, the curriculum, batch sizes, the
schedule (called by config.reading.read_config). What one field accepts alone (its type, range,
finiteness, choices) is declared on the field in the schema and checked by utils.domains, which
`validate` runs first; nothing here repeats it. Nothing here opens a file or imports beyond the
schema: checks that need files, data or a task are implicit_megatron.prelaunch's.
"""

from __future__ import annotations

import os

from implicit_megatron.config.plan import phase_bounds
from implicit_megatron.config.schema import COMMAND_LINE_ONLY, PHASE_SOLVER_KEYS, Config
from implicit_megatron.models.registry import settings_of, spec_of
from implicit_megatron.utils.domains import domain_problems
from implicit_megatron.utils.typed_yaml import COMMAND_LINE


def validate_curriculum(cfg: Config, fail, sources: dict[str, str] | None = None) -> None:
    phases = cfg.curriculum.phases
    names = [p.name for p in phases]
    for k in PHASE_SOLVER_KEYS if phases else ():  # one source for the solver: the phases (SolverSettings)
        if f"implicit.{k}" in (sources or {}):  # a file, a base or the command line
            example = next((p.name for p in phases if p.kind == "free"), phases[-1].name) if k == "tol" \
                else phases[-1].name
            fail(f"implicit.{k}", f"every phase of the curriculum sets its own {k}, so this value would be "
                                  f"ignored; set it for a phase instead, e.g. curriculum.phases.{example}.{k} "
                                  f"(phases: {', '.join(names)})")
    for i, phase in enumerate(phases):
        key = f"curriculum.phases[{i}]"
        if names.count(phase.name) > 1:
            fail(f"{key}.name", f"phase name {phase.name!r} is used twice")
        if phase.kind != "free" and phase.tol is not None:
            fail(f"{key}.tol", f"a {phase.kind} phase runs exactly max_iter passes; remove tol {phase.tol} "
                               "or make the phase kind 'free'")
        if phase.kind == "free" and phase.tol is None:
            fail(f"{key}.tol", "a free phase needs a stopping tolerance (the paper: 0.05)")
        if phase.kind == "unrolled" and phase.phantom_steps != 0:
            fail(f"{key}.phantom_steps", "an unrolled phase backpropagates through every pass: set phantom_steps 0")
        if phase.kind != "unrolled" and phase.phantom_steps < 1:
            fail(f"{key}.phantom_steps", f"expected at least 1, got {phase.phantom_steps}")
        own = [k for k in ("zero_stage", "micro_batch_size") if getattr(phase, k) is not None]
        if own and cfg.curriculum.run_phase is None:
            fail(f"{key}.{own[0]}", "a phase with its own settings needs a launch of its own: run the curriculum "
                                    "with launch/curriculum.sh (or set curriculum.run_phase)")
    if phases and not cfg.implicit.enabled:
        fail("curriculum.phases", "a curriculum needs implicit.enabled: true")
    if phases and abs(sum(p.fraction for p in phases) - 1) > 1e-6:
        fail("curriculum.phases", f"fractions must add up to 1, got {sum(p.fraction for p in phases):g}")
    for i, (phase, start, end) in enumerate(phase_bounds(cfg) if phases else []):
        if end <= start:
            fail(f"curriculum.phases[{i}].fraction", f"phase {phase.name!r} gets no step of train.steps "
                                                     f"{cfg.train.steps}", "train.steps")
    if cfg.curriculum.run_phase is not None and cfg.curriculum.run_phase not in names:
        fail("curriculum.run_phase", f"no phase named {cfg.curriculum.run_phase!r}; phases: {names}")


def validate(cfg: Config, fail, world_size: int | None = None) -> None:
    """Every field in its domain (utils.domains: a config made in code has not been through the
    reader's check), then the config's own cross-field rules; `fail(key, message)` raises a
    ConfigError naming the file and key at fault (config.blame)."""
    for key, problem in domain_problems(cfg):
        fail(key, problem)
    for key in COMMAND_LINE_ONLY:
        if cfg.sources.get(key, COMMAND_LINE) != COMMAND_LINE:
            fail(key, "taken from the command line only (a config file from elsewhere could otherwise make this "
                      f"launch trust what it loads); remove it from the file and pass {key}=true when you mean it")
    m = cfg.model
    spec_of(m.arch).check(settings_of(m), m.d_model, fail)  # the backbone's own section (models/<arch>/spec.py)

    im = cfg.implicit
    if im.cuda_graphs == "on":
        if cfg.distributed.zero_stage == 3:
            fail("implicit.cuda_graphs", "ZeRO-3 gathers parameters inside the forward, which a graph cannot "
                                         "replay; use auto (eager under ZeRO-3) or ZeRO-1/2")
        if cfg.distributed.activation_checkpointing:
            fail("implicit.cuda_graphs", "activation checkpointing recomputes passes during backward; "
                                         "use auto or turn distributed.activation_checkpointing off")
    validate_curriculum(cfg, fail, cfg.sources)

    t = cfg.train
    dp = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    if t.global_batch_size % (t.micro_batch_size * dp):
        fail("train.global_batch_size",
             f"{t.global_batch_size} is not divisible by micro_batch_size x data-parallel size "
             f"= {t.micro_batch_size} x {dp} = {t.micro_batch_size * dp}", "train.micro_batch_size")
    if cfg.schedule.warmup_steps >= t.steps:
        fail("schedule.warmup_steps", f"{cfg.schedule.warmup_steps} is not below train.steps {t.steps}",
             "train.steps")
    if not cfg.distributed.collective_timeout_minutes > cfg.distributed.timeout_minutes:
        fail("distributed.collective_timeout_minutes",
             f"{cfg.distributed.collective_timeout_minutes:g} is not above distributed.timeout_minutes "
             f"{cfg.distributed.timeout_minutes:g}: the backstop must sit above what the stall watch allows, or it "
             "ends healthy ranks that the watch lets go on", "distributed.timeout_minutes")
    if cfg.schedule.min_lr > cfg.optimizer.lr:
        fail("schedule.min_lr", f"{cfg.schedule.min_lr} exceeds the peak optimizer.lr {cfg.optimizer.lr}")
    if cfg.data.weights is not None and len(cfg.data.weights) != len(cfg.data.prefixes):
        fail("data.weights", f"{len(cfg.data.weights)} weights for {len(cfg.data.prefixes)} prefixes")
    if cfg.data.weights and not sum(cfg.data.weights) > 0:
        fail("data.weights", "every weight is 0: at least one prefix must be read")
