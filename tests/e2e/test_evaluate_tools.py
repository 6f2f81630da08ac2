"""tools/evaluate.py and tools/generate.py as a user runs them, on the tiny trained model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ROOT, child_env

TASKS = "tests/unit/evaluation/fixtures/lm_eval"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The released Llama fixture (64 tokens) as our model folder, with a tokenizer of its size: a model in
    seconds, no training."""
    from support.word_tokenizer import write_word_tokenizer

    out = tmp_path_factory.getbasetemp() / "imported-released-llama"
    words = write_word_tokenizer(tmp_path_factory.getbasetemp() / "words-64" / "tokenizer.json", 64)
    made = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "import", "tests/fixtures/released/llama",
                           str(out), "--tokenizer", str(words)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env=child_env())
    assert made.returncode == 0, made.stderr[-3000:]
    return out


def tool(name: str, *args: str, timeout: int = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"tools/{name}.py", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env=child_env(**{"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **env}))


def test_every_task_writes_its_files_and_logs_to_mlflow(tiny_run, shakespeare_shards, tmp_path):
    out = tmp_path / "eval"
    result = tool("evaluate", tiny_run.checkpoints, "--data", shakespeare_shards, "--tasks",
                  "ppl,extrapolation,dynamics,duality,lm_eval", "--seq-lens", "64,128", "--max-windows", "4",
                  "--sequential-windows", "2", "--batch-size", "2", "--lm-eval-tasks", "tiny_lambada,tiny_piqa",
                  "--lm-eval-include", TASKS, "--output", out, "--run", tiny_run.run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "## Length extrapolation (Table 8 layout)" in result.stdout
    assert "Setting accelerator to CPU" not in result.stderr and "CUDA graphs off" not in result.stderr
    for length in (64, 128):  # a progress bar per length, closed at all of its windows
        assert f"[evaluate] length {length}: 100%" in result.stderr and "4/4 [" in result.stderr
    files = {p.name for p in out.iterdir()}
    assert files == {"results.json", "results.md", "per_position_ppl.png", "iterations_per_token.png", "duality.png"}
    assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in files if name.endswith(".png"))
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["tag"] == "free-step30" and results["model"]["solver"]["label"] == "(24+4)"
    assert set(results["lm_eval"]["tasks"]) == {"tiny_lambada", "tiny_piqa"}
    table = (out / "results.md").read_text()
    assert "tiny_lambada acc" in table and "Greedy match" in table and "Inference steps" in table

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(tiny_run.run_dir).resolve() / 'mlflow.db'}")
    run_id = results["mlflow_run_id"]  # a new run named tiny-eval-eval: the folder had none
    assert client.get_run(run_id).info.run_name == "tiny-eval-eval"
    metrics = client.get_run(run_id).data.metrics
    assert metrics["eval/ppl"] == pytest.approx(results["ppl"]["ppl"])
    assert "eval/duality/match_rate" in metrics and "eval/tiny_piqa/acc" in metrics
    assert {a.path for a in client.list_artifacts(run_id, "evaluation")} >= {"evaluation/results.md"}


def test_greedy_generation_prints_passes_per_token(tiny_run):
    result = tool("generate", tiny_run.export, "--prompt", "ROMEO:", "--max-new-tokens", "5", "--temperature", "0",
                  "--ignore-eod", "--verbose")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ROMEO:")
    per_token = [line for line in result.stderr.splitlines() if line.startswith("[generate] token")]
    assert len(per_token) == 5 and all("passes" in line for line in per_token)
    assert "solver passes per token on average" in result.stderr


def test_several_prompts_generate_together_as_each_alone(tiny_run, tmp_path):
    """Three prompts of different lengths (two --prompt, one line of --prompts-file), batched:
    each gets the greedy tokens it gets alone."""
    from implicit_megatron.evaluation.generation import SamplingConfig, generate
    from implicit_megatron.evaluation.loading import load_model

    prompts = ["ROMEO:", "HAMLET: To be, or not to be,", "JULIET: O"]
    (tmp_path / "prompts.txt").write_text(prompts[2] + "\n")
    result = tool("generate", tiny_run.export, "--prompt", prompts[0], "--prompt", prompts[1], "--prompts-file",
                  tmp_path / "prompts.txt", "--max-new-tokens", "6", "--temperature", "0", "--ignore-eod",
                  "--batch-size", "3", "--jsonl")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == prompts
    loaded = load_model(tiny_run.export)
    for row, prompt in zip(rows, prompts, strict=True):
        alone = generate(loaded.model, loaded.tokenizer.encode(prompt), SamplingConfig(6, 0.0, stop_at_eod=False))
        assert row["new_tokens"] == alone.new_ids and row["passes_per_token"] == alone.passes
    plain = tool("generate", tiny_run.export, "--prompt", prompts[0], "--prompt", prompts[2], "--max-new-tokens",
                 "2", "--temperature", "0")
    assert plain.returncode == 0 and plain.stdout.count("\n----\n") == 1, plain.stderr[-3000:]
    missing = tool("generate", tiny_run.export, "--prompts-file", tmp_path / "none.txt")
    assert missing.returncode == 2 and "--prompts-file" in missing.stderr and "Traceback" not in missing.stderr


def test_a_negative_temperature_is_refused(tiny_run):
    result = tool("generate", tiny_run.export, "--prompt", "x", "--temperature", "-1")
    assert result.returncode == 2 and "--temperature must be 0 (greedy) or positive, got -1.0" in result.stderr


def test_a_path_that_is_no_model_is_refused(tmp_path, shakespeare_shards):
    (tmp_path / "notes.txt").write_text("not a model")
    for name in ("evaluate", "generate"):
        args = ["--data", shakespeare_shards] if name == "evaluate" else ["--prompt", "x"]
        result = tool(name, tmp_path, *args)
        assert result.returncode == 2
        assert "neither a checkpoint folder" in result.stderr and "Traceback" not in result.stderr


def test_a_missing_model_is_named_before_the_options_it_would_need(tmp_path):
    result = tool("evaluate", tmp_path / "missing" / "export", "--tasks", "ppl")  # no --data either
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"evaluate: {tmp_path / 'missing' / 'export'}: no such file or directory"


def test_a_missing_data_prefix_is_refused(tiny_run, tmp_path):
    result = tool("evaluate", tiny_run.export, "--data", tmp_path / "neox", "--tasks", "ppl")
    assert result.returncode == 2
    assert "no test shards for prefix" in result.stderr and "Traceback" not in result.stderr


def test_data_beyond_the_models_vocabulary_is_refused_naming_both(shakespeare_shards, imported, tmp_path):
    """The released fixture (64 tokens), imported with a tokenizer of its size, then evaluated on shards
    of a 1000-token BPE (another tokenizer, allowed: the token ids are what is refused). A folder whose
    tokenizer was swapped for GPT-NeoX's (50,277 ids) is refused at load: ids past the model's vocabulary."""
    import lzma
    import shutil

    swapped = Path(shutil.copytree(imported, tmp_path / "swapped"))
    (swapped / "tokenizer.json").write_bytes(lzma.decompress((ROOT / "data/tokenizers/gpt-neox-20b.json.xz")
                                                             .read_bytes()))
    refused = tool("evaluate", swapped, "--data", shakespeare_shards, "--tasks", "ppl", "--seq-lens", "16",
                   "--max-windows", "4", "--allow-tokenizer-mismatch")
    assert refused.returncode == 2 and refused.stderr == (
        f"evaluate: {swapped / 'tokenizer.json'}: token ids up to 50276, past the model's vocabulary of 64 "
        "(model.vocab_size): not this model's tokenizer, or a damaged one\n")
    assert json.loads((imported / "config.json").read_text())["implicit_megatron"]["name"] == "llama"
    result = tool("evaluate", imported, "--data", shakespeare_shards, "--tasks", "ppl", "--seq-lens", "16",
                  "--max-windows", "4", "--allow-tokenizer-mismatch")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"--data {shakespeare_shards}, tokenized with {ROOT}/data/tokenizers/shakespeare-bpe-1000.json.xz " \
           "(1000 tokens) holds token id" in result.stderr, result.stderr[-3000:]  # the stats' path: absolute
    assert f"beyond the vocabulary of the model {imported} (64 tokens)" in result.stderr


def test_lm_eval_without_its_data_offline_names_what_is_missing_in_one_line(imported, tmp_path):
    """The paper's tasks with downloads off and an empty cache: refused before the model loads."""
    empty = tmp_path / "hf"
    result = tool("evaluate", imported, "--tasks", "lm_eval", "--output", tmp_path / "eval", HF_HOME=str(empty),
                  HF_DATASETS_CACHE=str(empty / "datasets"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("evaluate: lm_eval cannot get the data of 7 task(s): lambada_openai "
                           "(EleutherAI/lambada_openai, default: not in the local cache); hellaswag (Rowan/hellaswag")
    assert "winogrande (allenai/winogrande, winogrande_xl: not in the local cache)" in line
    assert f"downloads are off (HF_DATASETS_OFFLINE=1), and the data set cache HF_DATASETS_CACHE={empty / 'datasets'}" \
        " does not hold them" in line and "--lm-eval-include" in line
    assert not (tmp_path / "eval").exists()


def test_an_output_that_cannot_be_written_is_refused_before_the_work(tiny_run, shakespeare_shards, tmp_path):
    """A file where a folder is asked for, or a folder where a file is: one line, before anything is
    evaluated, drawn or converted."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    evaluated = tool("evaluate", tiny_run.checkpoints, "--data", shakespeare_shards, "--tasks", "ppl",
                     "--output", a_file)
    assert evaluated.returncode == 2 and evaluated.stderr.strip().splitlines() == [
        f"evaluate: --output {a_file}: exists and is not a folder"]
    converted = tool("convert_checkpoint", "export", tiny_run.run_dir, a_file)
    assert converted.returncode == 2 and converted.stderr.strip().splitlines() == [
        f"convert_checkpoint: {a_file}: exists and is not a folder"]
    drawn = tool("plot_run", tiny_run.run_dir, "--output", a_file / "curves.png")
    assert drawn.returncode == 2 and f"--output {a_file / 'curves.png'}: {a_file} is a file, not a folder" in \
        drawn.stderr and "Traceback" not in drawn.stderr


def test_export_takes_the_run_folder_as_evaluate_does(tiny_run, tmp_path):
    result = tool("convert_checkpoint", "export", tiny_run.run_dir, tmp_path / "export")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "export" / "model.safetensors").is_file()
    assert "Setting accelerator to CPU" not in result.stderr + result.stdout  # DeepSpeed told, not guessing


def test_shards_of_another_tokenizer_are_refused_naming_both(tiny_run, tmp_path):
    """Training refuses shards built with another tokenizer than the run's; evaluation does too."""
    from data_pipeline.train_tokenizer import iter_texts, train_byte_bpe

    other = train_byte_bpe(iter_texts(["data/corpus/shakespeare.jsonl.zst"], limit_docs=20), 400,
                           str(tmp_path / "other.json"))
    prefix = tmp_path / "other" / "bpe"
    made = subprocess.run([sys.executable, "-m", "data_pipeline.preprocess", "--input",
                           "data/corpus/shakespeare.jsonl.zst", "--tokenizer", other, "--output-prefix", str(prefix),
                           "--workers", "0", "--quiet", "--append-eod", "--test-fraction", "0.2", "--limit-docs", "40"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=child_env())
    assert made.returncode == 0, made.stderr[-3000:]
    refused = tool("evaluate", tiny_run.export, "--data", prefix, "--tasks", "ppl", "--seq-lens", "32",
                   "--max-windows", "2")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"--data {prefix}: " in refused.stderr and f"{prefix}_stats.json names {other}" in refused.stderr
    assert "--allow-tokenizer-mismatch" in refused.stderr
    allowed = tool("evaluate", tiny_run.export, "--data", prefix, "--tasks", "ppl", "--seq-lens", "32",
                   "--max-windows", "2", "--allow-tokenizer-mismatch", "--output", tmp_path / "eval")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
