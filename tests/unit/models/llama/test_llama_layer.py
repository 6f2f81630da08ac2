"""Llama decoder layer against transformers' LlamaDecoderLayer in float64; KV-cache decoding."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer as RefLayer

from implicit_megatron.models.llama import LlamaDecoderLayer

D_MODEL, HEADS, FFN, THETA = 32, 4, 48, 500.0
HEAD_DIM = D_MODEL // HEADS


def pair(kv_heads: int = HEADS) -> tuple[RefLayer, LlamaDecoderLayer]:
    cfg = LlamaConfig(hidden_size=D_MODEL, intermediate_size=FFN, num_attention_heads=HEADS,
                      num_key_value_heads=kv_heads, num_hidden_layers=1, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": THETA}, attn_implementation="eager")
    ref = RefLayer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3)
    ours = LlamaDecoderLayer(D_MODEL, HEADS, FFN, n_kv_heads=kv_heads, rope_theta=THETA, norm_eps=1e-5)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def reference_inputs(t: int, batch: int = 2):
    """What transformers 5 passes a decoder layer: (cos, sin) of shape (B, T, head_dim) and an additive mask."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat([angles, angles], -1).expand(batch, t, HEAD_DIM)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    return {"position_embeddings": (emb.cos(), emb.sin()), "attention_mask": mask}


def test_parameter_names_are_transformers():
    ref, ours = pair(kv_heads=2)
    assert set(ours.state_dict()) == set(ref.state_dict())
    assert {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"} == set(ours.state_dict())
    assert ours.injection_width == D_MODEL + 2 * (D_MODEL // 2)
    assert pair()[1].injection_width == 3 * D_MODEL


@pytest.mark.parametrize("kv_heads", [HEADS, 2, 1])
@pytest.mark.parametrize("t", [1, 13])
def test_forward_matches_transformers(kv_heads, t, rel_err, float64_reference):
    ref, ours = pair(kv_heads)
    z = torch.randn(2, t, D_MODEL)
    with torch.no_grad():
        y = ours(z)
        y_ref_as_is = ref(z, **reference_inputs(t))
        with float64_reference:
            y_ref = ref(z, **reference_inputs(t))
    assert rel_err(y, y_ref) < 1e-12
    assert rel_err(y, y_ref_as_is) < 1e-6


def test_injection_is_added_to_qkv_before_rope(rel_err, float64_reference):
    ref, ours = pair(kv_heads=2)
    z = torch.randn(2, 13, D_MODEL)
    inj = torch.randn(2, 13, ours.injection_width)
    dq, dk, dv = inj.split([D_MODEL, D_MODEL // 2, D_MODEL // 2], dim=-1)
    attn = ref.self_attn
    hooks = [proj.register_forward_hook(lambda module, args, out, d=d: out + d)
             for proj, d in ((attn.q_proj, dq), (attn.k_proj, dk), (attn.v_proj, dv))]
    with torch.no_grad(), float64_reference:
        y_ref = ref(z, **reference_inputs(13))
    for h in hooks:
        h.remove()
    with torch.no_grad():
        y = ours(z, inj=inj)
    assert rel_err(y, y_ref) < 1e-12


@pytest.mark.parametrize("kv_heads", [HEADS, 2])
def test_kv_cache_decoding_equals_full_attention(kv_heads, rel_err):
    _, ours = pair(kv_heads)
    z = torch.randn(3, 17, D_MODEL)
    inj = torch.randn(3, 17, ours.injection_width) * 0.3
    with torch.no_grad():
        y = ours(z, inj)
        state, outs = ours.allocate_state(3, max_seq_len=32), []
        for i in range(17):
            out, state = ours.step(z[:, i], state, inj[:, i])
            outs.append(out)
    assert state.length == 17
    assert rel_err(torch.stack(outs, 1), y) < 1e-12


def test_step_candidates_do_not_disturb_the_committed_state(rel_err):
    """Step one state with several candidates, commit an earlier one, continue: equals full attention."""
    _, ours = pair(kv_heads=2)
    z = torch.randn(2, 10, D_MODEL)
    with torch.no_grad():
        y = ours(z)
        state = ours.allocate_state(2, max_seq_len=16)
        for i in range(5):
            state = ours.step(z[:, i], state)[1]
        out_a, cand_a = ours.step(z[:, 5], state)  # the candidate that will be committed
        for _ in range(3):
            ours.step(torch.randn(2, D_MODEL), state)  # later candidates, discarded
        state, outs = cand_a, [out_a]
        for i in range(6, 10):
            out, state = ours.step(z[:, i], state)
            outs.append(out)
    assert rel_err(torch.stack(outs, 1), y[:, 5:]) < 1e-12


def test_cache_capacity_is_enforced():
    _, ours = pair()
    state = ours.allocate_state(1, max_seq_len=2)
    with torch.no_grad():
        for _ in range(2):
            state = ours.step(torch.randn(1, D_MODEL), state)[1]
        with pytest.raises(RuntimeError, match="KV cache full"):
            ours.step(torch.randn(1, D_MODEL), state)


def test_seq_idx_isolates_packed_documents(rel_err):
    _, ours = pair(kv_heads=2)
    lengths = [5, 9, 4]
    docs = [torch.randn(2, n, D_MODEL) for n in lengths]
    seq_idx = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)]).expand(2, -1)
    with torch.no_grad():
        packed = ours(torch.cat(docs, 1), seq_idx=seq_idx)
        start = 0
        for doc in docs:
            assert rel_err(packed[:, start:start + doc.shape[1]], ours(doc)) < 1e-12
            start += doc.shape[1]
