"""A received shards folder's index cache: megatron-core reads its cached arrays with
numpy.load(allow_pickle=True) and reuses a cache whose name anyone can compute from the shards, so a
pickle among them would run code. Nothing in it is read unless it is a plain array in a real folder."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from data_pipeline.packed import ShardReadError, build_packed_dataset

from .test_packed import SEQ, document_lengths_summing_to, write_unique_token_shard


class TouchesMarker:
    """Unpickled, it creates the marker file: the payload's only effect."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture()
def received(tmp_path):
    """A shards folder with its index cache, as a sender would pack it."""
    write_unique_token_shard(str(tmp_path / "a_train"), document_lengths_summing_to(1000, seed=0))
    build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    cached = sorted((tmp_path / "index-cache").glob("*.npy"))
    assert cached, "megatron-core wrote no index cache"
    return tmp_path, cached


@pytest.mark.parametrize("form", ["object array", "plain pickle"])
def test_a_cached_index_that_holds_a_pickle_is_refused_by_name_and_never_loaded(received, form):
    folder, cached = received
    marker = folder / "marker"
    target = next(p for p in cached if p.name.endswith("document_index.npy"))
    with open(target, "wb") as out:
        if form == "object array":
            np.save(out, np.array([TouchesMarker(str(marker))], dtype=object), allow_pickle=True)
        else:
            pickle.dump(TouchesMarker(str(marker)), out)
    with pytest.raises(ShardReadError, match=f"^{target}: .*not a plain array"):
        build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=1)
    assert not marker.exists()


def test_an_index_cache_that_is_a_link_is_refused_by_name(received, tmp_path_factory):
    folder, _ = received
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    os.rename(folder / "index-cache", elsewhere / "index-cache")
    (folder / "index-cache").symlink_to(elsewhere / "index-cache")
    with pytest.raises(ShardReadError, match=f"^{folder / 'index-cache'}: .*symbolic link"):
        build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=1)


def test_a_lock_that_is_a_link_is_refused_and_nothing_is_made_at_its_target(received, tmp_path_factory):
    folder, _ = received
    target = tmp_path_factory.mktemp("elsewhere") / "made-by-the-lock"
    (folder / "index-cache" / ".lock").unlink()
    (folder / "index-cache" / ".lock").symlink_to(target)
    with pytest.raises(ShardReadError, match=r"\.lock: .*symbolic link"):
        build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=1)
    assert not target.exists()


def test_a_fifo_in_the_index_cache_is_refused_without_waiting_on_it(received):
    folder, cached = received
    cached[0].unlink()
    os.mkfifo(cached[0])  # opened for reading, it would wait for a writer for ever
    with pytest.raises(ShardReadError, match=f"^{cached[0]}: not a regular file"):
        build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=1)
