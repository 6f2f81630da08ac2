"""Fixed word-problem sets on disk: .npy shards that training reads with memory mapping.

A set written under `prefix` (e.g. `data/word_problem/Ma_A5_L256_p0.1_train`) is

    {prefix}.json                          the manifest (written last: its presence means complete)
    {prefix}_{k:05d}_inputs.npy            int16, shape (n_k, length), C order
    {prefix}_{k:05d}_labels.npy            int16, shape (n_k, length); labels[i, t] = inputs[i, 0] · ... · inputs[i, t]

Plain .npy rather than megatron-core's indexed format: every sample has the same length and two
aligned arrays, and the packed GPT reader would shift labels by one token, which is wrong here.
`np.load(path, mmap_mode="r")` (or `WordProblemShards`) maps them without reading.

Shard k is drawn from its own generator, keyed by (seed, k), so shards can be written in any order
or in parallel and the set depends only on (spec, num_sequences, sequences_per_shard).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from data_pipeline.synthetic.algebra import ENCODING_VERSION
from data_pipeline.synthetic.word_problem import TOKEN_DTYPE, WordProblemSpec, generate_words

FORMAT = "word-problem-npy"
FORMAT_VERSION = 1
SHARD_KEY = 0  # spawn-key tag of shards (on-the-fly batches use word_problem.STREAM_KEY)


def shard_paths(prefix: str | os.PathLike, shard: int) -> tuple[Path, Path]:
    """(inputs, labels) file paths of shard `shard`."""
    base = f"{os.fspath(prefix)}_{shard:05d}"
    return Path(base + "_inputs.npy"), Path(base + "_labels.npy")


def shard_rng(seed: int, shard: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(SHARD_KEY, shard))))


def _save_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, array)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_shards(spec: WordProblemSpec, num_sequences: int, prefix: str | os.PathLike,
                 sequences_per_shard: int = 16384) -> Path:
    """Write `num_sequences` words of `spec` as shards of at most `sequences_per_shard`; returns the manifest."""
    if num_sequences < 1 or sequences_per_shard < 1:
        raise ValueError(f"num_sequences and sequences_per_shard must be positive, got {num_sequences}, "
                         f"{sequences_per_shard}")
    manifest_path = Path(f"{os.fspath(prefix)}.json")
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    if manifest_path.exists():
        manifest_path.unlink()  # an interrupted rewrite must not look complete
    shards = []
    for k, start in enumerate(range(0, num_sequences, sequences_per_shard)):
        count = min(sequences_per_shard, num_sequences - start)
        inputs, labels = generate_words(spec, count, shard_rng(spec.seed, k))
        inputs_path, labels_path = shard_paths(prefix, k)
        _save_atomic(inputs_path, inputs)
        _save_atomic(labels_path, labels)
        shards.append({"inputs": inputs_path.name, "labels": labels_path.name, "num_sequences": count})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "encoding_version": ENCODING_VERSION,
        "spec": asdict(spec), "vocab_size": spec.vocab_size, "dtype": np.dtype(TOKEN_DTYPE).name,
        "num_sequences": num_sequences, "sequences_per_shard": sequences_per_shard, "shards": shards,
        "labels": "labels[t] = inputs[0] . inputs[1] . ... . inputs[t] (aligned with inputs, no shift)",
    }
    tmp = manifest_path.with_name(manifest_path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, manifest_path)
    return manifest_path


class WordProblemShards:
    """A written set, memory-mapped: `len()` words, item i = (inputs[i], labels[i]) as int16 rows."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        manifest_path = Path(f"{os.fspath(prefix)}.json")
        if not manifest_path.is_file():
            raise FileNotFoundError(f"no word-problem manifest {manifest_path} (write_shards writes it last)")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format") != FORMAT or self.manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{manifest_path} is not a {FORMAT} v{FORMAT_VERSION} manifest")
        if self.manifest.get("encoding_version") != ENCODING_VERSION:
            raise ValueError(f"{manifest_path} uses token encoding v{self.manifest.get('encoding_version')}, "
                             f"this code reads v{ENCODING_VERSION}")
        self.spec = WordProblemSpec(**self.manifest["spec"])
        folder = manifest_path.parent
        self.inputs = [np.load(folder / s["inputs"], mmap_mode="r") for s in self.manifest["shards"]]
        self.labels = [np.load(folder / s["labels"], mmap_mode="r") for s in self.manifest["shards"]]
        for s, x, y in zip(self.manifest["shards"], self.inputs, self.labels):
            expected = (s["num_sequences"], self.spec.length)
            if x.shape != expected or y.shape != expected:
                raise ValueError(f"shard {s['inputs']} has shapes {x.shape}, {y.shape}; the manifest says {expected}")
        self.ends = np.cumsum([x.shape[0] for x in self.inputs])

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"word {index} is out of range for {len(self)} words")
        shard = int(np.searchsorted(self.ends, index, side="right"))
        row = index - (int(self.ends[shard - 1]) if shard else 0)
        return self.inputs[shard][row], self.labels[shard][row]
