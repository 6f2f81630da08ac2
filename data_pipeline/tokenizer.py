"""One interface over the tokenizers the pipeline accepts.

- a HF `tokenizer.json` (optionally `.xz`-compressed, as the bundled GPT-NeoX-20B file),
- a sentencepiece `.model`,
- a local HF tokenizer folder (containing `tokenizer.json` or `tokenizer.model`).

`Tokenizer.identity()` names a tokenizer by what it does, not by its file: shards and exports
record it, and a decompressed or re-serialized copy is the same tokenizer (data_pipeline.shard_tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from implicit_megatron.errors import first_line

EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")


class UnknownTokenError(ValueError):
    """A token asked for by its text is not in the vocabulary."""


class TokenizerFailed(ValueError):
    """The tokenizer's own code failed on a text (its regex engine's panic), named with its file."""


@dataclass
class Tokenizer:
    """Batch encode/decode with a known vocabulary size and end-of-document id."""

    backend: Any  # a tokenizers.Tokenizer (kind "hf") or a sentencepiece.SentencePieceProcessor
    kind: str  # "hf" or "sentencepiece"
    vocab_size: int
    eod_id: int
    path: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.kind != "hf":
            return self.backend.encode(texts, out_type=int)
        # encode_batch_fast skips character offsets, which nothing here uses (about 15 % faster)
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        characters = sum(len(text) for text in texts)
        try:
            return within(ENCODE_SECONDS + ENCODE_SECONDS_PER_MB * characters / 1e6,
                          lambda: [enc.ids for enc in encode(texts, add_special_tokens=False)])
        except TimeoutError as err:
            raise TokenizerFailed(f"{self.path}: encoding {characters:,} characters took over {err} s: a regex of "
                                  "its normalizer or pre-tokenizer backtracks on this text; not a usable tokenizer"
                                  ) from None
        except BaseException as err:  # the Rust library's panic (a regex's retry limit) is no Exception
            if type(err).__name__ != "PanicException":
                raise
            raise TokenizerFailed(f"{self.path}: the tokenizer failed on this text ({first_line(err)}): a "
                                  "regex of its normalizer or pre-tokenizer gives up on it; not a usable "
                                  "tokenizer") from None

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: list[int]) -> str:
        if self.kind == "hf":
            return self.backend.decode(list(ids), skip_special_tokens=False)
        return self.backend.decode(list(ids))

    def vocabulary(self) -> dict[str, int]:
        """Every token's text and id (added and special tokens included)."""
        if self.kind == "hf":
            return self.backend.get_vocab(with_added_tokens=True)
        return {self.backend.id_to_piece(i): i for i in range(self.vocab_size)}

    def token_id(self, token: str) -> int:
        """Id of a token given by its text; UnknownTokenError (a ValueError) when the vocabulary lacks it."""
        tid = self.backend.token_to_id(token) if self.kind == "hf" else self.backend.piece_to_id(token)
        if tid is None or (self.kind == "sentencepiece" and tid == self.backend.unk_id() and token != "<unk>"):
            raise UnknownTokenError(f"token {token!r} is not in the vocabulary of {self.path}")
        return tid

    def identity(self) -> str:
        """sha256 of a canonical description of what the tokenizer does (which ids a text gets, which
        text ids decode to): the same for a `.json`, its `.json.xz` and any re-serialization of it
        (whitespace, key order), another for a changed merge, id, added token, normalizer or
        pre-tokenizer. The description is read through the installed library, as it encodes (a
        release that writes a new model option describes every tokenizer anew: then the recorded
        file's sha256 still says the same file, shard_tokenizer.matches_record)."""
        described = _hf_description(self.backend) if self.kind == "hf" else _sentencepiece_description(self.backend)
        text = json.dumps({"kind": self.kind, **described}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# tokenizer.json's parts that decide ids and text, for this project's encodes and for a client's
# (transformers adds special tokens through the post-processor unless told not to); every part but
# "version". A file with truncation or padding set is refused at load (ENCODE_SETTINGS): were one
# accepted, its identity would still differ from the same file without them.
HF_IDENTITY_PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder",
                     "truncation", "padding")
# what a tokenizer.json may set that cuts or pads every text it encodes: shards would hold documents
# cut short, evaluation and generation prompts cut or padded, with no word
ENCODE_SETTINGS = ("truncation", "padding")


def _hf_description(backend) -> dict:
    """The parts of the library's own serialization (`to_str`), so what a file leaves to defaults and
    what it spells out are described alike; added tokens by id."""
    data = json.loads(backend.to_str())
    described = {part: data.get(part) for part in HF_IDENTITY_PARTS}
    described["added_tokens"] = sorted(described["added_tokens"] or [], key=lambda token: token["id"])
    return described


