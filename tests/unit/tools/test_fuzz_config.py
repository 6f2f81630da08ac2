"""tools/dev/fuzz_config.py holds the config check to every field's declared domain: every key of the
schema, given NaN, infinities, 0, -1, huge numbers, wrong types and twice, through an override, a
file on a base and an export's config.json, is refused naming the key or accepted inside its domain,
never a traceback or a process. And the fuzzer finds what it should where a guard is taken away."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path

from implicit_megatron.config import OptimizerConfig, reading
from implicit_megatron.utils import domains, typed_yaml

DEV = Path(__file__).resolve().parents[3] / "tools" / "dev"
sys.path.insert(0, str(DEV))
import fuzz_config  # noqa: E402


def run(prefix: str) -> list[str]:
    return fuzz_config.fuzz(prefix, say=lambda line: None)[1]


def test_every_key_of_the_schema_is_refused_by_name_or_accepted_in_its_domain():
    keys = {key.dotted for key in fuzz_config.schema_keys()}
    assert {"data.seed", "optimizer.betas", "curriculum.phases.free.tol", "curriculum.phases.free.launch.num_nodes",
            "model.llama.rope_theta", "distributed.collective_timeout_minutes", "model"} <= keys
    count, findings = fuzz_config.fuzz(say=lambda line: None)
    assert findings == []
    assert count >= len(keys) * (len(fuzz_config.VALUES) + 1)


def test_a_field_without_its_domain_is_found(monkeypatch):
    eps = next(f for f in dataclasses.fields(OptimizerConfig) if f.name == "eps")
    monkeypatch.setattr(eps, "metadata", types.MappingProxyType({}))
    said = "\n".join(run("optimizer.eps"))
    assert "optimizer.eps=-1" in said and "declares no domain" in said, said


def test_a_validator_that_lets_values_through_is_found(monkeypatch):
    monkeypatch.setattr(domains.Domain, "problem", lambda self, value: None)
    said = "\n".join(run("optimizer.eps"))
    assert "optimizer.eps=.nan" in said and "accepted: optimizer.eps holds nan" in said, said
    assert "optimizer.eps=\"a\\nb\"" not in said  # a string is the type's to refuse


def test_a_traceback_a_process_and_a_nameless_refusal_are_found(monkeypatch):
    check = reading.validate

    def broken(cfg, fail, world_size=None):
        if cfg.optimizer.weight_decay == 0:
            raise ZeroDivisionError("division by zero")
        if cfg.optimizer.weight_decay > 1e300:  # inside its domain: a rule across keys that names another
            fail("optimizer.lr", "something is wrong")
        if cfg.optimizer.grad_clip == 0:
            subprocess.run(["true"], check=False)
        return check(cfg, fail, world_size)

    monkeypatch.setattr(reading, "validate", broken)
    said = "\n".join(run("optimizer.weight_decay") + run("optimizer.grad_clip"))
    assert "ZeroDivisionError: division by zero (not a ConfigError)" in said, said
    assert "refused without naming the key: " in said and "optimizer.lr: something is wrong" in said, said
    assert "started a process" in said, said


def test_a_key_read_twice_without_a_word_is_found(monkeypatch):
    monkeypatch.delattr(typed_yaml._NoAliases, "construct_mapping")
    said = "\n".join(run("train.steps"))
    assert "train.steps twice: given twice, read" in said, said
