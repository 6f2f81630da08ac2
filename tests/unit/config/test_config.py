"""Configs: every shipped file validates, each class of error is reported with file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from implicit_megatron import load_config
from implicit_megatron.config import phase_bounds
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
EXPERIMENTS = sorted(p for p in CONFIGS.rglob("*.yaml") if "parts" not in p.parts)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)  # config paths (tokenizer, data) are relative to the repository


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_validates(path):
    from implicit_megatron.config.plan import own_launches
    from implicit_megatron.config.reading import read_curriculum
    from implicit_megatron.prelaunch import phase_configs

    # catbAbI's data is not in the repository (docs/paper.md: catbAbI): its configs are checked on the fixture
    data = ["task.catbabi.folder=tests/fixtures/catbabi"] if path.parent.name == "catbabi" else []
    curriculum = read_curriculum(path, data)
    if curriculum.run_phase is None and own_launches(curriculum.phases):  # phase by phase, as curriculum.sh does
        configs = phase_configs(str(path), data, world_size=1)
        assert [c.curriculum.run_phase for c in configs] == [p.name for p in configs[0].curriculum.phases]
    else:
        configs = [load_config(path, data, world_size=1, check_data=bool(data))]
    assert all(cfg.name for cfg in configs)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path, overrides=(), **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides), **kwargs)
    return info.value


def test_unknown_key_names_file_key_and_suggestion(tmp_path):
    path = write(tmp_path, "bad.yaml", f"base: {CONFIGS / 'tiny/mamba2-explicit.yaml'}\nmodel:\n  d_modle: 32\n")
    err = error_of(path)
    assert err.source == str(path) and err.key == "model.d_modle"
    assert "did you mean 'model.d_model'" in str(err)


def test_unknown_section(tmp_path):
    path = write(tmp_path, "bad.yaml", "trainer:\n  steps: 3\n")
    err = error_of(path)
    assert err.key == "trainer" and str(path) in str(err)


def test_wrong_type_names_expectation():
    err = error_of(CONFIGS / "tiny/llama-explicit.yaml", ["model.llama.n_heads=four"])
    assert err.source == "command line" and err.key == "model.llama.n_heads"
    assert "expected an integer" in err.message


def test_wrong_literal():
    err = error_of(CONFIGS / "quickstart.yaml", ["model.arch=rwkv"])
    assert "expected one of 'mamba2', 'llama'" in err.message


def test_bool_is_not_an_int_and_int_is_a_float():
    assert error_of(CONFIGS / "quickstart.yaml", ["train.steps=true"]).key == "train.steps"
    cfg = load_config(CONFIGS / "quickstart.yaml", ["optimizer.lr=1"])
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)
    assert load_config(CONFIGS / "quickstart.yaml", ["optimizer.lr=3e-4"]).optimizer.lr == 3e-4  # YAML 1.2 style
    assert error_of(CONFIGS / "quickstart.yaml", ["optimizer.lr=fast"]).key == "optimizer.lr"


def test_cuda_graphs_setting(tmp_path):
    tiny = CONFIGS / "tiny/mamba2-implicit.yaml"
    assert load_config(tiny).implicit.cuda_graphs == "auto"
    for value in ("on", "off"):  # bare on/off are YAML 1.1 booleans, on the command line and in files
        assert load_config(tiny, [f"implicit.cuda_graphs={value}"]).implicit.cuda_graphs == value
        path = write(tmp_path, f"{value}.yaml", f"base: {tiny}\nimplicit:\n  cuda_graphs: {value}\n")
        assert load_config(path).implicit.cuda_graphs == value
    assert "expected one of 'auto', 'on', 'off'" in error_of(tiny, ["implicit.cuda_graphs=always"]).message
    for impossible in ("distributed.zero_stage=3", "distributed.activation_checkpointing=true"):
        err = error_of(tiny, ["implicit.cuda_graphs=on", impossible])
        assert err.key == "implicit.cuda_graphs" and "use auto" in err.message
        assert load_config(tiny, ["implicit.cuda_graphs=auto", impossible])  # auto runs those eagerly


def test_batch_not_divisible_by_micro_batch_times_data_parallel():
    load_config(CONFIGS / "mamba2/130m-explicit.yaml", world_size=64)  # 512 = 8 x 64
    err = error_of(CONFIGS / "mamba2/130m-explicit.yaml", world_size=48)
    assert err.key == "train.global_batch_size"
    assert "8 x 48" in err.message and err.source.endswith("parts/train/paper.yaml")


def test_a_command_line_override_is_blamed_not_the_file_of_the_default():
    err = error_of(CONFIGS / "mamba2/130m-explicit.yaml", ["train.micro_batch_size=24"])
    assert err.key == "train.global_batch_size" and err.source == "command line"
    err = error_of(CONFIGS / "tiny/mamba2-explicit.yaml", ["train.steps=3"])
    assert err.key == "schedule.warmup_steps" and err.source == "command line"


def test_tolerance_in_bounded_phase_is_refused(tmp_path):
    path = write(tmp_path, "phase.yaml", f"""base: {CONFIGS / 'tiny/mamba2-implicit.yaml'}
