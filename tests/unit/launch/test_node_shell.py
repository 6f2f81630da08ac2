"""What a multi-node launch hands every node's shell (launch/node_shell.py): each value that a
shell would run inside DeepSpeed's double quotes is named; the values users set are let through. The
command is DeepSpeed's own (its pdsh runner), run here by bash as a node's shell would run it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from implicit_megatron.launch.environment import LaunchError
from implicit_megatron.launch.node_shell import environment_file, problems, tmpdir_problem, write_environment_file

SAFE = {"PYTHONPATH": "/opt/a:/opt/b", "MLFLOW_TRACKING_URI": "http://tracker:5000/x?y=1&z=2",
        "NCCL_SOCKET_IFNAME": "eth0,ib0", "PYTHONWARNINGS": "ignore::DeprecationWarning", "HOME": "/root"}


def remote_exports(environ: dict[str, str]) -> str:
    """The `export ...;` part of DeepSpeed's pdsh command for these variables."""
    from implicit_megatron.utils.deepspeed_env import name_accelerator

    name_accelerator()
    from deepspeed.launcher.multinode_runner import PDSHRunner

    runner = PDSHRunner(SimpleNamespace(user_args=[], user_script="x"), "e30=")
    for key, value in environ.items():
        if key.startswith(("MLFLOW", "PYTHON", "NCCL")):
            runner.add_export(key, value)
    return "".join(f"export {key}={value}; " for key, value in runner.exports.items())


@pytest.mark.processes  # bash, as a node's shell
def test_what_a_node_shell_would_run_is_named_and_what_users_set_passes(tmp_path):
    marker = tmp_path / "marker"
    unsafe = {"MLFLOW_RUN_NAME": f"a$(touch {marker})", "PYTHONSTARTUP": f"`touch {marker}`",
              "NCCL_DEBUG": f'x"; touch {marker}; "'}
    for key, value in unsafe.items():  # what DeepSpeed's command does with each, run by a shell
        subprocess.run(["bash", "-c", remote_exports({key: value}) + "true"], check=False)
        assert marker.exists(), key
        marker.unlink()
    found = problems(SAFE | unsafe, tmp_path / "home", tmp_path)
    assert [p.split("=")[0] for p in found] == sorted(unsafe)
    assert problems(SAFE, tmp_path / "home", tmp_path) == []
    subprocess.run(["bash", "-c", remote_exports(SAFE) + "true"], check=True)  # and these run nothing


def test_a_deepspeed_env_file_and_the_directory_are_checked(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\nOK_VALUE=plain words\n")
    assert problems({}, home, tmp_path) == []
    (tmp_path / ".deepspeed_env").write_text("GOOD=1\nBAD=$(touch marker)\nnot a line\n")
    found = problems({}, home, tmp_path)
    assert found[0] == f"{tmp_path / '.deepspeed_env'}:2: BAD='$(touch marker)' holds '$', which a shell reads " \
                       "inside double quotes"
    assert found[1] == f"{tmp_path / '.deepspeed_env'}:3: 'not a line' is not KEY=VALUE"
    spaced = Path(tmp_path / "my runs")
    spaced.mkdir()
    assert "the working directory" in problems({}, home, spaced)[0]


def test_what_pretrain_passes_its_ranks_is_checked_and_written_after_the_users_lines(tmp_path):
    """Every value of the launch's own environment file reaches a node's shell: the thread count, the
    tokenizers switch and the accelerator as set when the launch starts are checked as DeepSpeed's own."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\n\n")
    for key in ("OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "DS_ACCELERATOR", "IMPLICIT_MEGATRON_LAUNCH"):
        assert [p.split("=")[0] for p in problems({key: "1$(touch m)"}, home, tmp_path)] == [key]
    environ = {"OMP_NUM_THREADS": "4", "DS_ACCELERATOR": "cpu", "IMPLICIT_MEGATRON_LAUNCH": "123:9@node1", "HOME": "/h"}
    assert environment_file(environ, home, tmp_path) == \
        "NCCL_IB_DISABLE=1\nIMPLICIT_MEGATRON_LAUNCH=123:9@node1\nOMP_NUM_THREADS=4\nDS_ACCELERATOR=cpu\n"


def test_an_environment_file_too_large_to_be_lines_of_settings_is_named(tmp_path):
    (tmp_path / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\n" * 100_000)
    assert [p for p in problems({}, tmp_path, tmp_path) if ".deepspeed_env" in p] == [
        f"{tmp_path / '.deepspeed_env'}: over 1048576 bytes; an environment file (KEY=VALUE lines) is at most that"]


@pytest.mark.processes  # bash, as a node's shell
def test_a_name_a_node_shell_would_run_is_refused_by_name(tmp_path):
    """DeepSpeed writes `export NAME=...;` with the name bare: a name is refused unless it is one."""
    marker = tmp_path / "marker"
    names = [f"MLFLOW_X$(touch {marker})", f"PYTHON_Y`touch {marker}`", f"NCCL_Z;touch {marker};Q",
             f"MV2_N\ntouch {marker}\n"]
    for name in names[:3]:  # what DeepSpeed's command does with each, run by a shell
        subprocess.run(["bash", "-c", remote_exports({name: "1"}) + "true"], check=False)
        assert marker.exists(), name
        marker.unlink()
    found = problems(SAFE | dict.fromkeys(names, "1"), tmp_path / "home", tmp_path)
    assert len(found) == len(names) and not marker.exists()
    for name, problem in zip(sorted(names), found):
        assert problem.startswith(f"the variable name {name!r} is not a name"), problem


def test_a_tmpdir_the_launch_cannot_write_its_environment_file_in_is_named(tmp_path):
    """A multi-node launch writes its environment file in $TMPDIR: a missing one is named, not a traceback."""
    missing = tmp_path / "no-such"
    assert tmpdir_problem({"TMPDIR": str(missing)}) == \
        f"TMPDIR={missing} is not a folder this launch can write its environment file in (it does not exist)"
    (tmp_path / "file").write_text("")
    assert "(it is not a folder)" in str(tmpdir_problem({"TMPDIR": str(tmp_path / "file")}))
    assert tmpdir_problem({"TMPDIR": str(tmp_path)}) is None and tmpdir_problem({}) is None
    with pytest.raises(LaunchError, match=r"^pretrain.sh: TMPDIR=.*no-such: the launch's environment file could "
                                          r"not be written \(FileNotFoundError"):
        write_environment_file({"TMPDIR": str(missing)})
