"""`train.timers` reach each log interval through their hook: the sections the step timed, in
ms per step since the last interval, and nothing when the timers are off."""

from __future__ import annotations

import time

import torch

from implicit_megatron.train.callbacks import Hooks
from implicit_megatron.train.callbacks.timers import StepTimers


def timed_steps(timers: StepTimers, steps: int) -> None:
    for _ in range(steps):
        with timers.section("forward"), timers.section("solve"):
            time.sleep(0.01)
        timers.count_step()


def test_an_interval_gets_the_sections_in_ms_per_step_then_starts_over():
    timers = StepTimers(True, torch.device("cpu"))
    hooks = Hooks([timers])
    timed_steps(timers, 2)
    metrics = {"train/loss": 1.0}
    hooks.interval(metrics)
    assert set(metrics) == {"train/loss", "timers/forward_ms", "timers/solve_ms"}
    assert 10 <= metrics["timers/solve_ms"] <= metrics["timers/forward_ms"] < 1000
    again: dict[str, float] = {}
    hooks.interval(again)
    assert again == {}  # nothing timed since


def test_timers_off_add_nothing():
    timers = StepTimers(False, torch.device("cpu"))
    timed_steps(timers, 3)
    metrics: dict[str, float] = {}
    Hooks([timers]).interval(metrics)
    assert metrics == {}
