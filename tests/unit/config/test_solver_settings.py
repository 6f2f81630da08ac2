"""The solver's settings are declared once (config.schema.SolverSettings), implicit.* is one of them,
and a curriculum phase sets only its own keys of them."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from implicit_megatron import build_model, load_config
from implicit_megatron.config import ImplicitConfig, PhaseConfig, SolverSettings
from implicit_megatron.config.schema import PHASE_SOLVER_KEYS

ROOT = Path(__file__).resolve().parents[3]


def test_the_core_holds_its_own_copy_of_implicit_settings():
    cfg = load_config(ROOT / "configs/tiny/llama-implicit.yaml", ["implicit.damping=0.7"], check_files=False)
    core = build_model(cfg).core
    assert issubclass(ImplicitConfig, SolverSettings) and isinstance(core.settings, SolverSettings)
    assert core.settings == cfg.implicit and core.settings is not cfg.implicit
    core.set_phase(max_iter=9)
    assert cfg.implicit.max_iter != 9 and core.settings.damping == 0.7


def test_a_phase_declares_the_solver_keys_it_sets_with_the_solvers_types():
    assert PHASE_SOLVER_KEYS == ("max_iter", "phantom_steps", "tol")
    phase_types, solver_types = typing.get_type_hints(PhaseConfig), typing.get_type_hints(SolverSettings)
    assert {k: phase_types[k] for k in PHASE_SOLVER_KEYS} == {k: solver_types[k] for k in PHASE_SOLVER_KEYS}
    required = {f.name for f in dataclasses.fields(PhaseConfig) if f.default is dataclasses.MISSING}
    assert {"max_iter", "phantom_steps"} <= required  # every phase states its (s+k)
    phase = PhaseConfig(name="free", kind="free", fraction=1.0, max_iter=24, phantom_steps=4, tol=0.05)
    assert phase.solver_keys() == {"max_iter": 24, "phantom_steps": 4, "tol": 0.05}


def test_a_phase_switch_changes_the_phases_keys_and_nothing_else():
    from implicit_megatron.train.callbacks.phases import Phases
    from implicit_megatron.train.loop import Progress

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", ["implicit.damping=0.6", "implicit.eval_factor=3"],
                      check_files=False)
    core = build_model(cfg).core
    before = dataclasses.asdict(core.settings)
    phases = Phases(cfg, lambda line: None, core, Progress())
    phases.on_step_start(cfg.train.steps - 1)  # the free phase
    after = dataclasses.asdict(core.settings)
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {"max_iter", "phantom_steps", "tol"} and after["damping"] == 0.6 and after["eval_factor"] == 3
