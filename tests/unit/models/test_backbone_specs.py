"""Each backbone's facts live in its folder (models/<arch>/spec.py): nothing outside models/ asks
which backbone it has, and each spec names what it claims (its section, its tensors, its names)."""

from __future__ import annotations

import ast
import dataclasses
import typing

import pytest
import torch
from support.processes import ROOT

from implicit_megatron import build_model, load_config
from implicit_megatron.config import ModelConfig
from implicit_megatron.models.registry import SPECS, spec_of

OUTSIDE_MODELS = [p for folder in ("implicit_megatron", "data_pipeline", "tools") for p in (ROOT / folder).rglob("*.py")
                  if not p.is_relative_to(ROOT / "implicit_megatron" / "models")]
BACKBONE_WORDS = {*SPECS, *(spec.released_model_type for spec in SPECS.values())}


def backbone_questions(source: str) -> list[str]:
    """`x.arch == ...`, `arch != ...`, `... == "llama"` or `... in ("mamba2", ...)`: a question of which
    backbone it is, anywhere in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for op, left, right in zip(node.ops, [node.left, *node.comparators[:-1]], node.comparators, strict=True):
            sides = (left, right)
            if isinstance(op, (ast.Eq, ast.NotEq)):
                asks = any(ast.unparse(side).rsplit(".", 1)[-1] == "arch" or
                           (isinstance(side, ast.Constant) and side.value in BACKBONE_WORDS) for side in sides)
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                asks = any(isinstance(e, ast.Constant) and e.value in BACKBONE_WORDS for e in right.elts)
            else:
                asks = False
            if asks:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_models_asks_which_backbone_it_has():
    assert len(OUTSIDE_MODELS) > 100
    asked = [f"{path.relative_to(ROOT)}:{q}" for path in OUTSIDE_MODELS for q in backbone_questions(path.read_text())]
    assert asked == []


def test_a_question_of_the_backbone_is_found_however_it_is_asked():
    asks = ('if cfg.model.arch == "llama": pass', 'if arch != other: pass', 'x = hf.get("model_type") == "mamba2"',
            'ok = kind in ("llama", "mamba2")', 'if "implicit_llama3" == t: pass')
    assert all(backbone_questions(source) for source in asks)
    assert not backbone_questions('if args.arch in (a, "both"): pass\nok = arch in ROPE_MODELS\nn = cfg.d_model == 4')


@pytest.mark.parametrize("arch", list(SPECS))
def test_each_spec_names_its_section_tensors_and_released_names(arch):
    spec = spec_of(arch)
    hints = typing.get_type_hints(ModelConfig)
    assert hints[arch] is spec.settings and arch in typing.get_args(hints["arch"])
    assert set(spec.shape_keys) <= {f.name for f in dataclasses.fields(spec.settings)}
    cfg = load_config(ROOT / f"configs/tiny/{arch}-explicit.yaml", check_files=False)
    model = build_model(cfg)
    layer_names = {name.split(".", 4)[4] for name in model.state_dict() if name.startswith("core.backbone.layers.0.")}
    modules = {name for name, _ in model.backbone.layers[0].named_modules()}
    assert all(any(m.endswith(projection) for m in modules) for projection in spec.residual_projections)
    assert all(any(n.startswith(ours) for n in layer_names) for ours in spec.released_layer_names.values())
    assert all(any(n.startswith(ours) for ours in spec.released_layer_names.values()) for n in layer_names)
    assert spec.kernels_in_use(torch.empty(0)) in ("pytorch", "sdpa")  # no fused kernels on a CPU
