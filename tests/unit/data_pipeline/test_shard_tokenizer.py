"""Shards are compared with a tokenizer by what the tokenizer does (its identity, recorded in
`{prefix}_stats.json`), not by its file's bytes or a path relative to where the shards were built:
the export's decompressed, re-serialized `tokenizer.json` is the tokenizer the run's shards were
built with, from any working directory. Another tokenizer is refused naming both files."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest
from support.processes import ROOT

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.shard_tokenizer import other_tokenizer
from data_pipeline.tokenizer import load_tokenizer

BPE = ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz"
BPE_RELATIVE = "data/tokenizers/shakespeare-bpe-1000.json.xz"  # as the tiny configs name it


def build_shards(folder: Path, tokenizer: str, write_jsonl) -> str:
    """Shards of a few documents at folder/out/bpe, the tokenizer named as given (relative to the cwd)."""
    source = write_jsonl(folder / "docs.jsonl", [{"text": f"to be or not to be, {i}"} for i in range(20)])
    prefix = str(folder / "out" / "bpe")
    run_preprocess(PreprocessConfig(inputs=[str(source)], tokenizer=tokenizer, output_prefix=prefix, workers=0,
                                    valid_fraction=0.0, test_fraction=0.0, progress=False))
    return prefix


def exported_copy(tokenizer: Path, folder: Path) -> Path:
    """The tokenizer as an export writes it (hf/export.write_tokenizer): decompressed, re-serialized."""
    folder.mkdir(parents=True)
    load_tokenizer(tokenizer).backend.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_the_exported_tokenizer_is_the_shards_one_from_another_working_directory(tmp_path, monkeypatch,
                                                                                write_jsonl):
    """The finding: shards built from `data/tokenizers/...json.xz` (relative), compared from another
    working directory with the export's tokenizer.json (other bytes): the same tokenizer."""
    build = tmp_path / "checkout"
    (build / "data/tokenizers").mkdir(parents=True)
    shutil.copy(BPE, build / BPE_RELATIVE)
    monkeypatch.chdir(build)
    prefix = build_shards(build, BPE_RELATIVE, write_jsonl)
    elsewhere = tmp_path / "elsewhere"
    export = exported_copy(build / BPE_RELATIVE, elsewhere / "export")
    monkeypatch.chdir(elsewhere)
    assert other_tokenizer(prefix, str(export)) is None
    assert other_tokenizer(prefix, "export/tokenizer.json") is None  # named relative to here


def test_shards_recorded_before_the_identity_find_their_relative_tokenizer_in_the_repository(tmp_path, monkeypatch,
                                                                                          write_jsonl):
    """Stats written before the identity name the tokenizer as preprocessing was given it (relative
    to the repository root, where it ran): found there from any working directory, then compared
    by vocabulary; one beside the stats file is found too."""
    prefix = build_shards(tmp_path, str(BPE), write_jsonl)
    stats_path = Path(f"{prefix}_stats.json")
    stats = json.loads(stats_path.read_text())
    del stats["tokenizer_identity"]
    stats["tokenizer"] = BPE_RELATIVE
    stats_path.write_text(json.dumps(stats))
    monkeypatch.chdir(tmp_path)
    export = exported_copy(BPE, tmp_path / "export")
    assert other_tokenizer(prefix, str(export)) is None
    (tmp_path / "out/tok").mkdir()
    shutil.copy(BPE, tmp_path / "out/tok/bpe.json.xz")
    stats["tokenizer"] = "tok/bpe.json.xz"  # beside the stats file
    stats_path.write_text(json.dumps(stats))
    assert other_tokenizer(prefix, str(export)) is None
    stats["tokenizer"] = "nowhere/bpe.json.xz"
    stats_path.write_text(json.dumps(stats))
    said = other_tokenizer(prefix, str(export))
    assert said is not None and f"{stats_path} names nowhere/bpe.json.xz (sha256 " in said


def bpe_json() -> dict:
    return json.loads(lzma.decompress(BPE.read_bytes()))


def identity_of(raw: dict, path: Path, **dumps) -> str:
    path.write_text(json.dumps(raw, **dumps))
    return load_tokenizer(path).identity()


