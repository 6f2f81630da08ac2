"""A DeepSpeed hostfile read by our own code (launch/hostfile.py): every mistake one error naming
the file and the line; what DeepSpeed's launcher accepts, we read the same."""

from __future__ import annotations

import os

import pytest

from implicit_megatron.launch.hostfile import Host, HostfileError, read_hostfile


def test_hosts_slots_comments_and_blank_lines(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# the cluster\n\nnode001 slots=8   # first\n  10.0.0.2 slots=4\nnode-3.example:x slots=1\n")
    assert read_hostfile(path) == [Host("node001", 8), Host("10.0.0.2", 4), Host("node-3.example:x", 1)]


def test_deepspeeds_own_reading_of_a_valid_file_agrees(tmp_path):
    from deepspeed.launcher.runner import _parse_hostfile

    text = "# c\nnode1 slots=2\n\nnode2 slots=3\n"
    (tmp_path / "h").write_text(text)
    assert {h.name: h.slots for h in read_hostfile(tmp_path / "h")} == dict(_parse_hostfile(text.splitlines()))


@pytest.mark.parametrize("text,says", [
    ("a slots=1\nb slots=2\na slots=1\n", ":3: host 'a' is listed twice"),
    ("a slots=two\n", ":1: slots=two: expected a whole number of at least 1"),
    ("a slots=0\n", ":1: slots=0: expected a whole number of at least 1"),
    ("a slots=-1\n", ":1: slots=-1: expected"),
    ("a\n", ":1: 'a': expected 'HOST slots=N'"),
    ("a slots=1 extra\n", ":1: 'a slots=1 extra': expected 'HOST slots=N'"),
    ("a gpus=1\n", ":1: 'a gpus=1': expected 'HOST slots=N'"),
    ("$(touch x) slots=1\n", ":1: host '$(touch' is not a host name"),
    ("-oProxyCommand=x slots=1\n", ":1: host '-oProxyCommand=x' is not a host name"),
    ("# only a comment\n\n", ": no host"),
])
def test_each_mistake_names_the_file_and_line(tmp_path, text, says):
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(HostfileError) as err:
        read_hostfile(path)
    assert str(err.value).startswith(str(path)) and says in str(err.value)


def test_a_missing_binary_or_huge_file_is_named(tmp_path):
    with pytest.raises(HostfileError, match="cannot be read as a hostfile"):
        read_hostfile(tmp_path / "none")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00 slots=1")
    with pytest.raises(HostfileError, match="cannot be read as a hostfile"):
        read_hostfile(tmp_path / "bin")
    (tmp_path / "big").write_text("a slots=1\n" * 200_000)
    with pytest.raises(HostfileError, match="over 1048576 bytes; a hostfile"):
        read_hostfile(tmp_path / "big")
    os.mkfifo(tmp_path / "fifo")  # opened for reading, it would wait for a writer for ever
    with pytest.raises(HostfileError, match=f"{tmp_path / 'fifo'}: not a regular file"):
        read_hostfile(tmp_path / "fifo")
