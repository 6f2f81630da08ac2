"""Reference outputs of the authors' released code (implicit_llm), for checkpoint import/export tests.

    PYTHONPATH=STUBS:SITE:RELEASED python tools/dev/make_released_fixture.py \
        [--out tests/fixtures/released] [--released RELEASED] [--stubs STUBS] [--dtype float64|float32]

RELEASED is a checkout of github.com/markschoene/implicit_languagemodels (the folder holding
`implicit_llm/` and `hf_models/`); SITE holds its dependencies (torchdeq 0.1.0 and
transformers 4.51.3 with a matching huggingface_hub / tokenizers, installed with
`pip install --target SITE --no-deps ...` so that they shadow the newer transformers of this
project's environment); STUBS optionally holds pure-PyTorch stand-ins of the `mamba_ssm` and
`causal_conv1d` kernels for machines without a GPU (with the real packages installed it can be left
out). `--released` and `--stubs` are put in front of sys.path, so they can replace PYTHONPATH entries.
Nothing of this project is imported: the script only needs torch, safetensors and the released code.

For a tiny implicit Llama and a tiny implicit Mamba2, built with the released classes from the
released 130m configs (`hf_models/{llama3,mamba2}-130m-implicit/config.json`, sizes shrunk, solver
settings kept), every parameter is set to a seeded, non-trivial value (weight_g != ||weight_v||,
norm weights != 1, biases != 0, random A_log / D / dt_bias), and OUT/{llama,mamba2}/ receives

    config.json, generation_config.json, pytorch_model.bin   the released `save_pretrained` output
    inputs.safetensors    input_ids (2, 24) int64
    logits.safetensors    eval        eval-mode forward of the whole sequence (damped iteration)
                          train       train-mode forward with the implicit solver settings
                          train_4p1   train-mode forward with the released "(4+1) pretrain" settings
                          sequential  the released `sequential_forward` (token by token with a cache)
    grads.safetensors     "{train,train_4p1}:{parameter name}" gradients of the loss in meta.json
    meta.json             settings, solver statistics, F-evaluation counts and residual traces

The released Block casts the residual stream to float32 after every sublayer unless
`residual_in_fp32` is false; for a float64 reference the tiny configs set it to false (a no-op in
float32). Mamba2 latent/state noise (40 dB in the released 130m implicit config) is switched off
(0 dB disables it) so that the sequential outputs are deterministic.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import sys
from importlib.metadata import version
from pathlib import Path

import torch
import torch.nn.functional as F

RELEASED_COMMIT = "92079fdefce88fc46ffc625965ef7b44b281f043"
BATCH, SEQ_LEN = 2, 24
# per-model seeds: every stopping decision of the fixture runs lies >= 0.7% away from the tolerance, the
# Llama training solve stops on the tolerance and the Mamba2 one runs into f_max_iter (both paths covered)
SEEDS = {"llama": 2, "mamba2": 10}
ROPE_MODELS = ("llama",)  # whose reference computes RoPE in float32 (its effect is recorded)

# weight_g = ||weight_v row|| * U(lo, hi), by module; chosen so that the fixed-point iterations
# contract at a moderate rate (several iterations, stopping values clear of the tolerance)
WEIGHT_G_GAINS = {"injection": (1.2, 2.0), "out_proj": (0.4, 0.8), "fc2": (0.4, 0.8), "": (0.5, 0.8)}

# gradients recorded (small tensors only, to keep the fixture small)
GRAD_PARAMS = {
    "llama": [
        "backbone.injection.weight_g", "backbone.injection.bias", "backbone.injection_norm.weight",
        "backbone.layers.0.norm.weight", "backbone.layers.0.mixer.wq.weight_g", "backbone.layers.0.mixer.wq.weight_v",
        "backbone.layers.0.norm2.weight", "backbone.layers.1.mixer.out_proj.weight_g",
        "backbone.layers.1.mlp.fc2.weight_g", "backbone.layers.1.mlp.w3.weight_g", "backbone.norm_f.weight",
    ],
    "mamba2": [
        "backbone.injection.weight_g", "backbone.injection.bias", "backbone.injection_norm.weight",
        "backbone.layers.0.norm.weight", "backbone.layers.0.mixer.A_log", "backbone.layers.0.mixer.D",
        "backbone.layers.0.mixer.dt_bias", "backbone.layers.0.mixer.conv1d.weight_g",
        "backbone.layers.0.mixer.conv1d.weight_v", "backbone.layers.0.mixer.conv1d.bias",
        "backbone.layers.0.mixer.norm.weight", "backbone.layers.1.mixer.in_proj.weight_g",
        "backbone.layers.1.mixer.out_proj.weight_g", "backbone.layers.1.mixer.out_proj.weight_v",
        "backbone.norm_f.weight",
    ],
}


# Each model's released folder name and its tiny sizes: (backbone_config, block_cfg, top-level) updates
TINY = {
    "llama": ("llama3", {"d_inner": 96},  # llama_mlp: hidden = int(2 * 96 / 3) = 64
              {"n_head": 4}, {"d_embed": 32, "vocab_size": 64}),
    "mamba2": ("mamba2", {}, {"d_state": 16, "expand": 2, "headdim": 16, "chunk_size": 8, "state_noise_db": 0.0,
                              "latent_noise_db": 0.0},
               {"d_embed": 32, "n_tokens": 60, "vocab_size": 60}),  # pad_vocab (multiple 16) -> 64 rows
}


def tiny_config(released: Path, arch: str, variant: str, dtype: torch.dtype) -> dict:
    """The released 130m config of `variant` (implicit | pretrain) with tiny sizes."""
    name, backbone, block, top = TINY[arch]
    cfg = json.loads((released / "hf_models" / f"{name}-130m-{variant}" / "config.json").read_text())
    bb = cfg["backbone_config"]
    bb.update(d_model=32, n_layer=2, **backbone)
    if dtype != torch.float32:
        bb["residual_in_fp32"] = False
    bb["block_cfg"] = {**bb["block_cfg"], **block}
    cfg.update(top)
    return cfg


def build(arch: str, cfg: dict, dtype: torch.dtype):
    import implicit_llm

    cfg_cls, model_cls = {
        "llama": (implicit_llm.ImplicitLlamaConfig, implicit_llm.ImplicitLlamaForCausalLM),
        "mamba2": (implicit_llm.ImplicitMambaConfig, implicit_llm.ImplicitMambaForCausalLM),
    }[arch]
    with contextlib.redirect_stdout(io.StringIO()):  # the released constructors print a lot
        model = model_cls(cfg_cls.from_dict(copy.deepcopy(cfg)))
    return model.to(dtype)


def inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


@torch.no_grad()
def set_parameters(model, seed: int, dtype: torch.dtype) -> None:
    """Seeded non-trivial values for every parameter (tied ones once)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    params = dict(model.named_parameters())  # tied decoder weight appears once (as word_emb.emb.weight)
    # weight_g last: it is drawn relative to the row norms of weight_v
    for name in sorted(params, key=lambda n: (n.endswith(".weight_g"), n)):
        p = params[name]
        shape = tuple(p.shape)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "weight_v":
            value = randn(*shape) / math.sqrt(math.prod(shape[1:]))
        elif leaf == "weight_g":
            v = params[name[: -len("_g")] + "_v"].detach().to(torch.float64)
            row_norm = v.flatten(1).norm(dim=1).view(shape)
            lo, hi = WEIGHT_G_GAINS[next((k for k in WEIGHT_G_GAINS if k in name), "")]
            value = row_norm * (lo + (hi - lo) * rand(*shape))
        elif name == "word_emb.emb.weight":
            value = 0.5 * randn(*shape)
        elif leaf == "bias":
            value = 0.1 * randn(*shape)
        elif leaf == "A_log":
            value = torch.log(1.0 + 7.0 * rand(*shape))
        elif leaf == "D":
            value = 0.5 + rand(*shape)
        elif leaf == "dt_bias":
            value = inv_softplus(torch.exp(math.log(0.01) + (math.log(0.3) - math.log(0.01)) * rand(*shape)))
        elif leaf == "weight" and p.dim() >= 2:  # layers without weight normalisation (explicit models)
            gain = 0.25 if any(s in name for s in ("out_proj", "fc2")) else 0.85
            value = gain * randn(*shape) / math.sqrt(math.prod(shape[1:]))
        elif leaf == "weight" and p.dim() == 1:  # RMSNorm / gated RMSNorm weights
            value = 0.7 + 0.6 * rand(*shape)
        else:
            raise ValueError(f"no rule for parameter {name} {shape}")
        p.copy_(value.to(dtype))


