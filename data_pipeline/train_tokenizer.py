"""Train a tokenizer on text or JSON-lines files.

    python -m data_pipeline.train_tokenizer --input 'corpus/*.jsonl.zst' --model byte-bpe \\
        --vocab-size 50277 --output data/tokenizers/mine.json
    python -m data_pipeline.train_tokenizer --input data/corpus/shakespeare.jsonl.zst \\
        --model sp-unigram --vocab-size 8000 --output data/tokenizers/shakespeare.model

- byte-bpe: byte-level BPE with HF `tokenizers` (the GPT-2/GPT-NeoX design: any text encodes
  without unknown tokens); written as tokenizer.json.
- sp-unigram / sp-bpe: sentencepiece with byte fallback; written as .model (+ .vocab). Text is kept
  as written: no normalization (sentencepiece's default NFKC folds characters and its default
  whitespace rule squeezes runs of spaces and drops newlines), spaces and indentation kept (runs of
  them may become pieces), a newline its own piece; every text decodes back to itself.

Special tokens: `<|endoftext|>` (id 0, the document separator that preprocessing appends, as in
GPT-NeoX) and `<|padding|>` for byte-bpe; sentencepiece gets `<unk>` = 0 and `<|endoftext|>`
as its end-of-sentence piece = 1.  Both outputs load with `data_pipeline.tokenizer.load_tokenizer`.
Inputs are read like preprocessing inputs (JSON lines, parquet, save_to_disk folders) plus plain
`.txt` files (one document per file); records that preprocessing would skip are skipped. Of a
DatasetDict, only the splits `--splits` names are read (train by default: a tokenizer that saw the
validation and test text would flatter them); the splits read and left out are said.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import sys
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path

from data_pipeline.encoder import decode_record
from data_pipeline.sources import (
    InputError,
    InputSpec,
    Unreadable,
    first_record_fields,
    read_batches,
    resolve_inputs,
)
from implicit_megatron.errors import first_line
from implicit_megatron.utils.safe_write import replaced_files

EOD = "<|endoftext|>"
PAD = "<|padding|>"
MODELS = ("byte-bpe", "sp-unigram", "sp-bpe")


def resolve_training_inputs(patterns: list[str]) -> tuple[list[str], list[InputSpec]]:
    """Plain-text files (one document each) and preprocessing inputs; InputError when one is unusable."""
    texts = [p for p in patterns if p.lower().endswith(".txt")]
    others = [p for p in patterns if not p.lower().endswith(".txt")]
    paths: list[str] = []
    for pattern in texts:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else \
            ([pattern] if os.path.isfile(pattern) else [])
        if not matches:
            raise InputError(f"--input: no input matches {pattern!r}")
        paths.extend(matches)
    return paths, resolve_inputs(others) if others else []


def iter_texts(patterns: list[str], text_key: str = "text", limit_docs: int | None = None,
               splits: tuple[str, ...] = ("train",)) -> Iterator[str]:
    """Documents of the inputs, in order; records that preprocessing would skip are skipped, and a
    DatasetDict's records of a split not in `splits` (ours: train, valid, test) too."""
    text_files, specs = resolve_training_inputs(patterns)
    documents = chain((Path(p).read_text(encoding="utf-8", errors="replace") for p in text_files),
                      (text for spec in specs for text in _records(spec, text_key, splits)))
    yield from islice(documents, limit_docs)


def _records(spec: InputSpec, text_key: str, splits: tuple[str, ...]) -> Iterator[str]:
    said: set[str] = set()
    for batch in read_batches(spec, text_key):
        if isinstance(batch, Unreadable):
            print(f"warning: skipping the rest of {batch.location}: {batch.message}", file=sys.stderr)
            continue
        if batch.split is not None and batch.source not in said:
            said.add(batch.source)
            taken = batch.split in splits
            print(f"{batch.source}: {'read' if taken else 'left out'} (split {batch.split}; --splits "
                  f"{','.join(splits)})", file=sys.stderr)
        if batch.split is not None and batch.split not in splits:
            continue
        for item in batch.records():
            text, _ = decode_record(item, batch.kind == "chunk", text_key)
            if text is not None:
                yield text


def no_text(patterns: list[str], text_key: str) -> str:
    """Why the inputs gave no document: no record has the text field (naming the fields the first
    record has, as preprocessing does), or they hold no record at all."""
    _, specs = resolve_training_inputs(patterns)
    for spec in specs:
        fields = first_record_fields(spec)
        if fields and text_key not in fields:
            return (f"--text-key: no record has a {text_key!r} field with text; the first record of {spec.location} "
                    f"has {', '.join(map(repr, fields))}: name the text field with --text-key")
    return f"--input: no document with text in {', '.join(patterns)} (empty?)"


