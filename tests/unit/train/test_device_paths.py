"""The lines that run only on a GPU outside the graph path, run here against a stand-in GPU
(support/cuda_api.py): the MFU's peak by device name, the GPU memory metric, the step timers'
synchronisation, the device generator in checkpoints, the process group's backend."""

from __future__ import annotations

import time

import pytest
import torch
from support.cuda_api import StandInGPU
from support.processes import ROOT

from implicit_megatron import load_config
from implicit_megatron.train.callbacks.reporting import memory_metrics
from implicit_megatron.train.callbacks.timers import StepTimers
from implicit_megatron.train.engine import process_group_backend
from implicit_megatron.train.flops import peak_flops_per_device
from implicit_megatron.train.run_state import RngState


@pytest.fixture
def cfg():
    return load_config(ROOT / "configs/tiny/mamba2-implicit.yaml")


@pytest.mark.parametrize("name, tflops", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0),
                                          ("NVIDIA A100-SXM4-80GB", 312.0), ("AMD Instinct MI300X", 1307.4),
                                          ("Tesla T4", None)])
def test_the_peak_for_mfu_comes_from_the_device_name(cfg, monkeypatch, name, tflops):
    assert peak_flops_per_device(cfg) is None  # no GPU: no MFU
    StandInGPU(name=name).install(monkeypatch)
    assert peak_flops_per_device(cfg) == (None if tflops is None else tflops * 1e12)
    cfg.train.peak_tflops = 500.0  # named in the config: that, whatever the device
    assert peak_flops_per_device(cfg) == 500e12


def test_the_gpu_peak_memory_is_reported_beside_the_hosts(monkeypatch):
    assert set(memory_metrics()) == {"memory/host_rss_gib"}
    StandInGPU(max_allocated=5 * 2**29).install(monkeypatch)
    memory = memory_metrics()
    assert memory["memory/max_allocated_gib"] == 2.5 and memory["memory/host_rss_gib"] > 0


def test_timers_synchronise_the_gpu_at_both_ends_of_each_section_and_only_when_on(monkeypatch):
    gpu = StandInGPU().install(monkeypatch)
    device = torch.device("cuda", 0)
    with StepTimers(False, device).section("forward"):
        pass
    assert gpu.calls == []
    timers = StepTimers(True, device)
    with timers.section("forward"):
        assert gpu.calls == [("synchronize", device)]  # the work queued before is not the section's
        time.sleep(0.01)
    assert gpu.calls == [("synchronize", device)] * 2
    timers.count_step()
    assert timers.read()["timers/forward_ms"] >= 10


def test_checkpoints_carry_the_gpu_generator(monkeypatch):
    assert "cuda" not in RngState().state_dict()
    gpu = StandInGPU().install(monkeypatch)
    saved = RngState().state_dict()
    assert torch.equal(saved["cuda"], torch.arange(16, dtype=torch.uint8))
    gpu.rng_state = torch.zeros(16, dtype=torch.uint8)  # the generator moves on
    RngState().load_state_dict(saved)
    assert ("set_rng_state",) in gpu.calls and torch.equal(gpu.rng_state, saved["cuda"])


def test_auto_backend_is_nccl_on_gpus_and_gloo_without(cfg, monkeypatch):
    assert process_group_backend(cfg) == "gloo"
    StandInGPU().install(monkeypatch)
    assert process_group_backend(cfg) == "nccl"
    cfg.distributed.backend = "gloo"
    assert process_group_backend(cfg) == "gloo"
