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
    tokenizer = train_sentencepiece(iter(texts), 320, str(out / "sp.model"), "unigram")
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", ["model.d_model=32", f"data.tokenizer={tokenizer}",
                      "model.vocab_size=320", "model.mamba2.headdim=8"], check_files=False)
    torch.manual_seed(0)
    return write_folder(out / "export", build_model(cfg).eval(), cfg, torch.float32, tokenizer=tokenizer)


@pytest.mark.parametrize("backend", ["implicit_megatron", "hf"])
def test_generation_and_scoring_tasks_run_in_both_backends(sp_export, backend):
    loaded = load_model(sp_export)
    assert loaded.tokenizer.kind == "sentencepiece" and loaded.tokenizer.decode([loaded.tokenizer.eod_id]) == ""
    options = LmEvalOptions(tasks=["tiny_gen", "tiny_lambada"], include_path=str(TASKS), backend=backend,
                            batch_size=2)
    tasks = run_lm_eval(loaded, options)["tasks"]
    assert set(tasks) == {"tiny_gen", "tiny_lambada"}
    assert 0 <= tasks["tiny_gen"]["exact_match"] <= 1 and tasks["tiny_lambada"]["perplexity"] > 1


def test_a_continuation_keeps_the_space_before_its_first_word(sp_export):
    """SentencePiece writes a word's leading space into its token and drops it at the start of a
    decode: the continuation is cut from the whole sequence's text, not decoded alone."""
    from implicit_megatron.evaluation.generation import continuation_text

    tok = load_model(sp_export).tokenizer
    prompt, whole = tok.encode("ROMEO: line"), tok.encode("ROMEO: line but soft")
    assert whole[:len(prompt)] == prompt
    new = whole[len(prompt):]
    assert tok.decode(new) == "but soft"  # what printing the new tokens alone gave
    assert continuation_text(tok, prompt, new) == " but soft"


def test_tools_generate_prints_each_prompt_as_the_tokenizer_decodes_the_whole_sequence(sp_export, tmp_path,
                                                                                      capsys):
    """tools/generate.py, run as a user runs it, against sentencepiece's own decode of the sequence.
    The model's (untied) head is set to choose the word boundary "\u2581" first: the decode of the new
    tokens alone drops it (what the tool printed before)."""
    import json

    import sentencepiece
    from support.tools import load_tool

    from implicit_megatron import build_model, load_config
    from implicit_megatron.hf.export import write_folder

    processor = sentencepiece.SentencePieceProcessor(model_file=str(sp_export / "tokenizer.model"))
    boundary = processor.piece_to_id("\u2581")
    prompt = "JULIET: O Romeo"
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [
        "model.d_model=32", f"data.tokenizer={sp_export.parent / 'sp.model'}", "model.vocab_size=320",
        "model.mamba2.headdim=8", "model.tie_embeddings=false"], check_files=False)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # the head reads out the last hidden state, then points the boundary's row at it
        head = model.lm_head.weight
        head.zero_()
        head[:32] = torch.eye(32)
        hidden = model(torch.tensor([processor.encode(prompt)]))[0, -1, :32]
        head.zero_()
        head[boundary] = 50 * hidden / hidden.norm()
    export = write_folder(tmp_path / "export", model, cfg, torch.float32, tokenizer=cfg.data.tokenizer)
    assert load_tool("generate").main([str(export), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "4",
                                       "--ignore-eod", "--jsonl"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["prompt"] == prompt and row["new_tokens"][0] == boundary
    assert row["prompt"] + row["text"] == processor.decode(processor.encode(prompt) + row["new_tokens"])
