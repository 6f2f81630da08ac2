"""A config from someone else steers nothing outside its run: names that become paths or launch
arguments are plain names, and the switches that load code-running pickles or foreign checkpoints
come from the command line only, never from a file, and are never saved with the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from implicit_megatron import load_config
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "tiny" / "mamba2-implicit.yaml"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def config_file(tmp_path: Path, text: str, name: str = "received.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"base: {TINY}\n{text}")
    return path


@pytest.mark.parametrize("key, value", [
    ("curriculum.phases.bounded.name", "../../outside/victim"),
    ("curriculum.phases.bounded.name", "/abs/victim"),
    ("curriculum.phases.free.name", "b;touch${IFS}/tmp/x;"),
    ("curriculum.phases.free.name", ".hidden"),
    ("name", "../elsewhere"),
    ("tracking.experiment", "a/b"),
])
def test_names_that_would_become_paths_or_shell_words_are_refused(key, value, tmp_path):
    with pytest.raises(ConfigError, match=r"may (hold only letters|not hold '\.\.')"):
        load_config(TINY, [f"{key}={value}", f"train.output_dir={tmp_path}"])


def test_a_phase_name_in_a_received_file_is_refused_naming_the_file(tmp_path):
    received = config_file(tmp_path, "curriculum:\n  phases:\n"
                                     "    - {name: ../../outside/victim, kind: bounded, fraction: 1.0, max_iter: 4,"
                                     " phantom_steps: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(received, [f"train.output_dir={tmp_path / 'run'}"])
    assert err.value.source == str(received) and err.value.key == "curriculum.phases[0].name"


@pytest.mark.parametrize("key", ["trust_pickle", "accept_foreign_checkpoint"])
def test_trust_switches_from_a_file_or_its_base_are_refused(key, tmp_path):
    direct = config_file(tmp_path, f"checkpoint: {{{key}: true}}\n")
    inherited = tmp_path / "child.yaml"
    inherited.write_text(f"base: {direct.name}\nname: child\n")
    for path in (direct, inherited):
        with pytest.raises(ConfigError, match=rf"checkpoint\.{key}: .*command line only") as err:
            load_config(path, [f"train.output_dir={tmp_path / 'run'}"])
        assert err.value.source == str(direct)  # the file that set it, also through a base


@pytest.mark.parametrize("key", ["trust_pickle", "accept_foreign_checkpoint"])
def test_trust_switches_from_the_command_line_work_and_are_not_saved(key, tmp_path):
    cfg = load_config(TINY, [f"checkpoint.{key}=true", f"train.output_dir={tmp_path}"])
    assert getattr(cfg.checkpoint, key) is True
    saved = cfg.to_dict()
    assert key not in saved["checkpoint"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))  # what a run folder keeps
    assert getattr(load_config(tmp_path / "config.yaml").checkpoint, key) is False


@pytest.mark.parametrize("base, why", [
    ("/proc/self/mem", "cannot be read (Input/output error)"),
    ("/dev/zero", "is not a regular file"),
    ("/tmp/" + "a" * 300 + ".yaml", "cannot be read (File name too long)"),
])
def test_a_base_that_is_no_readable_file_is_refused_naming_it(base, why, tmp_path):
    path = tmp_path / "received.yaml"
    path.write_text(f"base: {base}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path, [f"train.output_dir={tmp_path}"])
    named, said = str(refused.value).split(": ", 1)  # the file as resolved (/proc/self is this process's)
    assert named.endswith(Path(base).name) and said.startswith(why), str(refused.value)


@pytest.mark.parametrize("output_dir, why", [
    ("{tmp}/" + "b" * 300 + "/run", "holds a name of 300 bytes; a file name is at most 255"),
    ("{tmp}/" + "/".join(["c" * 200] * 25), "is a path of 5"),
])
def test_an_output_dir_no_file_system_takes_is_refused_naming_the_key(output_dir, why, tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_config(TINY, [f"train.output_dir={output_dir.format(tmp=tmp_path)}"])
    assert "train.output_dir" in str(refused.value) and why in str(refused.value), str(refused.value)
