"""Every config field declares its domain in the schema (utils.domains), and one validator holds
every value to it however the config arrives: a command-line override, a YAML file, a `base:` file,
an export's config.json, or a config made in code. Each refusal names the key."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from implicit_megatron import load_config
from implicit_megatron.config import Config, read_config
from implicit_megatron.config.rules import validate
from implicit_megatron.hf.export_reader import checked_run_config
from implicit_megatron.utils.domains import declares_domain, domain_problems
from implicit_megatron.utils.typed_yaml import ConfigError, apply_overrides

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
EXPLICIT, IMPLICIT = CONFIGS / "tiny/mamba2-explicit.yaml", CONFIGS / "tiny/mamba2-implicit.yaml"

# (base, override, the key an error names, what it says): each passed the check before its domain was
# declared, and ended in a traceback on the ranks or a run that was silently wrong
FINDINGS = [
    (IMPLICIT, "curriculum.phases.free.tol=.nan", "curriculum.phases[1].tol", "expected a tolerance > 0, got nan"),
    (IMPLICIT, "curriculum.phases.free.tol=.inf", "curriculum.phases[1].tol", "expected a tolerance > 0, got inf"),
    (EXPLICIT, "implicit.eval_max_iter=-3", "implicit.eval_max_iter", "expected an integer >= 1 (passes), got -3"),
    (EXPLICIT, "optimizer.betas=[1.5, -3]", "optimizer.betas[0]", "expected a finite number in [0, 1), got 1.5"),
    (EXPLICIT, "optimizer.betas=[0.9, -3]", "optimizer.betas[1]", "expected a finite number in [0, 1), got -3.0"),
    (EXPLICIT, "optimizer.eps=-1", "optimizer.eps", "expected a finite number > 0, got -1.0"),
    (EXPLICIT, "distributed.collective_timeout_minutes=.inf", "distributed.collective_timeout_minutes",
     "expected a finite number in (0, 525600] (minutes), got inf"),
    (EXPLICIT, "data.seed=-1", "data.seed", "expected a seed in [0, 4294967295], got -1"),
    (EXPLICIT, "train.seed=4294967296", "train.seed", "expected a seed in [0, 4294967295], got 4294967296"),
    (EXPLICIT, "model.llama.ffn_multiple_of=0", "model.llama.ffn_multiple_of", "expected an integer > 0, got 0"),
    (EXPLICIT, "train.steps=100000000000000000000", "train.steps",
     "expected an integer > 0 of at most 64 bits, got 100000000000000000000"),
    (EXPLICIT, "checkpoint.max_loss_jump=0.5", "checkpoint.max_loss_jump", "expected a finite number > 1, got 0.5"),
    (EXPLICIT, "optimizer.lr=1" + "0" * 400, "optimizer.lr", "expected a finite number, got an integer of 401 digits"),
]


@pytest.mark.parametrize("base, override, key, message", FINDINGS)
def test_a_value_outside_its_domain_is_refused_naming_the_key_on_the_command_line(base, override, key, message):
    with pytest.raises(ConfigError) as info:
        load_config(base, [override], check_files=False)
    assert (info.value.source, info.value.key, info.value.message) == ("command line", key, message)


@pytest.mark.parametrize("base, override, key, message", FINDINGS[:8])
def test_the_same_in_a_file_in_its_base_and_in_an_exports_config_json(tmp_path, base, override, key, message):
    dotted, value = override.split("=", 1)
    parts = dotted.split(".")
    if parts[:2] == ["curriculum", "phases"]:  # the file gives the whole list: the phase's own line changed
        text = IMPLICIT.read_text().replace("tol: 0.05}", f"tol: {value}}}")
        text = text.replace("base: mamba2-explicit.yaml", f"base: {EXPLICIT}")
    else:
        text = f"base: {base}\n" + "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1]))
        text += f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}\n"
    (tmp_path / "base.yaml").write_text(text)
    (tmp_path / "run.yaml").write_text("base: base.yaml\nname: on-top\n")
    for path in (tmp_path / "base.yaml", tmp_path / "run.yaml"):
        with pytest.raises(ConfigError) as info:
            load_config(path, [], check_files=False)
        assert (info.value.source, info.value.key, info.value.message) == (str(tmp_path / "base.yaml"), key, message)

    saved = read_config(base).to_dict()  # as an export's config.json holds it
    exported = json.loads(json.dumps(saved))
    exported, _ = apply_overrides(exported, {}, [override])
    with pytest.raises(ConfigError) as info:
        checked_run_config(exported, "config.json")
    assert (info.value.key, info.value.message) == (f"implicit_megatron.{key}", message)


def test_a_config_made_in_code_is_held_to_the_same_domains():
    cfg = Config()
    cfg.optimizer.eps = -1.0

    def fail(key, message, *also):
        raise ConfigError("code", key, message)

    with pytest.raises(ConfigError, match=r"^code: optimizer.eps: expected a finite number > 0, got -1.0$"):
        validate(cfg, fail, world_size=1)


def _fields(cls: type, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints[f.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        element = typing.get_args(inner[0])[0] if typing.get_origin(inner[0]) in (list, tuple) else inner[0]
        if dataclasses.is_dataclass(element):
            yield from _fields(typing.cast(type, element), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, element


def test_every_numeric_field_declares_its_domain_and_every_default_lies_in_it():
    undeclared = [key for key, f, element in _fields(Config) if element in (int, float) and not declares_domain(f)]
    assert undeclared == []
    assert list(domain_problems(Config())) == []
    assert {"data.seed", "optimizer.betas", "curriculum.phases.tol", "model.mamba2.A_init_range",
            "model.llama.rope_theta"} <= {key for key, _, _ in _fields(Config)}


def test_blending_weights_that_are_all_zero_are_refused():
    """Each weight is in its domain (>= 0), but together they would read no prefix (a rule across them)."""
    with pytest.raises(ConfigError) as info:
        load_config(EXPLICIT, ["data.prefixes=[a, b]", "data.weights=[0, 0]"], check_files=False)
    assert info.value.key == "data.weights"
    assert info.value.message == "every weight is 0: at least one prefix must be read"
    assert load_config(EXPLICIT, ["data.prefixes=[a, b]", "data.weights=[0, 1]"], check_files=False).data.weights == \
        [0.0, 1.0]
