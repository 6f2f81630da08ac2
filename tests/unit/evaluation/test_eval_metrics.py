"""Perplexity, extrapolation, dynamics and duality on the tiny trained model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from implicit_megatron.evaluation.perplexity import position_buckets
from implicit_megatron.evaluation.phases import SolverChoice
from implicit_megatron.evaluation.runner import EvalOptions, run_evaluation


@pytest.fixture(scope="module")
def results(tiny_run, shakespeare_shards, tmp_path_factory):
    options = EvalOptions(model=str(tiny_run.export), data=shakespeare_shards, seq_lens=[64, 128], batch_size=4,
                          max_windows=8, sequential_windows=4, position_buckets=8,
                          tasks=["ppl", "extrapolation", "dynamics", "duality"],
                          solver=SolverChoice(tol=1e-4, max_iter=200),
                          output=str(tmp_path_factory.mktemp("eval-out")))
    return run_evaluation(options, log=lambda message: None)


def test_perplexity_is_exp_of_the_mean_token_nll(results, tiny_run, shakespeare_shards):
    """Recomputed here with a plain loop over the same packed test windows and the same batches."""
    from data_pipeline.packed import build_packed_dataset
    from implicit_megatron import from_pretrained
    from implicit_megatron.evaluation.phases import apply_solver

    model = from_pretrained(tiny_run.export)
    apply_solver(model, results["model"]["solver"])
    test = build_packed_dataset([shakespeare_shards], None, "test", 64, seed=1234)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, 8, 4):
            batch = torch.stack([torch.from_numpy(test[i]) for i in range(start, start + 4)])
            logits = model(batch[:, :-1])
            total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
            count += batch[:, 1:].numel()
    assert results["ppl"]["tokens"] == count == 8 * 64
    assert results["ppl"]["ppl"] == pytest.approx(math.exp(total / count), rel=1e-5)


def test_extrapolation_reports_every_length_and_position_bucket(results):
    lengths = results["extrapolation"]["lengths"]
    assert sorted(lengths, key=int) == ["64", "128"]
    assert lengths["64"]["ppl"] == pytest.approx(results["ppl"]["ppl"])
    buckets = lengths["128"]["positions"]
    assert [b["start"] for b in buckets] == list(range(0, 128, 16)) and buckets[-1]["end"] == 128
    # the buckets split every window's positions into eight equal parts: their mean log-perplexity is
    # the length's (a bucket scoring the wrong positions, or one left out, breaks the equality)
    mean_nll = sum(math.log(b["ppl"]) for b in buckets) / len(buckets)
    assert math.exp(mean_nll) == pytest.approx(lengths["128"]["ppl"], rel=1e-9)
    assert len({round(b["ppl"], 6) for b in buckets}) == len(buckets)  # positions differ, so do their scores


def test_dynamics_reports_passes_and_residual(results):
    dynamics = results["dynamics"]
    assert 1 <= dynamics["mean_passes"] <= 200 and dynamics["phantom_steps"] == 4
    assert dynamics["residual"] < 1e-4 and dynamics["converged_frac"] == 1.0
    assert dynamics["sequential_mean_passes"] >= 1 and len(dynamics["passes_per_position"]) == 8


def test_both_modes_agree_on_a_converging_model(results):
    duality = results["duality"]
    assert duality["tokens"] == 4 * 64
    assert duality["match_rate"] >= 0.99
    assert abs(duality["ppl_difference"]) < 1e-2 * duality["ppl_simultaneous"]


def test_files_are_written(results):
    names = {p.rsplit("/", 1)[-1] for p in results["files"]}
    assert names == {"results.json", "results.md", "per_position_ppl.png", "iterations_per_token.png",
                     "duality.png"}


def test_position_buckets_average_nll_before_exponentiating():
    nll = torch.tensor([[1.0, 2.0, 3.0, 5.0], [3.0, 2.0, 1.0, 1.0]], dtype=torch.float64)
    buckets = position_buckets(nll, 2)
    assert [(b["start"], b["end"]) for b in buckets] == [(0, 2), (2, 4)]
    assert buckets[0]["ppl"] == pytest.approx(math.exp(2.0)) and buckets[1]["ppl"] == pytest.approx(math.exp(2.5))


def test_outputs_that_meet_a_file_size_limit_are_named_and_leave_no_cut_file(results, tmp_path):
    """`ulimit -f` (a full disk says the same) while the plots are written: one error naming the plot
    and what was written whole before it; the plot there before kept (PIL removes the file it could
    not finish, so a plot written in place would be lost), no temporary file left."""
    import resource

    from implicit_megatron.evaluation.runner import OutputNotWritten, write_outputs

    (tmp_path / "per_position_ppl.png").write_bytes(b"the plot from before")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (12 * 1024, hard))  # the text fits, a plot does not
    try:
        with pytest.raises(OutputNotWritten) as refused:
            write_outputs(results, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(refused.value).startswith(f"{tmp_path / 'per_position_ppl.png'}: not written (OSError: ")
    assert str(refused.value).endswith("; written whole before it: results.json, results.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["per_position_ppl.png", "results.json", "results.md"]
    assert (tmp_path / "per_position_ppl.png").read_bytes() == b"the plot from before"
