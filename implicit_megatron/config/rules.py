"""A config's own rules across fields: model shapes, the solver, the curriculum, batch sizes, the
schedule (called by config.reading.read_config). Nothing here opens a file or imports beyond the
schema: checks that need files, data or a task are implicit_megatron.prelaunch's.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator

from implicit_megatron.config.plan import phase_bounds
from implicit_megatron.config.schema import COMMAND_LINE_ONLY, PHASE_SOLVER_KEYS, Config
from implicit_megatron.models.registry import settings_of, spec_of
from implicit_megatron.utils.names import CONTROL_CHARACTERS, name_problem
from implicit_megatron.utils.typed_yaml import COMMAND_LINE


def _strings(value: object, key: str) -> Iterator[tuple[str, str]]:
    """Every string in a config, with its key: dataclass fields (those a config sets), lists, dicts."""
    if isinstance(value, str):
        yield key, value
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if f.init:
                yield from _strings(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _strings(item, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            yield from _strings(item, f"{key}.{k}")


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
        if name_problem(phase.name):
            fail(f"{key}.name", f"phase name {name_problem(phase.name)}")
        if names.count(phase.name) > 1:
            fail(f"{key}.name", f"phase name {phase.name!r} is used twice")
        if phase.kind != "free" and phase.tol is not None:
            fail(f"{key}.tol", f"a {phase.kind} phase runs exactly max_iter passes; remove tol {phase.tol} "
                               "or make the phase kind 'free'")
        if phase.kind == "free" and phase.tol is None:
            fail(f"{key}.tol", "a free phase needs a stopping tolerance (the paper: 0.05)")
        if phase.tol is not None and phase.tol <= 0:
            fail(f"{key}.tol", f"expected a positive tolerance, got {phase.tol}")
        if phase.max_iter < 1:
            fail(f"{key}.max_iter", f"expected at least 1, got {phase.max_iter}")
        if phase.kind == "unrolled" and phase.phantom_steps != 0:
            fail(f"{key}.phantom_steps", "an unrolled phase backpropagates through every pass: set phantom_steps 0")
        if phase.kind != "unrolled" and phase.phantom_steps < 1:
            fail(f"{key}.phantom_steps", f"expected at least 1, got {phase.phantom_steps}")
        if not 0 < phase.fraction <= 1:
            fail(f"{key}.fraction", f"expected a fraction in (0, 1], got {phase.fraction}")
        own = [k for k in ("zero_stage", "micro_batch_size") if getattr(phase, k) is not None]
        if own and cfg.curriculum.run_phase is None:
            fail(f"{key}.{own[0]}", "a phase with its own settings needs a launch of its own: run the curriculum "
                                    "with launch/curriculum.sh (or set curriculum.run_phase)")
        if phase.micro_batch_size is not None and phase.micro_batch_size < 1:
            fail(f"{key}.micro_batch_size", f"expected a positive value, got {phase.micro_batch_size}")
        for k in ("num_nodes", "processes_per_node"):
            if getattr(phase.launch, k) is not None and getattr(phase.launch, k) < 1:
                fail(f"{key}.launch.{k}", f"expected a positive value, got {getattr(phase.launch, k)}")
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
    """The config's own cross-field rules; `fail(key, message)` raises a ConfigError naming the file
    and key at fault (config.blame)."""

    def positive(key: str, value: float) -> None:
        if not value > 0 or value == math.inf:  # rejects NaN too
            fail(key, f"expected a positive finite value, got {value}")

    def non_negative(key: str, value: float) -> None:
        if not 0 <= value < math.inf:
            fail(key, f"expected a finite value >= 0, got {value}")

    for key, value in (("name", cfg.name), ("tracking.experiment", cfg.tracking.experiment)):
        if name_problem(value):
            fail(key, name_problem(value))
    for key, value in _strings(cfg, ""):
        if CONTROL_CHARACTERS.search(value):
            fail(key, f"{value!r} holds a control character: paths and names reach the launch scripts, which "
                      "read them row by row and pass them on command lines")
    for key in COMMAND_LINE_ONLY:
        if cfg.sources.get(key, COMMAND_LINE) != COMMAND_LINE:
            fail(key, "taken from the command line only (a config file from elsewhere could otherwise make this "
                      f"launch trust what it loads); remove it from the file and pass {key}=true when you mean it")
    m = cfg.model
    for key in ("d_model", "n_layers", "vocab_size", "pad_vocab_multiple"):
        positive(f"model.{key}", getattr(m, key))
    non_negative("model.init_std", m.init_std)
    positive("model.norm_eps", m.norm_eps)
    if not 0 <= m.embedding_dropout < 1:
        fail("model.embedding_dropout", f"expected a probability in [0, 1), got {m.embedding_dropout}")
    spec_of(m.arch).check(settings_of(m), m.d_model, fail)  # the backbone's own section (models/<arch>/spec.py)

    im = cfg.implicit
    positive("implicit.max_iter", im.max_iter)
    positive("implicit.eval_factor", im.eval_factor)
    if im.phantom_steps < 1:
        fail("implicit.phantom_steps", f"expected at least 1, got {im.phantom_steps}")
    if not 0 < im.damping <= 1:
        fail("implicit.damping", f"expected 0 < damping <= 1, got {im.damping}")
    if im.tol is not None:
        positive("implicit.tol", im.tol)
    if im.eval_tol is not None:
        positive("implicit.eval_tol", im.eval_tol)
    if im.anderson.enabled:
        positive("implicit.anderson.window", im.anderson.window)
        non_negative("implicit.anderson.regularization", im.anderson.regularization)
        positive("implicit.anderson.mixing", im.anderson.mixing)

    if im.cuda_graphs == "on":
        if cfg.distributed.zero_stage == 3:
            fail("implicit.cuda_graphs", "ZeRO-3 gathers parameters inside the forward, which a graph cannot "
                                         "replay; use auto (eager under ZeRO-3) or ZeRO-1/2")
        if cfg.distributed.activation_checkpointing:
            fail("implicit.cuda_graphs", "activation checkpointing recomputes passes during backward; "
                                         "use auto or turn distributed.activation_checkpointing off")
    validate_curriculum(cfg, fail, cfg.sources)

    t = cfg.train
    for key in ("steps", "global_batch_size", "micro_batch_size", "log_interval", "eval_interval"):
        positive(f"train.{key}", getattr(t, key))
    dp = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    if t.global_batch_size % (t.micro_batch_size * dp):
        fail("train.global_batch_size",
             f"{t.global_batch_size} is not divisible by micro_batch_size x data-parallel size "
             f"= {t.micro_batch_size} x {dp} = {t.micro_batch_size * dp}", "train.micro_batch_size")
    if cfg.schedule.warmup_steps >= t.steps:
        fail("schedule.warmup_steps", f"{cfg.schedule.warmup_steps} is not below train.steps {t.steps}",
             "train.steps")
    if not 0 <= cfg.schedule.cooldown_start <= 1:
        fail("schedule.cooldown_start", f"expected a fraction in [0, 1], got {cfg.schedule.cooldown_start}")
    positive("optimizer.lr", cfg.optimizer.lr)
    non_negative("schedule.min_lr", cfg.schedule.min_lr)
    non_negative("schedule.warmup_steps", cfg.schedule.warmup_steps)
    non_negative("optimizer.weight_decay", cfg.optimizer.weight_decay)
    non_negative("optimizer.grad_clip", cfg.optimizer.grad_clip)
    non_negative("train.eval_samples", t.eval_samples)
    if t.exit_after_minutes is not None:
        positive("train.exit_after_minutes", t.exit_after_minutes)
    positive("checkpoint.interval", cfg.checkpoint.interval)
    positive("distributed.timeout_minutes", cfg.distributed.timeout_minutes)
    if not cfg.distributed.collective_timeout_minutes > cfg.distributed.timeout_minutes:
        fail("distributed.collective_timeout_minutes",
             f"{cfg.distributed.collective_timeout_minutes:g} is not above distributed.timeout_minutes "
             f"{cfg.distributed.timeout_minutes:g}: the backstop must sit above what the stall watch allows, or it "
             "ends healthy ranks that the watch lets go on", "distributed.timeout_minutes")
    non_negative("checkpoint.keep_last", cfg.checkpoint.keep_last)
    if cfg.schedule.min_lr > cfg.optimizer.lr:
        fail("schedule.min_lr", f"{cfg.schedule.min_lr} exceeds the peak optimizer.lr {cfg.optimizer.lr}")
    positive("data.seq_len", cfg.data.seq_len)
    if cfg.data.weights is not None and len(cfg.data.weights) != len(cfg.data.prefixes):
        fail("data.weights", f"{len(cfg.data.weights)} weights for {len(cfg.data.prefixes)} prefixes")
