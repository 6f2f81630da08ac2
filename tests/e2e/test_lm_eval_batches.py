"""lm-eval scores do not move with the batch size: the `lm_eval` command line on an exported folder
(transformers' model, right padding without a mask) and tools/evaluate.py (the package's lm-eval
model, padding masked) give each request the same log-likelihood at batch 1 and 4, on requests of
different lengths. The released batch-wide rule, which moves them, is there when named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.processes import ROOT, child_env
from support.tiny_exports import write_tiny_export
from support.tools import load_tool

TASKS = "tests/unit/evaluation/fixtures/lm_eval"  # 4 LAMBADA-shaped lines and 3 two-choice questions
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A tiny implicit Mamba2 whose sequences stop after different passes (tol 0.05)."""
    return write_tiny_export("mamba2-implicit", tmp_path_factory.mktemp("lm-eval-batches"), tol=0.05,
                             scales=(0.5, 3.0, 3.0))


def scores_of(samples) -> dict:
    """{(task text, doc, choice): log-likelihood} of lm-eval's samples (logged or returned)."""
    scores = {}
    for sample in samples:
        for choice, response in enumerate(sample["resps"]):
            scores[(sample["doc"].get("text", ""), sample["doc_id"], choice)] = float(response[0][0])
    assert len(scores) == 10
    return scores


def lm_eval_cli(export, out, batch_size: int) -> dict:
    """The scores of lm-eval's own `lm_eval` command line, from its logged samples: it cannot import
    the package, so it loads the folder's modeling file (trust_remote_code)."""
    result = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                             f"pretrained={export},trust_remote_code=True", "--tasks",
                             "tiny_lambada,tiny_piqa", "--include_path", TASKS, "--batch_size", str(batch_size),
                             "--device", "cpu", "--log_samples", "--output_path", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=child_env(**OFFLINE))
    assert result.returncode == 0, result.stderr[-3000:]
    logged = (line for path in out.rglob("samples_*.jsonl") for line in path.read_text().splitlines())
    return scores_of(json.loads(line) for line in logged)


def lm_eval_api(export, batch_size: int, *model_args: str) -> dict:
    """The same scores through lm-eval's evaluator in this process (the package imported: its Auto
    classes load the folder, none of the folder's code runs), with this test's tasks only."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import implicit_megatron  # noqa: F401 - registers the exported model with transformers' Auto classes

    out = simple_evaluate(model="hf", model_args=",".join([f"pretrained={export}", *model_args]),
                          tasks=["tiny_lambada", "tiny_piqa"], batch_size=batch_size, device="cpu", log_samples=True,
                          task_manager=TaskManager(include_path=TASKS, include_defaults=False),
                          random_seed=None, numpy_random_seed=None, torch_random_seed=None,  # the suite's own seeds
                          bootstrap_iters=0)  # no stderr: its bootstrap forks a pool from this threaded process
    return scores_of(sample for samples in out["samples"].values() for sample in samples)


def largest_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[k] - b[k]) for k in a)


def test_the_lm_eval_command_line_scores_each_request_as_alone(export, tmp_path):
    """Ours at batch 1, lm-eval's own command line (the folder's modeling file) at batch 4: the same
    scores; the batch-wide stop rule at batch 4 moves them."""
    one = lm_eval_api(export, 1)
    assert largest_gap(one, lm_eval_cli(export, tmp_path / "plain", 4)) < 1e-5
    assert largest_gap(one, lm_eval_api(export, 4, "eval_stop=batch")) > 1e-4


def evaluate(export, out, batch_size: int, *options: str, command: bool = False) -> dict:
    """tools/evaluate.py's lm-eval scores: as a command, or its main() in this process."""
    argv = [str(export), "--tasks", "lm_eval", "--lm-eval-tasks", "tiny_lambada", "--lm-eval-include", TASKS,
            "--batch-size", str(batch_size), "--output", str(out), *options]
    if command:
        result = subprocess.run([sys.executable, "tools/evaluate.py", *argv], cwd=ROOT, capture_output=True, text=True,
                                timeout=300, env=child_env(**OFFLINE))
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        assert load_tool("evaluate").main(argv) == 0
    return json.loads((out / "results.json").read_text())["lm_eval"]["tasks"]["tiny_lambada"]


def test_tools_evaluate_scores_do_not_move_with_the_batch_size(export, tmp_path):
    one = evaluate(export, tmp_path / "b1", 1)["perplexity"]
    four = evaluate(export, tmp_path / "b4", 4, command=True)["perplexity"]
    assert abs(one - four) / one < 1e-5
    named = evaluate(export, tmp_path / "batch-rule", 4, "--eval-stop", "batch")["perplexity"]
    assert abs(one - named) / one > 1e-5


def readme_block(language: str, needle: str) -> str:
    import re

    blocks = re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return next(block for block in blocks if needle in block)


def test_the_readmes_transformers_and_lm_eval_examples_run_as_written(export, tmp_path):
    """The README's examples with the quickstart's export replaced by this one, nothing else (on this
    machine without a GPU: the package's lm-eval model, asked for lm-eval's default cuda:0, runs)."""
    snippet = readme_block("python", "AutoModelForCausalLM").replace("runs/quickstart/export", str(export))
    result = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=child_env(**OFFLINE))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ROMEO:")
    command = readme_block("bash", "implicit_megatron.lm_eval --model hf")
    command = command.replace("runs/quickstart/export", str(export)).replace(".venv/bin/python", sys.executable)
    command = command.replace("\\\n", " ")
    result = subprocess.run(["bash", "-ec", command], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=child_env(**OFFLINE))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("tiny_lambada") >= 2 and "perplexity" in result.stdout  # both models scored
    # lm-eval asks for cuda:0 unless told: the package's model says it runs on the CPU instead
    assert "no GPU here, so the model runs on the CPU (device cuda:0 was asked for" in result.stderr
