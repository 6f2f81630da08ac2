"""A tiny implicit Mamba2 trained in-process for the evaluation tests, exported as a model folder.

Trained for a few dozen AdamW steps on the bundled corpus in its (4+1) phase, from weights made
contractive (small weights reading z, a large injection), so that the solver converges well and
both modes agree. Written twice: as an export (model.safetensors + config.json + tokenizer) and
as a run's checkpoints/ folder in the layout DeepSpeed writes under ZeRO-0 in fp32 (what the
tiny configs train with). Built once per test run (the `tiny_run` fixture of tests/conftest.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from support.processes import ROOT

STEPS, BATCH, SEQ_LEN = 30, 4, 64
TAG = f"free-step{STEPS}"


@dataclass
class TinyRun:
    export: Path  # an exported folder
    run_dir: Path  # a run folder holding checkpoints/ (latest -> TAG)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


def tiny_config(shards: str):
    from implicit_megatron import load_config

    return load_config(ROOT / "configs/tiny/mamba2-implicit.yaml",
                       ["name=tiny-eval", "model.d_model=32", "model.mamba2.headdim=8", f"data.prefixes=[{shards}]",
                        "data.source=null", f"data.seq_len={SEQ_LEN}",
                        f"data.tokenizer={ROOT / 'data/tokenizers/shakespeare-bpe-1000.json.xz'}"])


def train_tiny(out: Path, shards: str) -> TinyRun:
    """Train, then write the export and the checkpoint under `out`."""
    run = TinyRun(out / "export", out / "run")
    from data_pipeline.packed import build_packed_dataset
    from implicit_megatron import build_model
    from implicit_megatron.hf.export import write_folder

    cfg = tiny_config(shards)
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():  # a contraction in z: the fixed point exists and iteration finds it
        for name, p in model.core.backbone.named_parameters():
            if name.endswith("in_proj.weight"):
                p.mul_(0.1)
        model.core.injection.proj.weight.mul_(10.0)
    data = build_packed_dataset([shards], None, "train", SEQ_LEN, seed=1234, num_samples=STEPS * BATCH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # at 3e-3 the 1000-token model leaves contraction
    model.train()
    for step in range(STEPS):
        batch = torch.stack([torch.from_numpy(data[step * BATCH + i]) for i in range(BATCH)])
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    write_folder(run.export, model.eval(), cfg, torch.float32)
    write_checkpoint(run.checkpoints, model, cfg)
    return run


def write_checkpoint(folder: Path, model, cfg) -> None:
    """checkpoints/TAG/mp_rank_00_model_states.pt with the module and our client state, and `latest`."""
    from implicit_megatron.checkpoints.layout import LATEST, MODEL_STATES

    (folder / TAG).mkdir(parents=True, exist_ok=True)
    torch.save({"module": model.state_dict(), "config": cfg.to_dict(), "dp_world_size": 1, "step": STEPS,
                "phase": "free"}, folder / TAG / MODEL_STATES)
    torch.save({"torch": torch.get_rng_state()}, folder / TAG / "rng_rank0.pt")  # as training writes it
    (folder / LATEST).write_text(TAG)
