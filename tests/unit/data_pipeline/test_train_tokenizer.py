"""Trained tokenizers (byte-level BPE and sentencepiece) load, round-trip text and know their EOD."""

from __future__ import annotations

import pytest

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.tokenizer import load_tokenizer
from data_pipeline.train_tokenizer import iter_texts, train_sentencepiece

SAMPLE = "To be, or not to be: that is the question. Ünïcödé, 日本, and émojis 🎭 too."


@pytest.mark.processes
def test_byte_bpe_from_the_command_line(tmp_path, run_cli, write_jsonl, corpus):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d["text"]} for d in corpus[:80]] + [{"text": 7}])
    plain = tmp_path / "extra.txt"
    plain.write_text(corpus[80]["text"])
    output = tmp_path / "bpe" / "tokenizer.json"
    result = run_cli("data_pipeline.train_tokenizer", "--input", str(source), str(plain), "--model", "byte-bpe",
                     "--vocab-size", "800", "--output", str(output))
    assert result.returncode == 0, result.stderr
    tokenizer = load_tokenizer(output.parent)  # a folder holding tokenizer.json
    assert tokenizer.kind == "hf" and tokenizer.vocab_size == 800
    assert tokenizer.eod_id == tokenizer.token_id("<|endoftext|>") == 0
    assert tokenizer.decode(tokenizer.encode(SAMPLE)) == SAMPLE  # bytes: nothing is unknown
    assert "warning" not in result.stderr
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": "one short document"}])
    result = run_cli("data_pipeline.train_tokenizer", "--input", str(small), "--vocab-size", "2000", "--output",
                     str(tmp_path / "small.json"))
    assert result.returncode == 0, result.stderr
    got = load_tokenizer(tmp_path / "small.json").vocab_size
    assert got < 2000 and f"warning: {got} tokens, not the --vocab-size 2000 asked for" in result.stderr


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_trains_and_preprocesses(tmp_path, write_jsonl, corpus, read_split, model_type):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d["text"]} for d in corpus[:80]])
    path = train_sentencepiece(iter_texts([str(source)]), 600, str(tmp_path / "sp.model"), model_type)
    tokenizer = load_tokenizer(path)
    assert tokenizer.kind == "sentencepiece" and tokenizer.vocab_size == 600
    assert tokenizer.eod_id == tokenizer.token_id("<|endoftext|>") == 1
    assert tokenizer.decode(tokenizer.encode(SAMPLE)) == SAMPLE  # byte fallback

    prefix = tmp_path / "out" / "sp"
    stats = run_preprocess(PreprocessConfig(inputs=[str(source)], tokenizer=path, output_prefix=str(prefix),
                                            append_eod=True, test_fraction=0.0, workers=0, progress=False,
                                            limit_docs=5))
    assert stats["dtype"] == "uint16" and stats["eod_id"] == 1
    assert read_split(str(prefix), "train") == [tokenizer.encode(d["text"]) + [1] for d in corpus[:5]]


@pytest.mark.processes
@pytest.mark.parametrize("model", ["byte-bpe", "sp-unigram"])
def test_inputs_that_give_no_text_are_refused_naming_the_fields(model, tmp_path, run_cli, write_jsonl):
    """A corpus whose text is under another key, or an empty one: exit 2 naming --text-key and the
    fields the first record has, nothing written (byte-bpe wrote a 258-token tokenizer, sentencepiece
    ended in its own traceback)."""
    wrong_key = write_jsonl(tmp_path / "content.jsonl", [{"content": "some text", "id": i} for i in range(5)])
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    output = tmp_path / "out" / ("tokenizer.json" if model == "byte-bpe" else "tok.model")
    result = run_cli("data_pipeline.train_tokenizer", "--input", str(wrong_key), "--model", model, "--vocab-size",
                     "500", "--output", str(output))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"--text-key: no record has a 'text' field with text; the first record of {wrong_key} has 'content', " \
           "'id'" in result.stderr
    result = run_cli("data_pipeline.train_tokenizer", "--input", str(empty), "--model", model, "--vocab-size",
                     "500", "--output", str(output))
    assert result.returncode == 2 and "no document with text" in result.stderr, result.stderr[-2000:]
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.processes
@pytest.mark.parametrize(("model", "name"), [("byte-bpe", "tokenizer.json"), ("sp-unigram", "mine.model")])
def test_a_tokenizer_that_meets_a_file_size_limit_leaves_no_cut_file_and_says_so(model, name, tmp_path, write_jsonl,
                                                                                 corpus):
    """`ulimit -f` (or a full disk) while the tokenizer is written: one line naming the file and the
    cause, the file that was there before as it was, no temporary file left."""
    import os
    import resource
    import subprocess
    import sys

    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d["text"]} for d in corpus[:80]])
    output = tmp_path / "out" / name
    output.parent.mkdir()
    output.write_text("the tokenizer from before\n")

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024, 8 * 1024))  # below both (sentencepiece's: 12 KB)

    result = subprocess.run([sys.executable, "-m", "data_pipeline.train_tokenizer", "--input", str(source), "--model",
                             model, "--vocab-size", "800", "--output", str(output)], capture_output=True, text=True,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}, preexec_fn=limit_file_size,
                            timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.startswith(f"train_tokenizer: error: {output}: not written (") and \
        f"{output} left as it was" in result.stderr and result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert output.read_text() == "the tokenizer from before\n"
    assert sorted(p.name for p in output.parent.iterdir()) == [name]
