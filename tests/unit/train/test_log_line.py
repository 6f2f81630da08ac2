"""The log lines a person reads: every field where the metrics have it, numbers a person can scan."""

from __future__ import annotations

import time

import torch

from implicit_megatron.train.callbacks.timers import StepTimers
from implicit_megatron.train.log_line import clock, timers_line, training_line, validation_lines

FULL = {"train/loss": 4.51234, "train/lr": 3e-4, "train/grad_norm": 0.8423, "solver/iterations": 5.0,
        "solver/residual": 3.14e-3, "solver/converged_frac": 1.0, "train/step_seconds": 0.4123,
        "train/tokens_per_s": 39712.4, "train/mfu": 0.4123, "memory/max_allocated_gib": 12.34,
        "memory/host_rss_gib": 1.21, "train/consumed_samples": 61440}


def test_a_training_line_has_every_field_in_order():
    line = training_line(FULL, 120, 1000, elapsed=252, eta=1811)
    assert line == ("step 120/1,000 | loss 4.5123 | lr 3.00e-04 | grad 0.842 | passes 5.0 res 3.1e-03 conv 100% | "
                    "412 ms/step | 39,712 tok/s | MFU 41.2% | mem 12.3 GiB RSS 1.2 GiB | 0:04:12 elapsed, ETA 0:30:11")


def test_fields_a_run_does_not_have_are_left_out():
    """An explicit model on a CPU: no solver, no MFU, no GPU memory; no ETA before a step was timed."""
    metrics = {k: v for k, v in FULL.items() if not k.startswith(("solver/", "train/mfu", "memory/max"))}
    line = training_line(metrics, 1, 20_000, elapsed=3, eta=None)
    assert line == ("step 1/20,000 | loss 4.5123 | lr 3.00e-04 | grad 0.842 | 412 ms/step | 39,712 tok/s | "
                    "RSS 1.2 GiB | 0:00:03 elapsed")


def test_validation_lines_lead_with_the_set_and_are_not_training_lines():
    results = {"val/loss": 4.2, "val/ppl": 66.686, "val/solver_iterations": 12.34, "val/solver_residual": 0.021,
               "val/converged_frac": 0.98, "val_len64/loss": 0.3, "val_len64/accuracy": 0.9}
    assert validation_lines(results, 1000) == [
        "val        step 1,000 | loss 4.2000 | ppl 66.69 | passes 12.3 res 2.1e-02 conv 98%",
        "val_len64  step 1,000 | loss 0.3000 | acc 0.9000",
    ]


def test_clock():
    assert clock(0) == "0:00:00" and clock(3599.6) == "1:00:00" and clock(90061) == "1d 1:01:01"


def test_timers_off_cost_nothing_and_report_nothing():
    timers = StepTimers(False, torch.device("cpu"))
    with timers.section("forward"):
        time.sleep(0.01)
    timers.count_step()
    assert timers.read() == {}


def test_timers_give_ms_per_step_and_start_over_at_each_read():
    timers = StepTimers(True, torch.device("cpu"))
    for _ in range(2):
        with timers.section("forward"), timers.section("solve"):
            time.sleep(0.02)
        with timers.section("backward"):
            pass
        timers.count_step()
    read = timers.read()
    assert list(read) == ["timers/forward_ms", "timers/solve_ms", "timers/backward_ms"]
    assert 20 <= read["timers/solve_ms"] <= read["timers/forward_ms"] < 200
    assert timers.read() == {}
    line = timers_line({"timers/data_ms": 1.0, "timers/forward_ms": 1234.5, "timers/solve_ms": 1000.0,
                        "timers/phantom_ms": 200.0, "timers/backward_ms": 300.0, "timers/optimizer_ms": 10.0})
    assert line == ("time per step (ms): data 1.0 | forward 1,234.5 (solve 1,000.0, phantom 200.0) | backward 300.0 | "
                    "optimizer 10.0")