curriculum:
  phases:
    - {{name: bounded, kind: bounded, fraction: 1.0, max_iter: 4, phantom_steps: 1, tol: 0.05}}
""")
    err = error_of(path)
    assert err.key == "curriculum.phases[0].tol" and err.source == str(path)
    assert "bounded phase" in err.message


@pytest.mark.parametrize("extra,key,words", [(", phantom_steps: 4", "phantom_steps", "set phantom_steps 0"),
                                             (", phantom_steps: 0, tol: 0.05", "tol", "unrolled phase")])
def test_unrolled_phase_checks(tmp_path, extra, key, words):
    path = write(tmp_path, "phase.yaml", f"""base: {CONFIGS / 'tiny/mamba2-implicit.yaml'}
curriculum:
  phases:
    - {{name: warmup, kind: unrolled, fraction: 0.5, max_iter: 4{extra}}}
    - {{name: free, kind: free, fraction: 0.5, max_iter: 8, phantom_steps: 4, tol: 0.05}}
""")
    err = error_of(path)
    assert err.key == f"curriculum.phases[0].{key}" and words in err.message


def test_free_phase_needs_tolerance_and_fractions_add_up():
    phases = "[{name: a, kind: free, fraction: 1.0, max_iter: 8, phantom_steps: 2}]"
    assert error_of(CONFIGS / "tiny/mamba2-implicit.yaml", [f"curriculum.phases={phases}"]).key.endswith(".tol")
    phases = "[{name: a, kind: bounded, fraction: 0.5, max_iter: 4, phantom_steps: 1}]"
    assert "add up to 1" in error_of(CONFIGS / "tiny/mamba2-implicit.yaml", [f"curriculum.phases={phases}"]).message


def test_unknown_run_phase():
    err = error_of(CONFIGS / "tiny/mamba2-implicit.yaml", ["curriculum.run_phase=warmup"])
    assert err.key == "curriculum.run_phase" and "bounded" in err.message


def test_vocabulary_smaller_than_tokenizer():
    err = error_of(CONFIGS / "quickstart.yaml", ["model.vocab_size=50000"])
    assert err.key == "model.vocab_size" and "50277" in err.message


def test_missing_tokenizer_file():
    err = error_of(CONFIGS / "quickstart.yaml", ["data.tokenizer=nowhere/tokenizer.json"])
    assert err.key == "data.tokenizer" and "nowhere/tokenizer.json" in err.message


def test_model_shape_checks():
    assert error_of(CONFIGS / "tiny/mamba2-explicit.yaml", ["model.mamba2.headdim=48"]).key == "model.mamba2.headdim"
    assert error_of(CONFIGS / "tiny/llama-explicit.yaml", ["model.llama.n_kv_heads=3"]).key == "model.llama.n_kv_heads"


@pytest.mark.parametrize("config, override, key", [
    ("mamba2", "model.mamba2.dt_min=-1.0", "model.mamba2.dt_min"),  # math domain error at init
    ("mamba2", "model.mamba2.dt_max=0.0001", "model.mamba2.dt_max"),  # below dt_min
    ("mamba2", "model.mamba2.A_init_range=[1.0, -64.0]", "model.mamba2.A_init_range[1]"),
    ("mamba2", "model.init_std=.nan", "model.init_std"),  # torch's 'normal expects std >= 0.0'
    ("mamba2", "model.norm_eps=0.0", "model.norm_eps"),
    ("llama", "model.llama.rope_theta=0.5", "model.llama.rope_theta")])
def test_initialisation_settings_are_checked_by_name(config, override, key):
    """Found by tools/dev/fuzz_received.py in an export's config.json: settings the model is built
    from, each ending in a traceback at build time (or NaN weights) until named here."""
    assert error_of(CONFIGS / f"tiny/{config}-explicit.yaml", [override]).key == key


def test_yaml_file_problems(tmp_path):
    assert "not found" in str(error_of(tmp_path / "missing.yaml"))
    assert "not valid YAML" in str(error_of(write(tmp_path, "broken.yaml", "model: [1,\n")))
    a = write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    assert "circular" in str(error_of(a))
    assert "key.sub_key=value" in str(error_of(CONFIGS / "quickstart.yaml", ["train.steps"]))


def test_base_chain_and_overrides(tmp_path):
    child = write(tmp_path, "child.yaml", f"base: {CONFIGS / 'tiny/mamba2-implicit.yaml'}\n"
                                          "name: child\ntrain: {steps: 30}\n")
    cfg = load_config(child, ["curriculum.phases=[]", "implicit.tol=null", "train.micro_batch_size=2",
                              "data.prefixes=[a, b]"])
    assert cfg.name == "child" and cfg.train.steps == 30 and cfg.train.global_batch_size == 8
    assert cfg.implicit.tol is None and cfg.train.micro_batch_size == 2
    assert cfg.data.prefixes == ["a", "b"]
    assert cfg.model.d_model == 64  # from the grandparent
    assert cfg.output_dir == "runs/child"


def test_one_phase_is_overridden_by_name_or_index_and_blamed_on_the_command_line():
    tiny = CONFIGS / "tiny/mamba2-implicit.yaml"
    cfg = load_config(tiny, ["curriculum.phases.free.tol=0.01", "curriculum.phases.0.launch.processes_per_node=2",
                             "curriculum.phases[1].max_iter=8"], check_files=False)
    assert [(p.name, p.tol, p.max_iter, p.launch.processes_per_node) for p in cfg.curriculum.phases] == [
        ("bounded", None, 4, 2), ("free", 0.01, 8, None)]
    assert str(error_of(tiny, ["curriculum.phases.free.tol=-1"])) == \
        "command line: curriculum.phases[1].tol: expected a tolerance > 0, got -1.0"
    assert str(error_of(tiny, ["curriculum.phases[0].tol=0.1"])).startswith(
        "command line: curriculum.phases[0].tol: a bounded phase runs exactly max_iter passes")
    assert str(error_of(tiny, ["curriculum.phases.middle.tol=0.1"])) == (
        "command line: curriculum.phases.middle.tol: no element 'middle' in this list (expected names bounded, free "
        "or an index below 2)")
    assert str(error_of(tiny, ["curriculum.phases[1].tol=0"])).startswith("command line: curriculum.phases[1].tol")


def test_a_solver_setting_that_the_phases_would_ignore_is_refused_wherever_it_is_written(tmp_path):
    """One source for the solver: with phases, implicit.max_iter/tol/phantom_steps are refused from the
    command line, a config file or a base, naming where and the phase key to set instead."""
    tiny = CONFIGS / "tiny/mamba2-implicit.yaml"
    assert str(error_of(tiny, ["implicit.tol=0.01"])) == (
        "command line: implicit.tol: every phase of the curriculum sets its own tol, so this value would be "
        "ignored; set it for a phase instead, e.g. curriculum.phases.free.tol (phases: bounded, free)")
    for key in ("max_iter=8", "phantom_steps=2"):
        assert "every phase of the curriculum sets its own" in str(error_of(tiny, [f"implicit.{key}"]))
    mine = write(tmp_path, "mine.yaml", f"base: {tiny}\nimplicit: {{max_iter: 8}}\n")
    error = error_of(mine)
    assert (error.source, error.key) == (str(mine), "implicit.max_iter")
    assert "curriculum.phases.free.max_iter" in str(error)
    base = write(tmp_path, "base.yaml", f"base: {CONFIGS / 'tiny/mamba2-explicit.yaml'}\n"
                                        "implicit: {enabled: true, phantom_steps: 2}\n")
    child = write(tmp_path, "child.yaml", f"base: {base}\n"
                                          "curriculum: {phases: [{name: only, kind: bounded, fraction: 1.0, "
                                          "max_iter: 4, phantom_steps: 1}]}\n")
    assert (error_of(child).source, error_of(child).key) == (str(base), "implicit.phantom_steps")
    cfg = load_config(tiny, ["curriculum.phases=[]", "implicit.tol=0.01", "implicit.damping=0.5"], check_files=False)
    assert cfg.implicit.tol == 0.01 and cfg.implicit.damping == 0.5  # no phases: the implicit keys rule


def test_phase_bounds_cover_all_steps():
    cfg = load_config(CONFIGS / "mamba2/130m-implicit.yaml")
    (bounded, b0, b1), (free, f0, f1) = phase_bounds(cfg)
    assert (b0, b1, f0, f1) == (0, round(0.8 * 197701), round(0.8 * 197701), 197701)
    assert (bounded.max_iter, bounded.phantom_steps, bounded.tol) == (4, 1, None)
    assert (free.max_iter, free.phantom_steps, free.tol) == (24, 4, 0.05)


@pytest.mark.processes
def test_cli_prints_config_or_exits_2():
    cmd = [sys.executable, "-m", "implicit_megatron.config"]
    ok = subprocess.run([*cmd, "configs/quickstart.yaml", "train.steps=70"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0 and "steps: 70" in ok.stdout
    bad = subprocess.run([*cmd, "configs/quickstart.yaml", "train.stepz=7"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "train.stepz" in bad.stderr and "command line" in bad.stderr
    got = subprocess.run([*cmd, "configs/quickstart.yaml", "tracking.uri=http://ours:5000", "--get", "output_dir",
                          "--get", "tracking.uri"], cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 0 and got.stdout == "runs/quickstart\nhttp://ours:5000\n"  # what launch/pretrain.sh reads
    bare = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert bare.returncode == 2 and "a config file is required" in bare.stderr
    assert "overrides are optional" in bare.stderr and "config, overrides" not in bare.stderr


@pytest.mark.processes
@pytest.mark.parametrize("command", [["implicit_megatron.config"], ["implicit_megatron.train"]])
def test_an_override_written_with_dashes_is_named_not_answered_with_the_usage(command):
    result = subprocess.run([sys.executable, "-m", *command, "configs/tiny/mamba2-implicit.yaml", "--train.steps=20"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "usage:" not in result.stderr
    assert result.stderr.strip().endswith("--train.steps=20: an override is key=value without leading dashes: "
                                          "train.steps=20")


@pytest.mark.processes
def test_train_help_names_config_overrides_and_the_reference():
    cmd = [sys.executable, "-m", "implicit_megatron.train"]
    shown = subprocess.run([*cmd, "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0
    for words in ("CONFIG", "key=value", "optional dotted overrides", "docs/config.md",
                  "python -m implicit_megatron.config"):
        assert words in shown.stdout, words
    bare = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert bare.returncode == 2 and "a config file is required" in bare.stderr


@pytest.mark.processes
def test_cli_checks_a_curriculum_of_launches_phase_by_phase():
    """The checker accepts what launch/curriculum.sh runs and shows each phase's launch settings."""
    cmd = [sys.executable, "-m", "implicit_megatron.config", "configs/tiny/mamba2-curriculum.yaml"]
    ok = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bounded, free = list(yaml.safe_load_all(ok.stdout))
    assert bounded["curriculum"]["run_phase"] == "bounded" and bounded["distributed"]["zero_stage"] == 2
    assert free["curriculum"]["run_phase"] == "free" and free["distributed"]["zero_stage"] == 3
    assert "# phase 'free'" in ok.stdout
    # the bounded phase launches 2 processes: its batch is checked for that data-parallel size
    bad = subprocess.run([*cmd, "train.global_batch_size=12"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "train.global_batch_size" in bad.stderr and "4 x 2 = 8" in bad.stderr
    one = subprocess.run([*cmd, "curriculum.run_phase=free"], cwd=ROOT, capture_output=True, text=True)
    assert one.returncode == 0 and yaml.safe_load(one.stdout)["distributed"]["zero_stage"] == 3


def test_missing_required_key_and_impossible_values():
    phases = "[{name: a, kind: bounded, max_iter: 4, phantom_steps: 1}]"
    err = error_of(CONFIGS / "tiny/mamba2-implicit.yaml", [f"curriculum.phases={phases}"])
    assert err.key == "curriculum.phases[0]" and "missing required key(s) fraction" in err.message
    for override, key in (("optimizer.lr=.nan", "optimizer.lr"), ("schedule.min_lr=-1.0", "schedule.min_lr"),
                          ("checkpoint.interval=0", "checkpoint.interval"), ("data.prefixes=[]", "data.prefixes"),
                          ("distributed.zero_stage=true", "distributed.zero_stage"),
                          ("train.eval_samples=-1", "train.eval_samples")):
        assert error_of(CONFIGS / "tiny/mamba2-implicit.yaml", [override]).key == key, override
    short = error_of(CONFIGS / "tiny/mamba2-implicit.yaml", ["train.steps=2", "schedule.warmup_steps=1"])
    assert (short.source, short.key) == ("command line", "curriculum.phases[1].fraction")  # train.steps did it
    assert "phase 'free' gets no step of train.steps 2" in short.message


@pytest.mark.processes  # preprocesses a corpus with another tokenizer
def test_an_error_an_override_causes_names_the_command_line(shakespeare_shards, tmp_path):
    """A check over a key set in the YAML fails because of an override: the override is named, not the
    file, and the keys an unknown key's message lists are only those a config may set."""
    tiny = CONFIGS / "tiny/mamba2-implicit.yaml"
    fractions = error_of(tiny, ["curriculum.phases.bounded.fraction=0.9"])
    assert (fractions.source, fractions.key) == ("command line", "curriculum.phases")
    assert "fractions must add up to 1, got 1.1" in fractions.message
    unknown = error_of(tiny, ["source=elsewhere.yaml"])
    assert unknown.key == "source" and "unknown key" in unknown.message
    assert "sources" not in unknown.message and unknown.message.endswith("checkpoint, tracking, train")

    from data_pipeline.train_tokenizer import iter_texts, train_byte_bpe

    other = train_byte_bpe(iter_texts([str(ROOT / "data/corpus/shakespeare.jsonl.zst")], limit_docs=20), 400,
                           str(tmp_path / "other.json"))
    prefix = tmp_path / "other" / "bpe"
    subprocess.run([sys.executable, "-m", "data_pipeline.preprocess", "--input", "data/corpus/shakespeare.jsonl.zst",
                    "--tokenizer", other, "--output-prefix", str(prefix), "--workers", "0", "--quiet",
                    "--append-eod", "--limit-docs", "40"], cwd=ROOT, check=True, capture_output=True)
    mixed = error_of(tiny, [f"data.prefixes=[{shakespeare_shards},{prefix}]", "data.source=null"], check_data=True)
    assert (mixed.source, mixed.key) == ("command line", "data.tokenizer")  # the prefix set there did it
    assert f"is not the tokenizer the shards {prefix}_* were built with" in mixed.message


def test_a_tokenizer_that_is_not_the_shards_one_is_refused_by_name(shakespeare_shards, tmp_path):
    import json
    import lzma

    tiny = CONFIGS / "tiny/mamba2-implicit.yaml"
    data = [f"data.prefixes=[{shakespeare_shards}]", "data.source=null"]
    raw = lzma.decompress((ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz").read_bytes())
    copy = tmp_path / "bpe.json"
    copy.write_bytes(raw)  # the same vocabulary in another file: accepted
    load_config(tiny, [*data, f"data.tokenizer={copy}"], check_data=True)
    other = json.loads(raw)
    vocab = other["model"]["vocab"]
    vocab["the"], vocab["The"] = vocab["The"], vocab["the"]
    changed = tmp_path / "other.json"
    changed.write_text(json.dumps(other))
    error = error_of(tiny, [*data, f"data.tokenizer={changed}"], check_data=True)
    assert error.source == "command line" and error.key == "data.tokenizer"
    assert str(changed) in error.message and "data/tokenizers/shakespeare-bpe-1000.json.xz" in error.message
    assert f"{shakespeare_shards}_stats.json" in error.message and "allow_tokenizer_mismatch" in error.message
    load_config(tiny, [*data, f"data.tokenizer={changed}", "data.allow_tokenizer_mismatch=true"], check_data=True)


def test_a_run_folder_that_cannot_be_made_is_refused_naming_the_key(tmp_path):
    """A file where the run folder should be: one line naming the key, before any process starts
    (a read-only file system gives the same line with its cause; tests/e2e/test_read_only_data.py)."""
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match=rf"command line: train.output_dir: the run folder {tmp_path / 'a-file'}: "
                                          "exists and is not a folder"):
        load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [f"train.output_dir={tmp_path / 'a-file'}"])
    with pytest.raises(ConfigError, match=rf"the run folder {tmp_path / 'a-file' / 'run'}: {tmp_path / 'a-file'} is a "
                                          "file, not a folder"):
        load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [f"train.output_dir={tmp_path / 'a-file' / 'run'}"])


def test_a_run_folder_that_is_a_link_or_inside_another_run_is_refused_naming_the_key(tmp_path):
    """A link as train.output_dir was followed for a new run (as root, a link to / wrote the run
    there); a folder inside another run's checkpoint tag was accepted, and that run's resume then
    refused its own tag."""
    tiny = ROOT / "configs/tiny/mamba2-implicit.yaml"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=rf"train.output_dir: the run folder {tmp_path / 'link'}: is a symbolic "
                                          rf"link \(to {tmp_path / 'elsewhere'}\): a run writes into its own folder "
                                          rf"only; name the folder itself, train.output_dir={tmp_path / 'elsewhere'}$"):
        load_config(tiny, [f"train.output_dir={tmp_path / 'link'}"])
    other = tmp_path / "other-run"
    (other / "checkpoints" / "bounded-step6").mkdir(parents=True)
    (other / "checkpoints" / "latest").write_text("bounded-step6\n")
    inside = other / "checkpoints" / "bounded-step6" / "mine"
    with pytest.raises(ConfigError, match=rf"the run folder {inside}: lies inside {other}, the folder of another run "
                                          r"\(it holds checkpoints/latest\): a run folder holds one run's files"):
        load_config(tiny, [f"train.output_dir={inside}"])
    (other / "metrics.jsonl").write_text("")  # a run before its first checkpoint
    (other / "checkpoints" / "latest").unlink()
    with pytest.raises(ConfigError, match=r"\(it holds metrics.jsonl\)"):
        load_config(tiny, [f"train.output_dir={other / 'sub'}"])
    load_config(tiny, [f"train.output_dir={tmp_path / 'elsewhere'}"])  # the folder itself, beside the other run
    load_config(tiny, [f"train.output_dir={other}"])  # the run's own folder: a resume


