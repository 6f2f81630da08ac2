"""A received tokenizer file is read within a limit: a small `.xz` that unpacks to gigabytes is
refused by name at the limit, not read into memory whole; a cut `.xz` is named as such."""

from __future__ import annotations

import lzma

import pytest
from support.processes import ROOT

from data_pipeline import tokenizer as tokenizers
from data_pipeline.tokenizer import load_tokenizer

BUNDLED = ROOT / "data/tokenizers/gpt-neox-20b.json.xz"


def test_a_tokenizer_that_unpacks_past_the_limit_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizers, "MAX_TOKENIZER_BYTES", 2**20)
    bomb = tmp_path / "tokenizer.json.xz"
    bomb.write_bytes(lzma.compress(b" " * (8 * 2**20)))  # 8 MiB of spaces in about a kilobyte
    assert bomb.stat().st_size < 4096
    with pytest.raises(ValueError, match=rf"^{bomb}: unpacks to over 1 MiB, more than any tokenizer holds; refused$"):
        load_tokenizer(bomb)
    plain = tmp_path / "tokenizer.json"
    plain.write_bytes(b" " * (2 * 2**20))
    with pytest.raises(ValueError, match=rf"^{plain}: 2,097,152 bytes, over 1 MiB"):
        load_tokenizer(plain)


def test_a_cut_xz_tokenizer_is_named(tmp_path):
    cut = tmp_path / "tokenizer.json.xz"
    cut.write_bytes(BUNDLED.read_bytes()[:100_000])
    with pytest.raises(ValueError, match=rf"^{cut}: not a whole .xz file"):
        load_tokenizer(cut)
    assert load_tokenizer(BUNDLED).vocab_size == 50277  # the bundled one, whole, within the limit


def backtracking_tokenizer(path):
    """A tokenizer.json whose pre-tokenizer regex backtracks on any long word."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1, "<|endoftext|>": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"(\w|\w)*\d"), behavior="isolated")
    tok.save(str(path))
    return path


def test_a_tokenizer_whose_regex_backtracks_is_refused_by_name(tmp_path):
    slow = backtracking_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match=rf"^{slow}: encoding a \d+-character sample failed .*backtracks; refused"):
        load_tokenizer(slow)


def test_a_tokenizer_slower_than_the_limit_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(tokenizers, "SPEED_LIMIT_S", 0.0)  # any encode takes longer than nothing
    with pytest.raises(ValueError, match=rf"^{BUNDLED}: encoding a \d+-character sample took [\d.]+ s"):
        load_tokenizer(BUNDLED)


def test_a_regex_that_gives_up_only_on_some_text_is_one_named_error_at_encode(tmp_path):
    """A pre-tokenizer regex that backtracks only on long runs of `=` passes the load's speed probe;
    the regex engine's panic (a BaseException from the Rust library) becomes one error naming the file."""
    import json

    raw = json.loads(lzma.decompress((ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz").read_bytes()))
    split = {"type": "Split", "pattern": {"Regex": "(=+)+x"}, "behavior": "Isolated", "invert": False}
    raw["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, raw["pre_tokenizer"]]}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(raw))
    tok = load_tokenizer(path)
    assert tok.decode(tok.encode("ROMEO: a=b")) == "ROMEO: a=b"
    said = rf"^{path}: the tokenizer failed on this text \(PanicException: Onig"
    with pytest.raises(tokenizers.TokenizerFailed, match=said):
        tok.encode("a" + "=" * 40 + "b")


def test_a_vocabulary_giving_one_id_to_two_tokens_is_refused_by_name(tmp_path):
    """Found by tools/dev/fuzz_received.py (a repeated part of the file): such a tokenizer decodes
    and describes itself in the order of the library's hash map, so each load was another one."""
    import json

    raw = json.loads(lzma.decompress((ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz").read_bytes()))
    vocab = raw["model"]["vocab"]
    first, second = list(vocab)[200:202]
    vocab[second] = vocab[first]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=f"^{path}: 1 id\\(s\\) of its vocabulary are given to two tokens"):
        load_tokenizer(path)
    assert load_tokenizer(ROOT / "data/tokenizers/gpt-neox-20b.json.xz").vocab_size == 50277


def test_an_encode_over_its_time_bound_is_one_named_error(monkeypatch):
    """A text on which a regex backtracks takes minutes, not a traceback or a stalled rank: past the
    bound (60 s and 60 s per million characters; here none) the encode ends in one error naming the file."""
    tokenizer = load_tokenizer(ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz")
    assert tokenizer.encode("to be or not to be")
    monkeypatch.setattr(tokenizers, "ENCODE_SECONDS", 0.0)
    monkeypatch.setattr(tokenizers, "ENCODE_SECONDS_PER_MB", 0.0)
    with pytest.raises(tokenizers.TokenizerFailed, match=f"^{tokenizer.path}: encoding 2,000,000 characters took over"):
        tokenizer.encode_batch(["to be or not to be " * 50_000, "x" * 1_050_000])