# the trainer spec's fields that encoding or decoding reads (model type, byte fallback, whitespace
# and splitting rules, the unknown token's text); not its inputs, sizes, seeds or threads
SENTENCEPIECE_TRAINER_FIELDS = ("model_type", "byte_fallback", "treat_whitespace_as_suffix",
                                "allow_whitespace_only_pieces", "split_by_whitespace", "split_by_unicode_script",
                                "split_by_number", "split_digits", "max_sentencepiece_length",
                                "pretokenization_delimiter", "unk_surface")


def _sentencepiece_description(backend) -> dict:
    """Every piece (text, score, type) in id order, the normalizer and denormalizer specs, and the
    trainer spec's fields in SENTENCEPIECE_TRAINER_FIELDS, by value (unset reads as its default)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated by protoc at import
    model.ParseFromString(backend.serialized_model_proto())
    return {"pieces": [[p.piece, p.score, p.type] for p in model.pieces],
            "trainer": {name: getattr(model.trainer_spec, name) for name in SENTENCEPIECE_TRAINER_FIELDS},
            "normalizer": _proto_values(model.normalizer_spec), "denormalizer": _proto_values(model.denormalizer_spec)}


def _proto_values(spec) -> dict:
    values = {field.name: getattr(spec, field.name) for field in spec.DESCRIPTOR.fields}
    return {name: value.hex() if isinstance(value, bytes) else value for name, value in values.items()}


# An encode's time bound: tokenizers encode megabytes a second on one thread, so a text that takes
# minutes meets a regex that backtracks on it (the load's speed probe sees only its own sample).
ENCODE_SECONDS = 60.0
ENCODE_SECONDS_PER_MB = 60.0


def within(seconds: float, work):
    """`work()`'s result, or TimeoutError(seconds) when it runs longer. The library releases the GIL
    while it encodes, so the wait ends on time; a thread left running is a daemon's, which no exit
    waits for."""
    done: list = []

    def run() -> None:
        try:
            done.append((True, work()))
        except BaseException as err:  # noqa: BLE001 - handed to the caller as it was
            done.append((False, err))

    thread = threading.Thread(target=run, name="tokenizer-encode", daemon=True)
    thread.start()
    thread.join(seconds)
    if not done:
        raise TimeoutError(f"{seconds:.0f}")
    ok, value = done[0]
    if not ok:
        raise value
    return value


def load_tokenizer(path: str | Path, eod_token: str | None = None) -> Tokenizer:
    """Load a tokenizer file or folder; raise FileNotFoundError/ValueError with the path."""
    path = Path(path)
    if path.is_dir():
        for name in ("tokenizer.json", "tokenizer.json.xz", "tokenizer.model"):
            if (path / name).is_file():
                return load_tokenizer(path / name, eod_token)
        raise ValueError(f"{path}: folder has no tokenizer.json or tokenizer.model")
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {path}")
    if path.suffix == ".model":
        return _sentencepiece(path, eod_token)
    if path.name.endswith((".json", ".json.xz")):
        return _hf(path, eod_token)
    raise ValueError(f"{path}: unknown tokenizer format (expected tokenizer.json[.xz], a sentencepiece "
                     ".model, or a folder holding one)")


def _hf(path: Path, eod_token: str | None) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    raw = _tokenizer_bytes(path)
    try:
        backend = HFTokenizer.from_str(raw.decode("utf-8"))
    except Exception as err:  # tokenizers raises a bare Exception on malformed files
        raise ValueError(f"{path}: not a valid tokenizer.json: {err}") from None
    _check_encode_settings(backend, path)
    _check_speed(backend, path)
    _check_ids(backend, path)
    # the span of its ids, not its count of entries: an entry may be mapped past the others (id 10^6)
    span = max([*backend.get_vocab(with_added_tokens=True).values(), -1]) + 1
    tok = Tokenizer(backend, "hf", max(span, backend.get_vocab_size(with_added_tokens=True)), -1, str(path))
    tok.eod_id = _find_eod(tok, eod_token)
    return tok


def _check_encode_settings(backend, path: Path) -> None:
    """Truncation or padding in the file would apply to every encode: refused, naming the section."""
    for section, does in zip(ENCODE_SETTINGS, ("cut", "pad")):
        setting = getattr(backend, section)
        if setting:
            shown = ", ".join(f"{key} {value}" for key, value in setting.items()
                              if key in ("max_length", "length", "strategy", "pad_token") and value is not None)
            raise ValueError(f"{path}: its {section!r} section ({shown}) would {does} every text it encodes (shards, "
                             "evaluation and generation need texts whole and unpadded): set it to null in the file, "
                             f"or save the tokenizer again after tokenizer.no_{section}()")


def _check_ids(backend, path: Path) -> None:
    """Each id of the model's vocabulary names one token: a file giving one id to two tokens (an
    edit, a garbled copy) decodes, and describes itself, in whatever order the library's hash map
    yields them, so it would be another tokenizer at each load."""
    ids = list(backend.get_vocab(with_added_tokens=False).values())
    shared = len(ids) - len(set(ids))
    if shared:
        raise ValueError(f"{path}: {shared} id(s) of its vocabulary are given to two tokens; a tokenizer gives each id "
                         "one token (the file was edited or garbled)")


SPEED_PROBE = ("ROMEO: But soft, what light through yonder window breaks? Supercalifragilisticexpialidocious, "
               "0123456789 ünïcödé\tand\nlines  with  spaces.")
SPEED_LIMIT_S = 0.25  # tokenizers encode this probe in well under a millisecond


def _check_speed(backend, path: Path) -> None:
    """A received tokenizer.json's normalizer and pre-tokenizer regexes run on every text it encodes:
    one that backtracks (seconds per word, or the regex engine giving up mid-match) is refused by
    name on a short probe here, rather than stalling preprocessing, a prompt or a training rank."""
    start = time.perf_counter()
    try:
        backend.encode(SPEED_PROBE)
    except BaseException as err:  # noqa: BLE001 - the regex engine's give-up is a Rust panic (a BaseException)
        if isinstance(err, KeyboardInterrupt | SystemExit):
            raise
        raise ValueError(f"{path}: encoding a {len(SPEED_PROBE)}-character sample failed ({first_line(err)}): a "
                         "normalizer or pre-tokenizer regex that backtracks; refused") from None
    took = time.perf_counter() - start
    if took > SPEED_LIMIT_S:
        raise ValueError(f"{path}: encoding a {len(SPEED_PROBE)}-character sample took {took:.2f} s (a normalizer or "
                         "pre-tokenizer regex that backtracks would stall every text); refused")


MAX_TOKENIZER_BYTES = 256 * 2**20  # the largest public tokenizer.json files hold tens of MB


def _tokenizer_bytes(path: Path) -> bytes:
    """The file's bytes, .xz unpacked, refused by name past MAX_TOKENIZER_BYTES: a small received
    file that unpacks to gigabytes is stopped at the limit, not read into memory whole."""
    limit = f"{MAX_TOKENIZER_BYTES // 2**20} MiB, more than any tokenizer holds; refused"
    if path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise ValueError(f"{path}: {path.stat().st_size:,} bytes, over {limit}")
    if path.suffix != ".xz":
        return path.read_bytes()
    unpacker = lzma.LZMADecompressor()
    try:
        raw = unpacker.decompress(path.read_bytes(), max_length=MAX_TOKENIZER_BYTES + 1)
    except lzma.LZMAError as err:  # not xz at all
        raise ValueError(f"{path}: not a whole .xz file ({err}); copy the tokenizer again") from None
    if len(raw) > MAX_TOKENIZER_BYTES:
        raise ValueError(f"{path}: unpacks to over {limit}")
    if not unpacker.eof:  # cut short (an interrupted copy)
        raise ValueError(f"{path}: not a whole .xz file (it ends before its data does); copy the tokenizer again")
    return raw


def _sentencepiece(path: Path, eod_token: str | None) -> Tokenizer:
    import sentencepiece as spm

    try:
        backend = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as err:
        raise ValueError(f"{path}: not a valid sentencepiece model: {err}") from None
    tok = Tokenizer(backend, "sentencepiece", backend.get_piece_size(), -1, str(path))
    if eod_token is None and backend.eos_id() >= 0:
        tok.eod_id = backend.eos_id()
    else:
        tok.eod_id = _find_eod(tok, eod_token)
    return tok


def _find_eod(tok: Tokenizer, eod_token: str | None) -> int:
    if eod_token is not None:
        return tok.token_id(eod_token)
    for candidate in EOD_CANDIDATES:
        try:
            return tok.token_id(candidate)
        except ValueError:
            continue
    raise ValueError(f"{tok.path}: no end-of-text token found (tried {', '.join(EOD_CANDIDATES)}); "
                     "name one with --eod-token")
