"""The shipped paper configs against Table 6 and appendix D of the paper."""

from __future__ import annotations

from pathlib import Path

import pytest

from implicit_megatron import load_config
from implicit_megatron.config import phase_bounds
from implicit_megatron.train.schedule import learning_rate

ROOT = Path(__file__).resolve().parents[3]

# size: (Mamba2 layers, Llama layers, d_model, Llama heads, Llama head dim, peak LR)  -- Table 6
TABLE6 = {
    "1.3b": (48, 24, 2048, 32, 64, 0.001),
    "760m": (48, 24, 1536, 16, 96, 0.00125),
    "350m": (48, 24, 1024, 16, 64, 0.0015),
    "130m": (24, 12, 768, 12, 64, 0.003),
}
MAMBA2_NAME = {"1.3b": "1.3b", "760m": "780m", "350m": "370m", "130m": "130m"}  # public Mamba2 size names


def paper_configs():
    for size in TABLE6:
        for arch, name in (("mamba2", MAMBA2_NAME[size]), ("llama", size)):
            for variant in ("explicit", "implicit", "implicit-bounded", "implicit-free", "implicit-4p1"):
                yield size, arch, ROOT / "configs" / arch / f"{name}-{variant}.yaml"


@pytest.mark.parametrize("size,arch,path", list(paper_configs()), ids=lambda v: getattr(v, "stem", v))
def test_matches_table6(size, arch, path):
    cfg = load_config(path, world_size=8)
    m_layers, l_layers, width, heads, head_dim, lr = TABLE6[size]
    assert cfg.model.arch == arch
    assert cfg.model.d_model == width
    assert cfg.model.n_layers == (m_layers if arch == "mamba2" else l_layers)
    if arch == "llama":
        assert cfg.model.llama.n_heads == heads and width // heads == head_dim
        assert cfg.model.llama.rope_theta == 500000.0  # as released
    else:
        assert (cfg.model.mamba2.d_state, cfg.model.mamba2.headdim, cfg.model.mamba2.expand) == (128, 64, 2)
    assert cfg.optimizer.lr == lr
    assert cfg.train.global_batch_size * cfg.data.seq_len == 2**20  # 1M tokens
    assert cfg.data.seq_len == 2048 and cfg.train.steps == 197701
    assert cfg.optimizer.betas == (0.9, 0.95) and cfg.optimizer.weight_decay == 0.1
    assert cfg.schedule.min_lr == 1e-5
    assert cfg.model.tie_embeddings and cfg.model.vocab_size == 50277
    assert cfg.model.padded_vocab_size == (50288 if arch == "mamba2" else 50277)
    if "implicit" in path.stem:  # weight norm on every Linear/Conv of F and on the injection, as released
        assert cfg.implicit.weight_norm and cfg.implicit.weight_norm_injection
        assert cfg.implicit.eval_rule == "released"


@pytest.mark.parametrize("arch,cap,cooldown", [("mamba2", 24, 0.9), ("llama", 32, 0.8)])
def test_curriculum_follows_appendix_d(arch, cap, cooldown):
    cfg = load_config(ROOT / "configs" / arch / "130m-implicit.yaml")
    bounded, free = cfg.curriculum.phases
    assert cfg.implicit.enabled and cfg.implicit.eval_factor == 4 and cfg.implicit.damping == 0.8
    assert (bounded.kind, bounded.fraction, bounded.max_iter, bounded.phantom_steps, bounded.tol) == \
        ("bounded", 0.8, 4, 1, None)
    assert (free.kind, free.fraction, free.max_iter, free.phantom_steps, free.tol) == ("free", 0.2, cap, 4, 0.05)
    assert cfg.schedule.cooldown_start == cooldown
    explicit = load_config(ROOT / "configs" / arch / "130m-explicit.yaml")
    assert not explicit.implicit.enabled and not explicit.curriculum.phases


def test_phase_configs_share_the_run():
    bounded = load_config(ROOT / "configs/llama/760m-implicit-bounded.yaml")
    free = load_config(ROOT / "configs/llama/760m-implicit-free.yaml")
    assert bounded.output_dir == free.output_dir == "runs/llama-760m-implicit"
    assert (bounded.curriculum.run_phase, free.curriculum.run_phase) == ("bounded", "free")


@pytest.mark.parametrize("size", list(TABLE6))
@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_standalone_4p1_is_the_curricula_first_80_percent_and_then_stays_bounded(arch, size):
    """The (4+1) rows train (4+1) on all tokens; the (24+4)/(32+4) model branches from the same run
    at 80 %: the 4p1 config writes a checkpoint exactly where the curriculum's free phase starts,
    with the same learning rates up to there."""
    name = MAMBA2_NAME[size] if arch == "mamba2" else size
    standalone = load_config(ROOT / "configs" / arch / f"{name}-implicit-4p1.yaml")
    curriculum = load_config(ROOT / "configs" / arch / f"{name}-implicit.yaml")
    assert all((p.kind, p.max_iter, p.phantom_steps, p.tol) == ("bounded", 4, 1, None)
               for p in standalone.curriculum.phases)
    (_, _, branch), (_, start, end) = phase_bounds(standalone)[0], phase_bounds(curriculum)[1]
    assert branch == start and end == standalone.train.steps == curriculum.train.steps
    for step in range(0, branch, branch // 50):
        assert learning_rate(step, standalone) == learning_rate(step, curriculum)
    assert learning_rate(standalone.train.steps - 1, standalone) < learning_rate(branch, standalone)  # cooldown
    assert standalone.output_dir != curriculum.output_dir


@pytest.mark.slow  # builds the 130M model
@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_standalone_4p1_runs_a_step(arch):
    import torch

    from implicit_megatron import build_model
    from implicit_megatron.implicit import SolverSettings

    cfg = load_config(ROOT / "configs" / arch / "130m-implicit-4p1.yaml", ["data.seq_len=32"])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    phase = cfg.curriculum.phases[0]
    model.core.set_phase(max_iter=phase.max_iter, tol=phase.tol, phantom_steps=phase.phantom_steps)
    assert isinstance(model.core.settings, SolverSettings) and model.core.settings.eval_tol == 0.05
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr)
    ids = torch.randint(0, cfg.model.vocab_size, (1, cfg.data.seq_len + 1))
    loss = model(ids[:, :-1], labels=ids[:, 1:])
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and model.core.last_stats.passes == 4 and model.core.last_stats.phantom_passes == 1
