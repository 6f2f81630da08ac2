"""Preprocessing settings, checked up front: every argument error surfaces before any work.

The plan also fixes the fingerprints that make resuming safe: the run's (all inputs and
settings: a finished output is reused only when it matches) and each input's part key (its size,
mtime and every setting that changes its tokens). The tokenizer enters both by its identity (what it
does, `Tokenizer.identity`), so a recompressed or re-serialized copy of it resumes the same run.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from data_pipeline.encoder import EncodeSettings
from data_pipeline.indexed import token_dtype
from data_pipeline.shard_check import file_sha256
from data_pipeline.sources import InputError, InputSpec, resolve_inputs
from data_pipeline.tokenizer import Tokenizer, UnknownTokenError, load_tokenizer

FORMAT_VERSION = 2  # 2: the tokenizer keyed by its identity, no longer by its file's sha256


class PreprocessError(ValueError):
    """A problem with the arguments or the output location, reported before any work is done."""


@dataclass
class PreprocessConfig:
    inputs: list[str]
    tokenizer: str
    output_prefix: str
    text_key: str = "text"
    workers: int = 1  # 0: tokenize in this process
    append_eod: bool = False
    valid_fraction: float = 0.0
    test_fraction: float = 0.001
    max_shard_tokens: int | None = None
    limit_docs: int | None = None
    eod_token: str | None = None
    batch_bytes: int = 1 << 20  # text per worker task
    batch_docs: int = 512  # rows per worker task (columnar inputs)
    progress: bool = True


@dataclass
class Plan:
    """Everything checked and derived before work starts."""

    config: PreprocessConfig
    specs: list[InputSpec]
    tokenizer: Tokenizer
    settings: EncodeSettings
    settings_key: dict
    fingerprint: str
    earlier_fingerprint: str = ""  # the same run as FORMAT_VERSION 1 keyed it (the tokenizer's file sha256)

    @property
    def prefix(self) -> str:
        return self.config.output_prefix

    @property
    def stats_path(self) -> Path:
        return Path(f"{self.prefix}_stats.json")

    @property
    def work_dir(self) -> Path:
        return Path(f"{self.prefix}.work")

    @property
    def dtype(self) -> type:
        return token_dtype(self.tokenizer.vocab_size)

    @property
    def tokenizer_record(self) -> dict:
        """What `{prefix}_stats.json` says of the tokenizer: its identity, which the shards are
        compared by (shard_tokenizer); its file, by absolute path (it names the file from any working
        directory) and sha256 (what builds before the identity were compared by)."""
        return {"tokenizer": os.path.abspath(self.tokenizer.path), "tokenizer_sha256": file_sha256(self.tokenizer.path),
                "tokenizer_identity": self.settings_key["tokenizer_identity"]}

    def part_dir(self, index: int, documents_left: int | None) -> Path:
        """Where input `index` is written, keyed by everything its tokens depend on."""
        key = digest({"settings": self.settings_key, "input": self.specs[index].identity(),
                      "limit": documents_left})
        return self.work_dir / f"{index:05d}-{key[:16]}"


def plan_run(config: PreprocessConfig) -> Plan:
    """Check every argument (tokenizer, inputs, output location) and fix the settings; no work yet."""
    _check_numbers(config)
    try:
        tokenizer = load_tokenizer(config.tokenizer, config.eod_token)
    except UnknownTokenError as err:
        raise PreprocessError(f"--eod-token: {err}") from None
    except (OSError, ValueError) as err:
        raise PreprocessError(f"--tokenizer: {err}") from None
    try:
        specs = resolve_inputs(config.inputs)
    except InputError as err:
        raise PreprocessError(str(err)) from None
    _check_output(config.output_prefix)
    settings = EncodeSettings(config.text_key, tokenizer.eod_id, config.append_eod, config.valid_fraction,
                              config.test_fraction, token_dtype(tokenizer.vocab_size).__name__)
    settings_key = {"version": FORMAT_VERSION, **asdict(settings), "tokenizer_identity": tokenizer.identity()}
    run = {"inputs": [s.identity() for s in specs], "limit_docs": config.limit_docs,
           "max_shard_tokens": config.max_shard_tokens}
    earlier = {"version": 1, **asdict(settings), "tokenizer_sha256": file_sha256(tokenizer.path)}
    return Plan(config, specs, tokenizer, settings, settings_key, digest({"settings": settings_key, **run}),
                digest({"settings": earlier, **run}))


def _check_numbers(config: PreprocessConfig) -> None:
    for name, value in (("--valid-fraction", config.valid_fraction), ("--test-fraction", config.test_fraction)):
        if not 0 <= value < 1:
            raise PreprocessError(f"{name}: expected a fraction in [0, 1), got {value}")
    if config.valid_fraction + config.test_fraction >= 1:
        raise PreprocessError(f"--valid-fraction + --test-fraction = "
                              f"{config.valid_fraction + config.test_fraction} leaves nothing for training")
    if config.workers < 0:
        raise PreprocessError(f"--workers: expected 0 or more, got {config.workers}")
    for name, count in (("--max-shard-tokens", config.max_shard_tokens), ("--limit-docs", config.limit_docs),
                        ("batch_bytes", config.batch_bytes), ("batch_docs", config.batch_docs)):
        if count is not None and count < 1:
            raise PreprocessError(f"{name}: expected a positive number, got {count}")
    if not config.text_key:
        raise PreprocessError("--text-key: empty field name")


def _check_output(prefix: str) -> None:
    """Create the output folder and make sure files can be created there."""
    if not prefix or prefix.endswith(os.sep) or os.path.isdir(prefix):
        raise PreprocessError(f"--output-prefix: {prefix!r} names a folder; give a file prefix "
                              "such as data/pile/neox")
    folder = os.path.dirname(os.path.abspath(prefix))
    try:
        os.makedirs(folder, exist_ok=True)
        with open(f"{prefix}.lock", "a"):
            pass
    except OSError as err:
        raise PreprocessError(f"--output-prefix: cannot write under {folder}: {err.strerror or err}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PreprocessError(f"--output-prefix: folder {folder} is not writable")


def digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
