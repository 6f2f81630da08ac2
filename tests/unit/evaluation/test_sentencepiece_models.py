"""A model trained with a SentencePiece tokenizer (docs/data.md's `--model sp-unigram` route) is
evaluated end to end: lm-eval's generation and scoring tasks in both backends of tools/evaluate.py.
Its end token decodes to "" (a control piece), which must stop generation by id, not become an
empty stop string; the hf backend reads the export's own tokenizer as transformers loads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from implicit_megatron.evaluation.lm_eval_options import LmEvalOptions
from implicit_megatron.evaluation.lm_eval_run import run_lm_eval
from implicit_megatron.evaluation.loading import load_model

pytestmark = pytest.mark.processes  # every test here starts a process

ROOT = Path(__file__).resolve().parents[3]
TASKS = Path(__file__).parent / "fixtures" / "lm_eval"


@pytest.fixture(scope="module")
def sp_export(tmp_path_factory) -> Path:
    from data_pipeline.train_tokenizer import train_sentencepiece
    from implicit_megatron import build_model, load_config
    from implicit_megatron.hf.export import write_folder

    out = tmp_path_factory.mktemp("sp-model")
    texts = [f"ROMEO: line {i}, but soft what light through yonder window breaks. JULIET: O Romeo" for i in range(300)]
    tokenizer = train_sentencepiece(iter(texts), 300, str(out / "sp.model"), "unigram")
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", ["model.d_model=32", f"data.tokenizer={tokenizer}",
                      "model.vocab_size=300", "model.mamba2.headdim=8"], check_files=False)
    torch.manual_seed(0)
    return write_folder(out / "export", build_model(cfg).eval(), cfg, torch.float32)


@pytest.mark.parametrize("backend", ["implicit_megatron", "hf"])
def test_generation_and_scoring_tasks_run_in_both_backends(sp_export, backend):
    loaded = load_model(sp_export)
    assert loaded.tokenizer.kind == "sentencepiece" and loaded.tokenizer.decode([loaded.tokenizer.eod_id]) == ""
    options = LmEvalOptions(tasks=["tiny_gen", "tiny_lambada"], include_path=str(TASKS), backend=backend,
                            batch_size=2)
    tasks = run_lm_eval(loaded, options)["tasks"]
    assert set(tasks) == {"tiny_gen", "tiny_lambada"}
    assert 0 <= tasks["tiny_gen"]["exact_match"] <= 1 and tasks["tiny_lambada"]["perplexity"] > 1