@pytest.mark.processes
def test_a_relative_path_that_is_not_found_says_where_it_was_looked_for(tmp_path):
    """Paths in a config are taken from the working directory (launch/pretrain.sh runs from the
    repository root); run from elsewhere, the error says which directory that was."""
    result = subprocess.run([sys.executable, "-m", "implicit_megatron.config", str(ROOT / "configs/quickstart.yaml")],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"config error: {ROOT / 'configs/quickstart.yaml'}: data.tokenizer: "
                                     "tokenizer not found: data/tokenizers/gpt-neox-20b.json.xz (a relative path: "
                                     f"looked for from the working directory {tmp_path})")


def test_the_config_reference_is_up_to_date():
    """docs/config.md is written from the schema (every key, type, default, meaning and the paper's
    value); a key added, removed or re-documented without regenerating it fails here."""
    from implicit_megatron.config import reference

    page = ROOT / "docs" / "config.md"
    assert page.read_text() == reference.render(), "run: python -m implicit_megatron.config.reference"
    keys = {line.split("`")[1] for line in page.read_text().splitlines() if line.startswith("| `")}
    assert {"implicit.tol", "data.index_cache", "checkpoint.accept_foreign_checkpoint",
            "curriculum.phases[i].tol", "train.exit_after_minutes"} <= keys
    assert all(line.rstrip().endswith(" |") and not line.rstrip().endswith("|  |")
               for line in page.read_text().splitlines() if line.startswith("| `")), "a key without a meaning"


@pytest.mark.parametrize("key, value", [("train.output_dir", '"runs/a\\nfree\\ttodo"'),
                                        ("data.prefixes", '["data/a", "data/b\\rc"]'),
                                        ("data.tokenizer", '"tok\\u001b[2J.json"'),
                                        ("curriculum.phases.free.launch.hostfile", '"hosts\\tx"')])
def test_a_control_character_in_any_value_is_refused_naming_its_key(key, value):
    """Paths and names reach launch scripts that read rows and build command lines."""
    err = error_of(CONFIGS / "tiny" / "mamba2-curriculum.yaml", [f"{key}={value}"], check_files=False)
    assert "holds a control character" in str(err) and key.split(".")[0] in str(err), err