def test_the_identity_is_what_the_tokenizer_does_not_its_file(tmp_path):
    """The same tokenizer as .json.xz, as .json or re-serialized (whitespace, key order, a default left
    out): one identity. Anything that changes ids or text, for this project's encodes or a client's
    (the post-processor adds special tokens where a client asks for them), is another."""
    same = load_tokenizer(BPE).identity()
    raw = bpe_json()
    assert identity_of(raw, tmp_path / "plain.json") == same
    reordered = {key: raw[key] for key in reversed(raw)}
    assert identity_of(reordered, tmp_path / "spaced.json", indent=7, ensure_ascii=True) == same
    with_defaults_left_out = {**raw, "model": {k: v for k, v in raw["model"].items() if k != "ignore_merges"}}
    assert identity_of(with_defaults_left_out, tmp_path / "short.json") == same
    merges = [*raw["model"]["merges"]]
    merges[5], merges[6] = merges[6], merges[5]
    vocab = {**raw["model"]["vocab"]}
    vocab["the"], vocab["The"] = vocab["The"], vocab["the"]
    added = {"id": 1000, "content": "<|new|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
    others = {"merge": {**raw, "model": {**raw["model"], "merges": merges}},
              "vocab": {**raw, "model": {**raw["model"], "vocab": vocab}},
              "normalizer": {**raw, "normalizer": {"type": "NFKC"}},
              "pre_tokenizer": {**raw, "pre_tokenizer": {**raw["pre_tokenizer"], "add_prefix_space": True}},
              "added_token": {**raw, "added_tokens": [*raw["added_tokens"], added]},
              "decoder": {**raw, "decoder": None},
              "post_processor": {**raw, "post_processor": {"type": "TemplateProcessing", "single": [
                  {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                  "pair": [{"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<|endoftext|>": {
                      "id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}}}
    identities = {name: identity_of(changed, tmp_path / f"{name}.json") for name, changed in others.items()}
    assert same not in identities.values() and len(set(identities.values())) == len(others), identities


@pytest.mark.parametrize("section, setting, said", [
    ("truncation", {"max_length": 64, "strategy": "LongestFirst", "stride": 0, "direction": "Right"},
     "its 'truncation' section (max_length 64, strategy longest_first) would cut every text it encodes"),
    ("padding", {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                 "pad_type_id": 0, "pad_token": "<|endoftext|>"},
     "its 'padding' section (length 16, pad_token <|endoftext|>) would pad every text it encodes")])
def test_a_tokenizer_that_cuts_or_pads_every_text_is_refused_naming_the_section(section, setting, said, tmp_path):
    """Shards built with it held every document cut to 64 tokens, and an export's prompts were cut or
    padded in evaluation and generation, with no word."""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({**bpe_json(), section: setting}))
    with pytest.raises(ValueError) as refused:
        load_tokenizer(path)
    assert str(refused.value) == (f"{path}: {said} (shards, evaluation and generation need texts whole and "
                                  f"unpadded): set it to null in the file, or save the tokenizer again after "
                                  f"tokenizer.no_{section}()")


def test_another_tokenizer_is_refused_naming_both_files(tmp_path, write_jsonl):
    prefix = build_shards(tmp_path, str(BPE), write_jsonl)
    raw = bpe_json()
    vocab = raw["model"]["vocab"]
    vocab["the"], vocab["The"] = vocab["The"], vocab["the"]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    said = other_tokenizer(prefix, str(other))
    ours, theirs = load_tokenizer(other).identity()[:12], load_tokenizer(BPE).identity()[:12]
    assert said == (f"{other} (identity {ours}) is not the tokenizer the shards {prefix}_* were built with: "
                    f"{prefix}_stats.json names {BPE} (identity {theirs}), whose token ids mean other tokens")


def test_a_copy_of_the_tokenizer_reuses_the_finished_build_and_serves_its_shards(tmp_path, write_jsonl, capsys):
    """Preprocessing keys a run by the tokenizer's identity: rerun with the uncompressed copy, the
    finished build is the same run (nothing to do), and the quickstart's check takes the copy."""
    from data_pipeline.build import ensure_shards

    prefix = build_shards(tmp_path, str(BPE), write_jsonl)
    copy = exported_copy(BPE, tmp_path / "copy")
    again = run_preprocess(PreprocessConfig(inputs=[str(tmp_path / "docs.jsonl")], tokenizer=str(copy),
                                            output_prefix=prefix, workers=0, valid_fraction=0.0, test_fraction=0.0,
                                            progress=False))
    assert "is already complete; nothing to do" in capsys.readouterr().err
    assert again["tokenizer"] == str(BPE)  # the build's record, as it was
    ensure_shards(str(tmp_path / "docs.jsonl"), prefix, str(copy), 0.0, 0.0, workers=0, progress=False)


def sentencepiece_model(path: Path, model_type: str = "unigram") -> Path:
    from data_pipeline.train_tokenizer import train_sentencepiece

    texts = [f"ROMEO: line {i}, but soft what light through yonder window breaks. JULIET: O Romeo" for i in range(300)]
    return Path(train_sentencepiece(iter(texts), 320, str(path), model_type))


def edited(model: Path, path: Path, edit) -> Path:
    """A copy of a sentencepiece model with its proto edited."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    edit(proto)
    path.write_bytes(proto.SerializeToString())
    return path


def test_a_sentencepiece_identity_is_its_pieces_and_rules(tmp_path):
    """A copy, or the model as trained from other files by another machine (its trainer spec names
    them): one identity. Another model type, a piece's score, a normalizer rule: another."""
    model = sentencepiece_model(tmp_path / "sp.model")
    same = load_tokenizer(model).identity()
    shutil.copy(model, tmp_path / "copy.model")
    assert load_tokenizer(tmp_path / "copy.model").identity() == same

    def elsewhere(proto) -> None:
        proto.trainer_spec.input.append("/elsewhere/corpus.txt")
        proto.trainer_spec.model_prefix, proto.trainer_spec.num_threads = "/elsewhere/sp", 64

    assert load_tokenizer(edited(model, tmp_path / "elsewhere.model", elsewhere)).identity() == same
    assert load_tokenizer(sentencepiece_model(tmp_path / "bpe.model", "bpe")).identity() != same

    def score(proto) -> None:
        proto.pieces[10].score -= 1.0

    def prefix(proto) -> None:
        proto.normalizer_spec.add_dummy_prefix = not proto.normalizer_spec.add_dummy_prefix

    for edit in (score, prefix):
        assert load_tokenizer(edited(model, tmp_path / f"{edit.__name__}.model", edit)).identity() != same


def test_a_build_finished_before_the_identity_was_recorded_is_still_finished(tmp_path, write_jsonl, capsys):
    """Stats of the earlier format (fingerprint keyed by the tokenizer file's sha256, no identity, no
    file digests): the same command finds the build complete instead of refusing it as another."""
    from data_pipeline.plan import plan_run

    prefix = build_shards(tmp_path, str(BPE), write_jsonl)
    config = PreprocessConfig(inputs=[str(tmp_path / "docs.jsonl")], tokenizer=str(BPE), output_prefix=prefix,
                              workers=0, valid_fraction=0.0, test_fraction=0.0, progress=False)
    stats_path = Path(prefix + "_stats.json")
    stats = json.loads(stats_path.read_text())
    for key in ("tokenizer_identity", "files"):
        del stats[key]
    stats["fingerprint"] = plan_run(config).earlier_fingerprint
    stats_path.write_text(json.dumps(stats))
    capsys.readouterr()
    run_preprocess(config)
    assert "is already complete; nothing to do" in capsys.readouterr().err
    assert other_tokenizer(prefix, str(BPE)) is None


def test_an_export_records_the_identity_of_its_tokenizer(exports):
    """config.json says what the tokenizer does, as the shards' stats do: the two can be compared
    without the files they came from."""
    folder = exports["mamba2-explicit"]
    recorded = json.loads((folder / "config.json").read_text())["tokenizer_identity"]
    assert recorded == load_tokenizer(BPE).identity() == load_tokenizer(folder / "tokenizer.json").identity()
