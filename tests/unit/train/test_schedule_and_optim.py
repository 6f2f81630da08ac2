"""The LR schedule (warmup -> constant -> 1 - sqrt cooldown) and AdamW's weight-decay groups."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from implicit_megatron import build_model, load_config
from implicit_megatron.train.engine import deepspeed_config
from implicit_megatron.train.optim import build_optimizer
from implicit_megatron.train.schedule import learning_rate

ROOT = Path(__file__).resolve().parents[3]


def test_paper_schedule_shape():
    cfg = load_config(ROOT / "configs/mamba2/130m-implicit.yaml", check_files=False)
    peak, total = cfg.optimizer.lr, cfg.train.steps
    warmup, cooldown = cfg.schedule.warmup_steps, round(0.9 * total)
    assert learning_rate(0, cfg) == pytest.approx(peak / warmup)
    assert learning_rate(warmup - 1, cfg) == pytest.approx(peak)
    assert learning_rate(warmup, cfg) == learning_rate(cooldown - 1, cfg) == peak
    quarter = cooldown + (total - cooldown) // 4
    expected = 1e-5 + (peak - 1e-5) * (1 - math.sqrt((quarter - cooldown) / (total - cooldown)))
    assert learning_rate(quarter, cfg) == pytest.approx(expected)
    assert learning_rate(total, cfg) == pytest.approx(1e-5)
    lrs = [learning_rate(s, cfg) for s in range(cooldown, total, 97)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_llama_cooldown_starts_with_the_free_phase():
    cfg = load_config(ROOT / "configs/llama/130m-implicit.yaml", check_files=False)
    free_start = round(0.8 * cfg.train.steps)
    assert learning_rate(free_start - 1, cfg) == cfg.optimizer.lr
    assert learning_rate(free_start + 1, cfg) < cfg.optimizer.lr


@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_no_weight_decay_on_norms_biases_embeddings_and_ssm_parameters(arch):
    cfg = load_config(ROOT / f"configs/tiny/{arch}-implicit.yaml", check_files=False)
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg.optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = ({names[id(p)] for p in g["params"]} for g in optimizer.param_groups)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and optimizer.param_groups[1]["weight_decay"] == 0
    assert optimizer.defaults["betas"] == (0.9, 0.95)
    assert "embedding.weight" in no_decay and "core.injection.proj.bias" in no_decay
    assert all(("norm" in n or n.endswith(("bias", "A_log", ".D", "dt_bias")) or "embedding" in n) for n in no_decay)
    assert any(n.endswith("A_log") for n in no_decay) == (arch == "mamba2")
    assert "core.injection.proj.weight" in decay
    assert all("norm" not in n and not n.endswith("bias") for n in decay)
    assert len(decay) + len(no_decay) == len(names)


def test_deepspeed_config_from_ours():
    cfg = load_config(ROOT / "configs/mamba2/1.3b-implicit.yaml", check_files=False)
    ds = deepspeed_config(cfg, world_size=32)
    assert ds["train_batch_size"] == 512 and ds["train_micro_batch_size_per_gpu"] == 8
    assert ds["gradient_accumulation_steps"] == 2 and ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    assert ds["zero_optimization"]["stage"] == 1 and ds["gradient_clipping"] == 1.0


def test_released_state_tracking_schedule_is_transformers_linear_schedule():
    """configs/state_tracking/released.yaml: 10 % warm-up, then a straight line to 0, as
    transformers' get_linear_schedule_with_warmup (our warm-up reaches each value one step earlier);
    the unrolled warm-up phase ends at the released 4005th step."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    from implicit_megatron.config import phase_bounds

    cfg = load_config(ROOT / "configs/state_tracking/released.yaml", check_files=False)
    total, warmup = cfg.train.steps, cfg.schedule.warmup_steps
    assert (total, warmup) == (16384, 1639)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optimizer.lr)
    theirs = get_linear_schedule_with_warmup(opt, warmup, total).lr_lambdas[0]
    for step in [*range(0, warmup, 97), *range(warmup, total, 113), total - 1]:
        want = cfg.optimizer.lr * theirs(step + 1 if step < warmup else step)
        assert learning_rate(step, cfg) == pytest.approx(want, rel=1e-9, abs=1e-15), step
    assert [(p.name, p.kind, start, end) for p, start, end in phase_bounds(cfg)] == [
        ("warmup", "unrolled", 0, 4005), ("deq", "free", 4005, 16384)]


def test_cosine_cooldown_to_min_lr():
    """schedule.cooldown: cosine: half a cosine from the peak to min_lr over the cooldown; with the
    cooldown starting at the end of the warmup it is transformers' cosine schedule lifted to min_lr."""
    import torch
    from transformers import get_cosine_schedule_with_warmup

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                      ["train.steps=1000", "schedule.warmup_steps=100", "schedule.cooldown_start=0.1",
                       "schedule.cooldown=cosine", "schedule.min_lr=1.0e-5", "optimizer.lr=3.0e-3"],
                      check_files=False)
    peak, floor = 3e-3, 1e-5
    assert learning_rate(99, cfg) == pytest.approx(peak)
    assert learning_rate(100, cfg) == pytest.approx(peak)  # the cooldown's first step
    assert learning_rate(550, cfg) == pytest.approx(floor + (peak - floor) * 0.5)  # half-way: the mean
    assert learning_rate(999, cfg) == pytest.approx(floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * 899 / 900)))
    theirs = get_cosine_schedule_with_warmup(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak),
                                             100, 1000).lr_lambdas[0]
    for step in (100, 250, 550, 800, 999):
        assert learning_rate(step, cfg) - floor == pytest.approx((peak - floor) * theirs(step), rel=1e-9)
