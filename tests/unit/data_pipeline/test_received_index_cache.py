"""Index caches: megatron-core reads its cached arrays with numpy.load(allow_pickle=True), reuses a
cache whose file names anyone can compute from the shards, and writes through whatever a name there
points at. So a received shards folder's `index-cache/` is never read nor written (the indices are
built in this user's cache), and a cache this user names (data.index_cache) is read only when it is
a folder of this user's, not writable by others, that holds plain integer arrays and nothing else."""

from __future__ import annotations

import os
import pickle
import shutil

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
    build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1, cache_dir=str(tmp_path / "index-cache"))
    cached = sorted((tmp_path / "index-cache").glob("*.npy"))
    assert cached, "megatron-core wrote no index cache"
    return tmp_path, cached


def samples(folder, **kwargs) -> list[list[int]]:
    data = build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=1, **kwargs)
    return [data[i].tolist() for i in range(len(data))]


def cached_array(cached, name: str):
    return next(p for p in cached if p.name.endswith(name))


def plant(cached, payload: str, outside) -> None:
    """One of a sender's payloads written into the cache it ships."""
    if payload == "hard link out":  # megatron-core rebuilds (no description) and writes through it
        target = cached_array(cached, "document_index.npy")
        target.unlink()
        os.link(outside, target)
        next(target.parent.glob("*description.txt")).unlink()
    elif payload == "shuffle index all zeros":
        target = cached_array(cached, "shuffle_index.npy")
        np.save(target, np.zeros(len(np.load(target)), dtype=np.int64))
    elif payload == "npz under an npy name":
        target = cached_array(cached, "sample_index.npy")
        array = np.load(target)
        with open(target, "wb") as out:
            np.savez(out, array)
    elif payload == "pickle":
        with open(cached_array(cached, "document_index.npy"), "wb") as out:
            np.save(out, np.array([TouchesMarker(str(outside) + ".marker")], dtype=object), allow_pickle=True)


def own_file(folder):
    """A file of the receiver's that a payload may point at: a plain array, as a cached index is."""
    path = folder / "own.npy"
    np.save(path, np.arange(7, dtype=np.int32))
    return path, path.read_bytes()


PAYLOADS = ["hard link out", "shuffle index all zeros", "npz under an npy name", "pickle"]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_received_index_cache_is_never_read_nor_written_and_said_once(received, payload, tmp_path_factory,
                                                                        monkeypatch, capsys):
    folder, cached = received
    clean = tmp_path_factory.mktemp("clean")
    shutil.copy(folder / "a_train.bin", clean)
    shutil.copy(folder / "a_train.idx", clean)
    expected = samples(clean, cache_dir=str(clean / "own-cache"))
    outside, before = own_file(tmp_path_factory.mktemp("outside"))
    plant(cached, payload, outside)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))
    capsys.readouterr()
    assert samples(folder) == expected and samples(folder) == expected
    assert outside.read_bytes() == before
    assert not os.path.exists(str(outside) + ".marker")
    said = [line for line in capsys.readouterr().err.splitlines() if "index-cache" in line]
    assert len(said) == 1 and f"{folder / 'index-cache'}: not read" in said[0], said


@pytest.mark.parametrize("form", ["object array", "plain pickle"])
def test_a_cached_index_that_holds_a_pickle_is_refused_by_name_and_never_loaded(received, form):
    folder, cached = received
    marker = folder / "marker"
    target = cached_array(cached, "document_index.npy")
    with open(target, "wb") as out:
        if form == "object array":
            np.save(out, np.array([TouchesMarker(str(marker))], dtype=object), allow_pickle=True)
        else:
            pickle.dump(TouchesMarker(str(marker)), out)
    with pytest.raises(ShardReadError, match=f"^{target}: .*not a plain array"):
        samples(folder, cache_dir=str(folder / "index-cache"))
    assert not marker.exists()


@pytest.mark.parametrize("payload, says", [
    ("hard link out", "a hard link"),
    ("npz under an npy name", "not a plain array"),
    ("shuffle index all zeros", "not a permutation"),
])
def test_a_named_cache_holding_a_payload_is_refused_by_name(received, payload, says, tmp_path_factory):
    folder, cached = received
    outside, before = own_file(tmp_path_factory.mktemp("outside"))
    plant(cached, payload, outside)
    with pytest.raises(ShardReadError, match=f"^{folder / 'index-cache'}/.*: {says}"):
        samples(folder, cache_dir=str(folder / "index-cache"))
    assert outside.read_bytes() == before