class FRecorder:
    """Wraps backbone.func (the map F(z; u)) to count its evaluations and keep residual norms.

    Every call stores per-sample norms (over all but the batch dimension) of F(z) - z, z and F(z).
    """

    def __init__(self, backbone):
        self.orig = backbone.func
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        backbone.func = self

    def __call__(self, z, u, mixer_kwargs={}):  # noqa: B006 - same signature as the released method
        out = self.orig(z, u, mixer_kwargs)
        with torch.no_grad():
            norms = [t.detach().flatten(1).norm(dim=1).double() for t in (out - z, z, out)]
        self.calls.append(tuple(norms))
        return out

    def take(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        calls, self.calls = self.calls, []
        return calls


def global_norm(per_sample: torch.Tensor) -> float:
    return per_sample.square().sum().sqrt().item()


def eval_trace(calls) -> list[float]:
    """The released eval criterion ||F(z) - z|| / (1e-6 + ||z||), norms over the whole batch tensor."""
    return [global_norm(dz) / (1e-6 + global_norm(zn)) for dz, zn, _ in calls]


def tol_margin(values, tol: float) -> float:
    """Smallest relative distance |v - tol| / tol over the values compared with the tolerance."""
    return min(abs(v - tol) / tol for v in values)


def metrics(d) -> dict:
    out = {}
    for k, v in (d or {}).items():
        if torch.is_tensor(v) and v.numel() == 1:
            out[k] = v.item()
        elif isinstance(v, (int, float)):
            out[k] = v
    return out


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of token t+1 from position t, over all logit columns (padded ones included)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@torch.no_grad()
def rope_float32_effect(model, ids) -> float:
    """max |eval logits - eval logits with cos/sin computed in float64| (transformers computes them in float32)."""
    from transformers.models.llama import modeling_llama

    cls = modeling_llama.LlamaRotaryEmbedding
    released_forward = cls.forward

    def forward64(self, x, position_ids):
        dim = 2 * self.inv_freq.numel()
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    model.eval()
    ref = model(input_ids=ids).logits
    cls.forward = forward64
    try:
        alt = model(input_ids=ids).logits
    finally:
        cls.forward = released_forward
    return (ref - alt).abs().max().item()


def run_arch(arch: str, released: Path, out: Path, dtype: torch.dtype, seed: int) -> dict:
    import implicit_llm
    from implicit_llm.utils import load_checkpoint

    cfg = tiny_config(released, arch, "implicit", dtype)
    cfg_4p1 = tiny_config(released, arch, "pretrain", dtype)
    model = build(arch, cfg, dtype)
    set_parameters(model, seed, dtype)
    folder = out / arch
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=False)  # the released from_pretrained reads pytorch_model.bin

    # the saved weights load back bit-exactly with the released reader, and with the released
    # from_pretrained (float32 default construction) without missing / unexpected keys
    saved = load_checkpoint(str(folder))
    own = model.state_dict()
    assert saved.keys() == own.keys(), (saved.keys() ^ own.keys())
    assert all(torch.equal(saved[k], own[k]) and saved[k].dtype == own[k].dtype for k in own)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        reloaded = type(model).from_pretrained(str(folder))
    assert "Warning" not in log.getvalue(), log.getvalue()
    del reloaded

    vocab_rows = model.word_emb.emb.weight.shape[0]
    gen = torch.Generator().manual_seed(seed + 1)
    real_vocab = cfg.get("n_tokens", cfg["vocab_size"])
    ids = torch.randint(0, real_vocab, (BATCH, SEQ_LEN), generator=gen)

    rec = FRecorder(model.backbone)
    meta: dict = {"vocab_size": real_vocab, "embedding_rows": vocab_rows, "runs": {}}
    logits, grads = {}, {}

    # eval mode: the released eval path (ImplicitMixin._sequential_forward over the whole sequence)
    model.eval()
    with torch.no_grad():
        o = model(input_ids=ids)
    calls = rec.take()
    logits["eval"] = o.logits.detach()
    b = model.backbone
    meta["runs"]["eval"] = {
        "implicit_metrics": metrics(o.implicit_metrics), "f_calls": len(calls),
        "max_iterations": b.f_thres - 1, "tau": b.tau, "f_tol": b.f_tol,
        # one value per loop iteration; the last call is the final undamped F
        "rel_diff_trace": eval_trace(calls[:-1]),
        "tol_margin": tol_margin(eval_trace(calls[:-1]), b.f_tol),
    }

    # train mode with the implicit (32 + 4) and the (4 + 1) settings, same weights
    for key, c in (("train", cfg), ("train_4p1", cfg_4p1)):
        if key == "train":
            m, r = model, rec
        else:
            m = build(arch, c, dtype)
            m.load_state_dict(model.state_dict(), strict=True)
            r = FRecorder(m.backbone)
        m.train()
        m.zero_grad(set_to_none=True)
        o = m(input_ids=ids)
        loss = next_token_loss(o.logits, ids)
        loss.backward()
        calls = r.take()
        named = dict(m.named_parameters())
        for p in GRAD_PARAMS[arch]:
            grads[f"{key}:{p}"] = named[p].grad.detach().clone()
        logits[key] = o.logits.detach()
        sp = c["deq_params"]
        n_grad = sp["training"]["grad"]
        meta["runs"][key] = {
            "implicit_metrics": metrics(o.implicit_metrics), "loss": loss.item(), "f_calls": len(calls),
            "f_max_iter": sp["solver"]["f_max_iter"], "grad": n_grad,
            "tau": sp["training"]["tau"], "f_tol": sp["solver"]["f_tol"],
            # torchdeq's per-sample ||F(z) - z|| / (||F(z)|| + 1e-9) of the no-grad solver steps, [step][sample]
            "rel_residual_trace_solver": [(dz / (fn + 1e-9)).tolist() for dz, _, fn in calls[: len(calls) - n_grad]],
        }
        # the solver stops when the largest per-sample value falls below f_tol
        meta["runs"][key]["tol_margin"] = tol_margin(
            [max(r) for r in meta["runs"][key]["rel_residual_trace_solver"]], sp["solver"]["f_tol"])
        m.zero_grad(set_to_none=True)
    model.eval()

    # sequential (recurrent) evaluation with the released sequential_forward
    o = implicit_llm.sequential_forward(model, ids)
    calls = rec.take()
    logits["sequential"] = o.logits.detach()
    starts = [i for i, (_, zn, _) in enumerate(calls) if zn.abs().max().item() == 0.0]  # z = 0 opens a token
    groups = [calls[i:j] for i, j in zip(starts, starts[1:] + [len(calls)])]
    assert len(groups) == SEQ_LEN
    meta["runs"]["sequential"] = {
        "implicit_metrics_mean_over_tokens": metrics(o.implicit_metrics), "f_calls_total": len(calls),
        "f_calls_per_token": [len(g) for g in groups],
        "rel_diff_at_stop_per_token": [eval_trace(g[:-1])[-1] for g in groups],
        "tol_margin": tol_margin([v for g in groups for v in eval_trace(g[:-1])], model.backbone.f_tol),
    }
    margins = {k: v["tol_margin"] for k, v in meta["runs"].items()}
    if min(margins.values()) < 5e-3:
        print(f"{arch}: a stopping decision lies within 0.5% of the tolerance ({margins}); try another --seed")
    if arch in ROPE_MODELS:
        meta["rope_float32_effect_on_eval_logits"] = rope_float32_effect(model, ids)

    from safetensors.torch import save_file

    save_file({"input_ids": ids.contiguous()}, str(folder / "inputs.safetensors"))
    save_file({k: v.contiguous() for k, v in logits.items()}, str(folder / "logits.safetensors"))
    save_file({k: v.contiguous() for k, v in grads.items()}, str(folder / "grads.safetensors"))
    meta["deq_params_implicit"] = cfg["deq_params"]
    meta["deq_params_4p1"] = cfg_4p1["deq_params"]
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests/fixtures/released"))
    parser.add_argument("--released", default=None, help="checkout of the released code (default: where "
                        "implicit_llm is imported from)")
    parser.add_argument("--stubs", default=None, help="folder with stand-in mamba_ssm / causal_conv1d packages")
    parser.add_argument("--commit", default=RELEASED_COMMIT, help="commit of the released code, for meta.json")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--seed", type=int, default=None, help=f"seed for both models (default: {SEEDS})")
    parser.add_argument("--arch", choices=(*TINY, "both"), default="both")
    args = parser.parse_args(argv)
    for extra in (args.stubs, args.released):
        if extra:
            sys.path.insert(0, str(Path(extra).resolve()))
    with contextlib.redirect_stdout(io.StringIO()):
        import implicit_llm
    import transformers

    released = Path(args.released).resolve() if args.released else Path(implicit_llm.__file__).resolve().parents[1]
    import mamba_ssm

    dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    for arch in (a for a in TINY if args.arch in (a, "both")):
        seed = SEEDS[arch] if args.seed is None else args.seed
        torch.manual_seed(seed)
        meta = run_arch(arch, released, out, dtype, seed)
        meta.update({
            "released_commit": args.commit, "dtype": args.dtype, "seed": seed,
            "batch": BATCH, "seq_len": SEQ_LEN, "torch": torch.__version__,
            "transformers": transformers.__version__, "torchdeq": version("torchdeq"),
            "mamba_ssm": getattr(mamba_ssm, "__version__", "?"),
            "loss": "mean cross entropy of ids[:, 1:] from logits[:, :-1] over all logit columns",
        })
        (out / arch / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{arch}: wrote {out / arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
