"""Backbone contract (forward, step, state, injection) and whole LMs against transformers' CausalLMs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM

from implicit_megatron import build_model, load_config
from implicit_megatron.models.backbone import Backbone
from implicit_megatron.models.llama import KVCache
from implicit_megatron.models.lm import LanguageModel, seq_idx_from_eod
from implicit_megatron.models.mamba2 import Mamba2State


def tiny(arch: str, *overrides: str):
    return load_config(f"configs/tiny/{arch}-explicit.yaml", list(overrides), check_files=False)


@pytest.fixture(params=["mamba2", "llama"])
def arch(request):
    return request.param


def test_backbone_contract_shapes(arch):
    cfg = tiny(arch).model
    bb = Backbone(cfg)
    z = torch.randn(2, 7, cfg.d_model)
    out = bb(z)
    assert out.shape == z.shape
    # F's output is normalised: RMS 1 per position with the initial unit norm weight
    assert torch.allclose(out.pow(2).mean(-1), torch.ones(2, 7), atol=1e-3)
    if arch == "mamba2":
        s, inner = cfg.mamba2, cfg.mamba2.inner_width(cfg.d_model)
        assert bb.injection_width == 2 * inner + 2 * s.ngroups * s.d_state + inner // s.headdim
    else:
        assert bb.injection_width == 3 * cfg.d_model
    state = bb.allocate_state(2, 16, device="cpu", dtype=torch.float64)
    assert len(state) == cfg.n_layers
    assert all(isinstance(s, Mamba2State if arch == "mamba2" else KVCache) for s in state)


def test_backbone_step_equals_forward_with_injection(arch, rel_err):
    cfg = tiny(arch).model
    bb = Backbone(cfg)
    t = 23  # not a multiple of the tiny chunk size (16)
    z = torch.randn(2, t, cfg.d_model)
    inj = torch.randn(2, t, bb.injection_width) * 0.2
    with torch.no_grad():
        full = bb(z, inj)
        state, outs = bb.allocate_state(2, t), []
        for i in range(t):
            candidate = None
            for _ in range(2):  # several candidates under one committed state, as the implicit solver does
                out, candidate = bb.step(torch.randn(2, cfg.d_model), state, inj[:, i])
            out, candidate = bb.step(z[:, i], state, inj[:, i])
            outs.append(out)
            state = candidate
    assert rel_err(torch.stack(outs, 1), full) < 1e-12


def test_backbone_injection_reaches_every_layer(arch):
    cfg = tiny(arch).model
    bb = Backbone(cfg)
    z = torch.randn(1, 5, cfg.d_model)
    inj = torch.randn(1, 5, bb.injection_width)
    seen = []
    hooks = [layer.register_forward_hook(lambda m, args, out: seen.append(args[1] is inj)) for layer in bb.layers]
    bb(z, inj)
    for h in hooks:
        h.remove()
    assert seen == [True] * cfg.n_layers


def test_mamba2_lm_matches_transformers(rel_err, float64_reference):
    full = tiny("mamba2", "model.vocab_size=100", "model.pad_vocab_multiple=16", "model.mamba2.ngroups=2")
    cfg = full.model
    ours = build_model(full)
    s = cfg.mamba2
    ref = Mamba2ForCausalLM(Mamba2Config(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        state_size=s.d_state, expand=s.expand, head_dim=s.headdim,
        num_heads=s.inner_width(cfg.d_model) // s.headdim,
        n_groups=s.ngroups, conv_kernel=s.d_conv, chunk_size=s.chunk_size, layer_norm_epsilon=cfg.norm_eps,
        tie_word_embeddings=True)).eval()
    state = {"embedding.weight": ref.backbone.embeddings.weight}
    for name, p in ref.backbone.named_parameters():
        if name.startswith(("layers.", "norm_f.")):
            state["core.backbone." + name] = p
    with torch.no_grad():
        for p in state.values():  # random weights, not the init: every parameter must matter
            p.normal_(0.0, 0.2)
    ours.load_state_dict(state, strict=True)
    ids = torch.randint(0, 100, (2, 37))
    with torch.no_grad(), float64_reference:
        logits_ref = ref(ids).logits
    with torch.no_grad():
        logits = ours(ids)
    assert logits.shape == (2, 37, 112)
    assert rel_err(logits, logits_ref) < 1e-10


def test_llama_lm_matches_transformers(rel_err, float64_reference):
    full = tiny("llama", "model.vocab_size=100", "model.llama.n_kv_heads=2", "model.llama.rope_theta=1000.0")
    cfg = full.model
    ours = build_model(full)
    s = cfg.llama
    ref = LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.llama.mlp_width(cfg.d_model),
        num_hidden_layers=cfg.n_layers, num_attention_heads=s.n_heads, num_key_value_heads=s.n_kv_heads,
        rms_norm_eps=cfg.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
        tie_word_embeddings=True, attn_implementation="sdpa")).eval()
    head_dim = cfg.d_model // s.n_heads  # the reference's frequencies in float64, not float32 upcast
    ref.model.rotary_emb.inv_freq = 1.0 / s.rope_theta ** (torch.arange(0, head_dim, 2) / head_dim)
    state = {"embedding.weight": ref.model.embed_tokens.weight}
    for name, p in ref.model.named_parameters():
        if name.startswith("layers."):
            state["core.backbone." + name] = p
    state["core.backbone.norm_f.weight"] = ref.model.norm.weight
    with torch.no_grad():
        for p in state.values():
            p.normal_(0.0, 0.2)
    ours.load_state_dict(state, strict=True)
    ids = torch.randint(0, 100, (2, 19))
    with torch.no_grad(), float64_reference:
        logits_ref = ref(ids).logits
    with torch.no_grad():
        logits = ours(ids)
    assert rel_err(logits, logits_ref) < 1e-10


def test_lm_seq_idx_and_eod_documents(arch, rel_err):
    model = build_model(tiny(arch, "model.vocab_size=50"))
    eod = 0
    doc1, doc2 = torch.randint(1, 50, (1, 12)), torch.randint(1, 50, (1, 21))
    ids = torch.cat([doc1, torch.tensor([[eod]]), doc2], 1)
    seq_idx = seq_idx_from_eod(ids, eod)
    assert seq_idx.dtype == torch.int32
    assert seq_idx[0, :13].eq(0).all() and seq_idx[0, 13:].eq(1).all()  # EOD ends its document
    with torch.no_grad():
        packed = model(ids, seq_idx=seq_idx)
        alone = model(doc2)
    assert rel_err(packed[:, 13:], alone) < 1e-12


def test_build_model_and_parameter_counting():
    cfg = tiny("mamba2")
    model = build_model(cfg)
    assert isinstance(model, LanguageModel)
    assert model.backbone is model.core.backbone
    emb = cfg.model.padded_vocab_size * cfg.model.d_model
    total = sum(p.numel() for p in model.parameters())  # parameters() yields the tied weight once
    assert model.num_parameters() == total
    assert model.num_parameters(exclude_embedding=True) == total - emb
    assert model.head_weight is model.embedding.weight
    untied = build_model(tiny("mamba2", "model.tie_embeddings=false"))
    assert untied.num_parameters() == total + emb
    assert untied.num_parameters(exclude_embedding=True) == total - emb
    implicit = build_model(load_config("configs/tiny/mamba2-implicit.yaml", ["implicit.weight_norm=false"],
                                       check_files=False))
    injection = sum(p.numel() for p in implicit.core.injection.parameters())
    assert implicit.num_parameters() == total + injection


def test_custom_core_is_used():
    class Doubling(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    model = LanguageModel(tiny("llama").model, core=Doubling())
    ids = torch.randint(0, 100, (1, 4))
    expected = 2 * model.embedding(ids) @ model.embedding.weight.t()
    assert torch.allclose(model(ids), expected)


def test_initialisation_recipes():
    cfg = tiny("llama", "model.d_model=256", "model.n_layers=4", "model.init_std=0.02")
    model = build_model(cfg)
    layer = model.backbone.layers[0]
    assert abs(model.embedding.weight.std().item() - 0.02) < 1e-3
    assert abs(layer.self_attn.q_proj.weight.std().item() - 0.02) < 1e-3
    scaled = 0.02 / math.sqrt(2 * 4)
    assert abs(layer.self_attn.o_proj.weight.std().item() - scaled) < 0.05 * scaled
    assert abs(layer.mlp.down_proj.weight.std().item() - scaled) < 0.05 * scaled
    assert torch.equal(layer.input_layernorm.weight, torch.ones(256))

    cfg = tiny("mamba2", "model.n_layers=4")
    mixer = build_model(cfg).backbone.layers[0].mixer
    bound = 1 / math.sqrt(mixer.d_inner) / math.sqrt(4)  # kaiming-uniform / sqrt(n_residuals * n_layers)
    w = mixer.out_proj.weight
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound


def test_activation_checkpointing_gives_the_same_gradients(arch, rel_err):
    cfg = tiny(arch).model
    bb = Backbone(cfg)
    z = torch.randn(2, 9, cfg.d_model)
    bb(z).square().sum().backward()
    grads = [p.grad.clone() for p in bb.parameters()]
    bb.zero_grad()
    bb.checkpoint_layers = True
    bb(z).square().sum().backward()
    for g, p in zip(grads, bb.parameters()):
        assert rel_err(p.grad, g) < 1e-12


def test_bfloat16_model_tracks_float32(arch, rel_err):
    """Half-precision weights and activations, statistics and scan in float32: close to the float32 model."""
    cfg = tiny(arch).model
    ref = Backbone(cfg).float()
    half = Backbone(cfg).to(torch.bfloat16)
    half.load_state_dict(ref.state_dict())
    z = torch.randn(2, 21, cfg.d_model, dtype=torch.float32)
    inj = torch.randn(2, 21, ref.injection_width, dtype=torch.float32) * 0.2
    y = half(z.bfloat16(), inj)  # a float32 injection is cast to the model dtype
    assert y.dtype == torch.bfloat16
    assert rel_err(y.float(), ref(z, inj)) < 0.05
    y.float().square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in half.parameters())
    with torch.no_grad():
        state = half.allocate_state(2, 21)
        out, state = half.step(z[:, 0].bfloat16(), state, inj[:, 0])
    assert out.dtype == torch.bfloat16
    if arch == "mamba2":
        assert state[0].ssm.dtype == torch.float32 and state[0].conv.dtype == torch.bfloat16
