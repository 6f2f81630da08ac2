"""tools/research/language_modeling.py's model kinds: what each trains of one config, read as the launcher
reads it (nothing trains here; the sweep itself is tested end to end in tests/e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tools import load_tool

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tool():
    return load_tool("language_modeling")


def trained(tool, model: str, *extra: str):
    from implicit_megatron.config.reading import read_config

    args = tool.parse(["--config", "configs/quickstart.yaml", "--models", model, *extra])
    return read_config(ROOT / args.config, tool.overrides(args, model, Path("/tmp/unused"), 2))


def test_each_model_kind_trains_the_same_model_and_tokens_its_own_way(tool):
    explicit, bounded, curriculum = (trained(tool, m) for m in ("explicit", "implicit-4p1", "implicit"))
    assert not explicit.implicit.enabled and explicit.curriculum.phases == []
    assert bounded.implicit.enabled and curriculum.implicit.enabled
    # (4+1) for every step: one bounded phase of 4 passes and 1 phantom step, no free phase.
    [phase] = bounded.curriculum.phases
    assert (phase.kind, phase.fraction, phase.max_iter, phase.phantom_steps) == ("bounded", 1.0, 4, 1)
    assert [p.kind for p in curriculum.curriculum.phases] == ["bounded", "free"]  # the config's own
    for cfg in (explicit, bounded, curriculum):  # seed 2: one initialisation and one data order for all
        assert (cfg.train.seed, cfg.data.seed, cfg.model) == (2, 1236, curriculum.model)
        assert (cfg.train.steps, cfg.train.global_batch_size, cfg.data.seq_len) == (200, 16, 128)


def test_overrides_reach_every_model(tool):
    for model in ("explicit", "implicit-4p1", "implicit"):
        cfg = trained(tool, model, "train.steps=40", "train.eval_interval=8")
        assert (cfg.train.steps, cfg.train.eval_interval, cfg.checkpoint.interval) == (40, 8, 4)


def test_an_unknown_model_is_refused_naming_the_kinds(tool):
    with pytest.raises(SystemExit, match="--models implicit-24p4: choose from explicit, implicit-4p1, implicit"):
        tool.parse(["--models", "explicit,implicit-24p4"])
