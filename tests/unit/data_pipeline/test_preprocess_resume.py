"""A run killed mid-way leaves no process behind, and rerun with the same arguments gives the bytes of
an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.processes import process_running

INPUTS = 16


def finished_parts(work) -> list:
    """Inputs renamed into place (a `tmp-` folder may already hold its done.json)."""
    return [p for p in work.iterdir() if not p.name.startswith("tmp-") and (p / "done.json").is_file()]


@pytest.mark.processes
def test_killed_run_resumes_to_identical_shards(tmp_path, corpus, neox_path, write_jsonl, run_cli, output_bytes):
    documents = corpus[:400]
    per_input = len(documents) // INPUTS
    inputs = [str(write_jsonl(tmp_path / "in" / f"part-{k:02d}.jsonl", documents[k * per_input:(k + 1) * per_input]))
              for k in range(INPUTS)]
    arguments = ["--input", *inputs, "--tokenizer", neox_path, "--append-eod", "--valid-fraction", "0.05",
                 "--test-fraction", "0.05", "--max-shard-tokens", "200000", "--workers", "1", "--quiet"]

    reference = tmp_path / "reference" / "neox"
    run_preprocess(PreprocessConfig(inputs=inputs, tokenizer=neox_path, output_prefix=str(reference),
                                    append_eod=True, valid_fraction=0.05, test_fraction=0.05,
                                    max_shard_tokens=200000, workers=0, progress=False))

    prefix = tmp_path / "resumed" / "neox"
    work = tmp_path / "resumed" / "neox.work"
    process = subprocess.Popen([sys.executable, "-m", "data_pipeline.preprocess", *arguments,
                                "--output-prefix", str(prefix)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (work.is_dir() and finished_parts(work)):
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no input finished in time"
        time.sleep(0.005)
    helpers = psutil.Process(process.pid).children(recursive=True)  # forkserver, worker, resource tracker
    assert any("forkserver" in " ".join(p.cmdline()) for p in helpers)
    os.kill(process.pid, signal.SIGKILL)  # the main process alone, as a scheduler or the OOM killer would
    process.wait()
    process.stderr.close()
    deadline = time.monotonic() + 20
    while any(process_running(p.pid) for p in helpers):  # nothing it started outlives it
        assert time.monotonic() < deadline, [(p.pid, p.cmdline()) for p in helpers if process_running(p.pid)]
        time.sleep(0.1)

    finished = finished_parts(work)
    assert 1 <= len(finished) < INPUTS, "the kill should land mid-run"
    assert not (tmp_path / "resumed" / "neox_stats.json").exists()
    assert output_bytes(str(prefix)) == {}, "nothing may sit under a final name before the run completes"

    reused_tokens = sum(json.loads((part / "done.json").read_text())["counts"]["tokens"] for part in finished)
    result = run_cli("data_pipeline.preprocess", *arguments, "--output-prefix", str(prefix))
    assert result.returncode == 0, result.stderr
    assert f"resuming {prefix}: {len(finished)} of {INPUTS} inputs were finished by an earlier run" in result.stderr
    assert " documents, " in result.stderr  # the summary line, under --quiet too
    stats = json.loads((tmp_path / "resumed" / "neox_stats.json").read_text())
    assert stats["inputs_reused"] == len(finished)
    assert stats["documents"] == len(documents)
    # the rate is this run's own work over its wall time: reused inputs took no time and add nothing
    assert stats["tokens_per_second"] == pytest.approx((stats["tokens"] - reused_tokens) / stats["wall_seconds"])
    resumed, expected = output_bytes(str(prefix)), output_bytes(str(reference))
    assert len(expected) > 6  # several shards per split
    assert resumed == expected
    assert not work.exists()


def test_a_work_folder_a_kill_left_after_the_stats_is_removed_by_the_next_run(tmp_path, corpus, neox_path,
                                                                                write_jsonl):
    """Killed between writing its stats and removing its work folder: the shards are complete, and
    the next run with the same arguments says so and removes the folder (it was left forever)."""
    source = write_jsonl(tmp_path / "docs.jsonl", corpus[:20])
    config = PreprocessConfig(inputs=[str(source)], tokenizer=neox_path, output_prefix=str(tmp_path / "neox"),
                              append_eod=True, workers=0, progress=False)
    first = run_preprocess(config)
    (tmp_path / "neox.work" / "00000-leftover").mkdir(parents=True)
    assert run_preprocess(config) == first
    assert not (tmp_path / "neox.work").exists()
