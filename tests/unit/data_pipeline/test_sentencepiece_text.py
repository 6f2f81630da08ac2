"""A sentencepiece tokenizer trained by the project keeps a text as written (newlines, indentation,
tabs), through sentencepiece itself, the project's loader and transformers' reading of the export;
of a DatasetDict it reads the splits it is told, train by default, and says which."""

from __future__ import annotations

import json

import pytest
import sentencepiece as spm

from data_pipeline.tokenizer import load_tokenizer
from data_pipeline.train_tokenizer import main


def function(i: int) -> str:
    return (f"def step_{i}(state, x):\n    \"\"\"Advance the state by one token.\"\"\"\n    for k in range({i}):\n"
            f"        state = state * 0.{i} + x\n\n\treturn state  # tab-indented\n")


# a generated text the corpus does not hold: blank lines, deeper indentation, trailing spaces, CRLF
GENERATED = "class Queue:\n\n    def put(self, item):  \n            self.items.append(item)\r\n\t\tpass\n"


@pytest.mark.parametrize("model", ["sp-bpe", "sp-unigram"])
def test_newlines_and_indentation_survive_every_reader(model, tmp_path, capsys):
    corpus = tmp_path / "code.jsonl"
    corpus.write_text("".join(json.dumps({"text": function(i)}) + "\n" for i in range(120)))
    output = tmp_path / "code.model"
    assert main(["--input", str(corpus), "--model", model, "--vocab-size", "400", "--output", str(output)]) == 0
    ours = load_tokenizer(output)
    ids = ours.encode(GENERATED)
    assert ours.decode(ids) == GENERATED
    processor = spm.SentencePieceProcessor(model_file=str(output))
    assert processor.decode(processor.encode(GENERATED)) == GENERATED
    assert processor.encode("a\nb").count(processor.piece_to_id("\n")) == 1  # a newline is one piece of its own
    assert processor.decode(processor.encode(function(7))) == function(7)

    from transformers import AutoTokenizer

    from implicit_megatron.hf.export import write_tokenizer

    export = tmp_path / "export"
    export.mkdir()
    write_tokenizer(output, export)
    theirs = AutoTokenizer.from_pretrained(str(export))
    assert theirs(GENERATED)["input_ids"] == ids
    assert theirs.decode(ids) == GENERATED


def test_a_datasetdict_gives_its_train_split_unless_told_otherwise(tmp_path, capsys):
    import datasets

    folder = tmp_path / "dict"
    rows = {"train": ["plain words of the training split, said again and again"] * 60,
            "validation": ["quixotically quixotically quixotically"] * 200, "test": ["zephyrs zephyrs"] * 200}
    datasets.DatasetDict({name: datasets.Dataset.from_dict({"text": texts}) for name, texts in rows.items()}) \
        .save_to_disk(str(folder))

    def pieces(*extra: str) -> tuple[set[str], str]:
        output = tmp_path / f"sp{len(extra)}.model"
        assert main(["--input", str(folder), "--model", "sp-bpe", "--vocab-size", "300", "--output", str(output),
                     *extra]) == 0
        processor = spm.SentencePieceProcessor(model_file=str(output))
        return {processor.id_to_piece(i) for i in range(processor.get_piece_size())}, capsys.readouterr().err

    learned, said = pieces()
    assert f"{folder}[train]: read (split train; --splits train)" in said
    assert f"{folder}[validation]: left out (split valid; --splits train)" in said
    assert f"{folder}[test]: left out (split test; --splits train)" in said
    assert not any("quixot" in piece or "zephyr" in piece for piece in learned)
    learned, said = pieces("--splits", "train,valid")
    assert f"{folder}[validation]: read (split valid; --splits train,valid)" in said
    assert any("quixot" in piece for piece in learned) and not any("zephyr" in piece for piece in learned)
    assert main(["--input", str(folder), "--model", "sp-bpe", "--vocab-size", "300", "--output",
                 str(tmp_path / "x.model"), "--splits", "training"]) == 2
    assert "--splits: training; the splits are train, valid and test" in capsys.readouterr().err


def test_a_vocabulary_too_small_for_the_characters_is_one_line_naming_the_size_needed(tmp_path, capsys):
    corpus = tmp_path / "play.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"ROMEO: line {i}, but soft what light through yonder window "
                                                   "breaks.\nJULIET: O Romeo"}) + "\n" for i in range(300)))
    output = tmp_path / "small.model"
    assert main(["--input", str(corpus), "--model", "sp-unigram", "--vocab-size", "300", "--output", str(output)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("train_tokenizer: error: --vocab-size 300: sentencepiece needs at least 30") and \
        said.endswith("nothing was written\n") and said.count("\n") == 1, said
    assert not list(tmp_path.glob("small.*"))
