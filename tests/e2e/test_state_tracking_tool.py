"""tools/research/state_tracking.py end to end at toy size: explicit and implicit models (the implicit one by the
released recipe: an unrolled damped warm-up phase handing off to the DEQ phase in one run) train
through the launcher, are tested at two lengths, and the results page is written; a finished sweep
is not trained again (nor tested again), and a tighter test-time tolerance tests it again. Each run's
progress shows on stderr while it trains."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from support.processes import ROOT, child_env, free_port
from support.tools import load_tool


def sweep(out, page, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "tools/research/state_tracking.py", "--models", "explicit-1l,implicit", "--algebra", "Z2",
           "--seeds", "1", "--length", "8", "--test-lengths", "8,12", "--steps", "4", "--batch", "8",
           "--d-model", "32", "--test-words", "8", "--recipe", "released", "--output", str(out), "--page", str(page),
           "--sequential", "train.log_interval=1", "implicit.eval_max_iter=32", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=child_env(MASTER_PORT=str(free_port())), capture_output=True, text=True,
                          timeout=600)


def L12_accuracy(run) -> float:  # noqa: N802 - the set's name
    import torch

    from data_pipeline.synthetic.word_problem import generate
    from implicit_megatron.builder import build_model
    from implicit_megatron.hf.export import read_checkpoint

    tool = load_tool("state_tracking")
    args = tool.parse(["--algebra", "Z2", "--length", "8", "--test-lengths", "8,12", "--test-words", "8"])
    length, p, words = tool.test_sets(args)["L12"]
    inputs, labels = (torch.from_numpy(a.astype("int64")) for a in generate("Z2", words, length, p,
                                                                            tool.set_seed("L12")))
    state, cfg = read_checkpoint(run / "checkpoints")
    model = build_model(cfg)
    model.load_state_dict(state)
    model.eval()
    model.core.set_phase(eval_stop="batch")  # the tool's rule for its sets (the paper's); -own sets stop per word
    hits = 0
    with torch.no_grad():
        for start in range(0, words, args.eval_batch):
            logits = model(inputs[start:start + args.eval_batch])
            hits += int((logits[..., :model.vocab_size].argmax(-1) == labels[start:start + args.eval_batch]).sum())
    return hits / (words * length)


@pytest.mark.slow
def test_state_tracking_sweep(tmp_path):
    page = tmp_path / "docs" / "state_tracking.md"
    result = sweep(tmp_path / "runs", page)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| model | L8 | L12 | seq-L8 |" in result.stdout
    estimate = [line for line in result.stdout.splitlines() if line.startswith("[state_tracking] estimate:")]
    assert len(estimate) == 1 and "explicit-1l " in estimate[0] and "implicit " in estimate[0], estimate
    for model in ("explicit-1l", "implicit"):  # each run's progress while it trained, on stderr
        prefix = f"[state_tracking] {model} seed 0: step"
        shown = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
        assert [line.split(": ", 1)[1].split("  ")[0] for line in shown] == ["step 1/4", "step 4/4"], shown
    results = json.loads((tmp_path / "runs" / "Z2-L8-released" / "results.json").read_text())
    implicit, explicit = results["runs"]["implicit"]["0"], results["runs"]["explicit-1l"]["0"]
    assert explicit["L12"]["passes"] == 1 and 1 < implicit["L12"]["passes"] <= 32
    # Four steps teach parity nothing, so what is checked is that the table reports the model it
    # trained on the words it names: the final checkpoint, on the L12 set made again from its seed,
    # scored here by plain argmax, gives the table's accuracy.
    assert L12_accuracy(tmp_path / "runs" / "Z2-L8-released" / "implicit" / "seed0") == implicit["L12"]["accuracy"]
    run = tmp_path / "runs" / "Z2-L8-released" / "implicit" / "seed0"
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    steps = {r["step"]: r for r in rows if "train/loss" in r}
    assert steps[1]["solver/iterations"] == 0  # the warm-up: every pass backpropagated, none without gradient
    assert steps[4]["solver/iterations"] >= 1  # the DEQ phase after the handoff
    assert (run / "checkpoints" / "latest").read_text().strip() == "deq-step4"
    text = page.read_text()
    assert "## Z2-L8-released: Z2, trained at length 8" in text and "--recipe released" in text
    assert (page.parent / "state_tracking" / "Z2-L8-released-accuracy.png").is_file()
    assert (page.parent / "state_tracking" / "Z2-L8-released-runs.png").is_file() and "released-runs.png)" in text
    # Again with one more test length: nothing is trained, and only the new set is tested (the
    # others' words depend on their names alone, and their saved results are reused).
    again = sweep(tmp_path / "runs", page, "--test-lengths", "8,12,16", "--test-words", "8,16:4")
    assert again.returncode == 0 and again.stdout.count("not trained again") == 2
    assert "estimate:" not in again.stdout  # nothing left to train
    rerun = json.loads((tmp_path / "runs" / "Z2-L8-released" / "results.json").read_text())["runs"]
    for model, seeds in results["runs"].items():
        assert {k: v for k, v in rerun[model]["0"].items() if k != "L16"} == seeds["0"]
        assert rerun[model]["0"]["L16"]["words"] == 4
    # A tighter test-time tolerance: every set is tested again (its key holds the tolerance), the
    # implicit solve runs at least as many passes, and the page says at which tolerance. --own-stop
    # adds each set again, on the same words, with each word stopping on its own (-own).
    tight = sweep(tmp_path / "runs", page, "--test-tol", "0.0001", "--own-stop")
    assert tight.returncode == 0 and tight.stdout.count("not trained again") == 2
    strict = json.loads((tmp_path / "runs" / "Z2-L8-released" / "results.json").read_text())
    assert strict["settings"]["test_tol"] == 1e-4
    assert strict["runs"]["implicit"]["0"]["L12"]["passes"] >= implicit["L12"]["passes"]
    own = strict["runs"]["implicit"]["0"]["L12-own"]
    assert own["words"] == 8 and 1 <= own["passes"] <= 32
    assert strict["runs"]["explicit-1l"]["0"]["L12-own"]["passes"] == 1
    assert "| model | L8 | L8-own | L12 | L12-own | seq-L8 |" in tight.stdout
    saved = json.loads((tmp_path / "runs" / "Z2-L8-released" / "implicit" / "seed0" / "test_results.json").read_text())
    assert all(saved["sets"][name]["key"]["tol"] == 1e-4 for name in ("L8", "L12", "seq-L8"))
    assert "test-time tolerance 0.0001" in page.read_text()

    # A sweep stopped while the explicit run trained step 4 (its checkpoints come every tenth of the
    # steps: here every step) resumes when the same command runs again: step 4 alone is trained.
    checkpoints = tmp_path / "runs" / "Z2-L8-released" / "explicit-1l" / "seed0" / "checkpoints"
    last = (checkpoints / "latest").read_text().strip()
    earlier = max((p.name for p in checkpoints.iterdir() if p.is_dir() and p.name != last),
                  key=lambda name: int(name.rpartition("step")[2]))
    shutil.rmtree(checkpoints / last)
    (checkpoints / "latest").write_text(earlier + "\n")
    resumed = sweep(tmp_path / "runs", page, "--test-tol", "0.0001", "--own-stop")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"explicit-1l seed 0: training into {checkpoints.parent}, resuming from {earlier}" in resumed.stdout
    assert "estimate: explicit-1l " in resumed.stdout and resumed.stdout.count("not trained again") == 1
    shown = [line.split(": ", 1)[1].split("  ")[0] for line in resumed.stderr.splitlines()
             if line.startswith("[state_tracking] explicit-1l seed 0: step")]
    assert shown == ["step 4/4"], shown
    assert (checkpoints / "latest").read_text().strip() == last