def train_byte_bpe(texts: Iterator[str], vocab_size: int, output: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path = Path(os.path.join(output, "tokenizer.json") if os.path.isdir(output) else output)
    with published([path]) as (partial,):
        tokenizer.save(str(partial))
    return str(path)


def document_lines(text: str) -> Iterator[str]:
    """A document as sentencepiece's sentences (it caps their length): its lines, each with its newline."""
    lines = text.split("\n")
    yield from (line + "\n" for line in lines[:-1])
    if lines[-1]:
        yield lines[-1]


def train_sentencepiece(texts: Iterator[str], vocab_size: int, output: str, model_type: str) -> str:
    """sentencepiece trains on sentences: documents are fed line by line, newlines kept."""
    import sentencepiece as spm

    prefix = os.path.join(output, "tokenizer") if os.path.isdir(output) else output.removesuffix(".model")
    lines = (line for text in texts for line in document_lines(text))
    with published([Path(prefix + ".model"), Path(prefix + ".vocab")]) as (model, _), too_small(vocab_size):
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines, model_prefix=str(model.with_suffix("")), vocab_size=vocab_size,
            model_type=model_type, character_coverage=0.9995, byte_fallback=True, hard_vocab_limit=False,
            unk_id=0, eos_id=1, bos_id=-1, pad_id=-1, eos_piece=EOD,
            # the text as written: no NFKC, spaces and indentation kept, a newline one piece of its own
            normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
            user_defined_symbols=["\n"],
            input_sentence_size=5_000_000, shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1, minloglevel=2)
        try:  # sentencepiece says nothing when its write fails: a cut model is found by reading it back
            spm.SentencePieceProcessor(model_file=str(model))
        except (OSError, RuntimeError) as err:
            raise RuntimeError(f"the model written does not load, a full disk or a file-size limit? ({err})") from None
    return prefix + ".model"


class VocabularyTooSmall(ValueError):
    """--vocab-size below what sentencepiece needs for the training text's characters."""


@contextlib.contextmanager
def too_small(vocab_size: int):
    """sentencepiece's refusal of a vocabulary smaller than its byte pieces, special pieces and every
    character of the text, as one line naming --vocab-size and the size it needs."""
    try:
        yield
    except RuntimeError as err:
        needed = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", str(err))
        if needed is None:
            raise
        raise VocabularyTooSmall(f"--vocab-size {vocab_size}: sentencepiece needs at least {needed[1]} for this text "
                                 "(256 byte pieces, the special pieces and each character it holds); nothing was "
                                 "written") from None


class NotWritten(RuntimeError):
    """The tokenizer could not be written whole; the message names the file, the cause and what is left."""


@contextlib.contextmanager
def published(paths: list[Path]):
    """safe_write.replaced_files, its failure one NotWritten naming the file, the cause and what is left:
    a full disk or a file-size limit leaves no cut tokenizer under the name (nor a model without its
    vocabulary), and a file that was there before stays as it was."""
    try:
        with replaced_files(paths) as partials:
            yield partials
    except VocabularyTooSmall:  # the settings', not the write's: said as they are
        raise
    except Exception as err:  # noqa: BLE001 - the writers' errors (Rust, C++) share no type; each is named here
        kept = [str(p) for p in paths if p.exists()]
        raise NotWritten(f"{paths[0]}: not written ({first_line(err)}); " + (
            f"{', '.join(kept)} left as it was" if kept else "nothing was written under its name")) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_pipeline.train_tokenizer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, metavar="PATH_OR_GLOB")
    parser.add_argument("--text-key", default="text")
    parser.add_argument("--model", choices=MODELS, default="byte-bpe")
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--output", required=True, help="tokenizer.json (byte-bpe) or NAME.model (sp-*)")
    parser.add_argument("--limit-docs", type=int, default=None)
    parser.add_argument("--splits", default="train", metavar="S1,S2",
                        help="the splits of a DatasetDict to read (train, valid, test; default train)")
    args = parser.parse_args(argv)
    splits = tuple(name.strip() for name in args.splits.split(",") if name.strip())
    unknown = [name for name in splits if name not in ("train", "valid", "test")]
    if unknown or not splits:
        print(f"train_tokenizer: error: --splits: {', '.join(unknown) or 'none given'}; the splits are train, valid "
              "and test", file=sys.stderr)
        return 2
    if args.vocab_size < 300:
        print("train_tokenizer: error: --vocab-size must be at least 300 (256 bytes + merges)", file=sys.stderr)
        return 2
    try:
        resolve_training_inputs(args.input)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    except (InputError, OSError) as err:
        print(f"train_tokenizer: error: {err}", file=sys.stderr)
        return 2
    texts = iter_texts(args.input, args.text_key, args.limit_docs, splits)
    first = next(texts, None)
    if first is None:  # a tokenizer trained on nothing would be bytes alone, or sentencepiece's traceback
        print(f"train_tokenizer: error: {no_text(args.input, args.text_key)}; nothing was written", file=sys.stderr)
        return 2
    texts = chain([first], texts)
    try:
        if args.model == "byte-bpe":
            path = train_byte_bpe(texts, args.vocab_size, args.output)
        else:
            path = train_sentencepiece(texts, args.vocab_size, args.output, args.model.removeprefix("sp-"))
    except NotWritten as err:
        print(f"train_tokenizer: error: {err}", file=sys.stderr)
        return 1
    except VocabularyTooSmall as err:
        print(f"train_tokenizer: error: {err}", file=sys.stderr)
        return 2
    from data_pipeline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(path)
    print(f"{path}: {tokenizer.vocab_size} tokens, end of text = id {tokenizer.eod_id}")
    if tokenizer.vocab_size < args.vocab_size:
        print(f"train_tokenizer: warning: {tokenizer.vocab_size} tokens, not the --vocab-size {args.vocab_size} asked "
              "for: the training text has no more merges that occur twice or more (give it more text, or ask for "
              f"fewer tokens); set model.vocab_size to at least {tokenizer.vocab_size}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