def test_a_named_cache_that_others_write_or_own_is_refused(received):
    folder, _ = received
    cache = folder / "index-cache"
    cache.chmod(0o777)
    with pytest.raises(ShardReadError, match=f"^{cache}: .*writable by other users"):
        samples(folder, cache_dir=str(cache))
    cache.chmod(0o755)
    os.chown(cache, 4321, 4321)
    if os.stat(cache).st_uid != 4321:
        pytest.skip("this user cannot give a folder away (not root)")
    with pytest.raises(ShardReadError, match=f"^{cache}: .*owned by user 4321"):
        samples(folder, cache_dir=str(cache))


def test_an_index_cache_that_is_a_link_is_refused_by_name(received, tmp_path_factory):
    folder, _ = received
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    os.rename(folder / "index-cache", elsewhere / "index-cache")
    (folder / "index-cache").symlink_to(elsewhere / "index-cache")
    with pytest.raises(ShardReadError, match=f"^{folder / 'index-cache'}: .*symbolic link"):
        samples(folder, cache_dir=str(folder / "index-cache"))


def test_a_lock_that_is_a_link_is_refused_and_nothing_is_made_at_its_target(received, tmp_path_factory):
    folder, _ = received
    target = tmp_path_factory.mktemp("elsewhere") / "made-by-the-lock"
    (folder / "index-cache" / ".lock").unlink()
    (folder / "index-cache" / ".lock").symlink_to(target)
    with pytest.raises(ShardReadError, match=r"\.lock: .*symbolic link"):
        samples(folder, cache_dir=str(folder / "index-cache"))
    assert not target.exists()


def test_a_fifo_in_the_index_cache_is_refused_without_waiting_on_it(received):
    folder, cached = received
    cached[0].unlink()
    os.mkfifo(cached[0])  # opened for reading, it would wait for a writer for ever
    with pytest.raises(ShardReadError, match=f"^{cached[0]}: not a regular file"):
        samples(folder, cache_dir=str(folder / "index-cache"))


def test_the_pre_launch_check_notes_a_received_cache_and_refuses_a_named_one_that_others_write(received, tmp_path,
                                                                                              monkeypatch):
    from implicit_megatron import load_config
    from implicit_megatron.prelaunch import notes
    from implicit_megatron.utils.typed_yaml import ConfigError

    folder, _ = received
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    args = [f"data.prefixes=[{folder / 'a'}]", "data.source=null"]
    said = [n for n in notes(load_config("configs/tiny/mamba2-explicit.yaml", args)) if "index-cache" in n]
    assert len(said) == 1 and said[0].startswith(f"{folder / 'index-cache'} is not read"), said
    (folder / "index-cache").chmod(0o777)
    with pytest.raises(ConfigError, match="writable by other users") as info:
        load_config("configs/tiny/mamba2-explicit.yaml", [*args, f"data.index_cache={folder / 'index-cache'}",
                                                          "data.seq_len=16"], check_data=True)
    assert info.value.key == "data.index_cache"


def test_a_cached_order_of_another_seed_is_refused_naming_the_file(received):
    """A valid shuffle index, but another seed's permutation: the samples would come in another order
    than data.seed gives, without a word (every structural check passes)."""
    folder, cached = received
    target = cached_array(cached, "shuffle_index.npy")
    own = np.load(target)
    np.save(target, own[np.random.RandomState(7).permutation(len(own))])
    with pytest.raises(ShardReadError, match=rf"{target.name}: not the sample order of seed 1 \(data.seed; another "
                                             r"seed's, or edited\); remove .* \(it is rebuilt\)"):
        samples(folder, cache_dir=str(folder / "index-cache"))


def test_another_seeds_whole_cache_under_this_seeds_names_is_refused(received, tmp_path):
    """Every array of seed 7's cache, renamed as seed 1's: consistent with each other and the shard,
    but in seed 7's order."""
    folder, cached = received
    other = tmp_path / "seed-7"
    build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=7, cache_dir=str(other))
    for which in ("document_index.npy", "sample_index.npy", "shuffle_index.npy"):
        shutil.copy(next(other.glob(f"*{which}")), cached_array(cached, which))
    with pytest.raises(ShardReadError, match=r"document_index.npy: not the document order of seed 1 \(data.seed"):
        samples(folder, cache_dir=str(folder / "index-cache"))


@pytest.mark.parametrize("num_samples", [None, 70, 120, 240])  # 62 an epoch: at 70 the final one apart
def test_a_cache_of_this_seed_is_read_at_any_number_of_epochs(tmp_path, num_samples):
    """One epoch or several, the final one shuffled apart from the others or not (megatron-core's
    choice: apart below 80 % of an epoch), read back from the cache: the order checks hold and the
    samples are the ones first built."""
    write_unique_token_shard(str(tmp_path / "a_train"), document_lengths_summing_to(1000, seed=0))
    cache = str(tmp_path / "cache")
    built = [build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=3, num_samples=num_samples,
                                  cache_dir=cache) for _ in range(2)]
    first, again = ([data[i].tolist() for i in range(len(data))] for data in built)
    assert first == again
