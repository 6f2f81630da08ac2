"""A save into a full filesystem stops the run with one line naming the folder and the cause, and
leaves `latest` on the previous complete checkpoint. The filesystem is a small tmpfs mounted in a
user namespace of the test's own (where the kernel allows unprivileged ones)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from support.processes import ROOT, can_mount_tmpfs, child_env, free_port, on_a_small_tmpfs, run_in_session

TINY = "configs/tiny/mamba2-implicit.yaml"
TAG_MB = 2  # one checkpoint of the tiny model (1.94 MB with its 1000-token embedding)


@pytest.mark.distributed
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_save_into_a_full_filesystem_fails_by_name_and_keeps_latest(nproc, shakespeare_shards, tmp_path):
    """Two processes under ZeRO-0: rank 0 alone writes the model states and fails, while rank 1 has
    nothing to write; both stop with the one line (they once waited for each other for ever)."""
    out = tmp_path / "out"
    out.mkdir()
    if not can_mount_tmpfs(out):
        pytest.skip("this kernel does not let an unprivileged user mount a tmpfs (no user namespaces)")
    launch = [sys.executable, "-m", "implicit_megatron.train"] if nproc == 1 else [  # as launch/pretrain.sh
        sys.executable, "-m", "implicit_megatron.train.process.torchrun", "--nnodes", "1",
        "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        "-m", "implicit_megatron.train"]
    train = [*launch, TINY, f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={out}",
             "train.steps=12", "checkpoint.interval=6", "train.eval_interval=100", "tracking.enabled=false",
             "distributed.zero_stage=0", "distributed.timeout_minutes=1"]  # a hang would end in a minute, unnamed
    inspect = (f"{sys.executable} -c \"from pathlib import Path; from implicit_megatron.checkpoints.integrity import "
               f"check_tag; f = Path('{out}/checkpoints'); tag = (f / 'latest').read_text().strip(); "
               f"check_tag(f / tag); print('LATEST', tag, sorted(p.name for p in f.iterdir()))\"")
    # room for one checkpoint, not for two: the save at the phase's end (step 10) runs out of space
    script = f"mount -t tmpfs -o size={int(TAG_MB * 1600)}k tmpfs {out} && {{ {' '.join(train)}; echo RC=$?; }}; " \
             f"{inspect}"
    started = time.monotonic()
    result = run_in_session(["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", script], timeout=300)
    assert "RC=0" not in result.stdout, result.stdout[-3000:]
    assert time.monotonic() - started < 240
    folder = out / "checkpoints"
    lines = [line for line in result.stderr.splitlines() if "could not be saved" in line]
    assert lines and lines[0].startswith("error on rank 0: CheckpointSaveError: "), result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "has not finished" not in result.stderr, result.stderr[-3000:]
    assert f"checkpoint bounded-step10 could not be saved into {folder}" in lines[0]
    assert "no space left on device" in lines[0].lower()
    assert f"'latest' still names {folder / 'bounded-step6'}" in lines[0]
    assert "LATEST bounded-step6 ['bounded-step6', 'latest', 'run_id']" in result.stdout  # complete; no partial left


@pytest.mark.distributed
def test_a_file_size_limit_names_the_file_that_met_it(shakespeare_shards, tmp_path):
    """`ulimit -f` (1000 KB) on two processes under ZeRO-0: rank 0's model states (1.9 MB with the
    optimizer's) meet the limit while rank 1 writes its small file; the line names rank 0's file and
    the limit, not the newest file of the folder (once rank 1's rng_rank1.pt, with torch's
    "unexpected pos" as the cause)."""
    out = tmp_path / "out"
    train = [sys.executable, "-m", "implicit_megatron.train.process.torchrun", "--nnodes", "1", "--nproc_per_node",
             "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "implicit_megatron.train",
             TINY, f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={out}",
             "train.steps=2", "checkpoint.interval=2", "train.eval_interval=100", "tracking.enabled=false",
             "distributed.zero_stage=0", "schedule.warmup_steps=1", "curriculum.phases=[]"]
    result = run_in_session(["bash", "-c", f"ulimit -f 1000 && exec {' '.join(train)}"], timeout=300)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "could not be saved" in line]
    assert lines and lines[0].startswith("error on rank 0: CheckpointSaveError: "), result.stderr[-3000:]
    assert "the file size limit of this process was reached (ulimit -f: 1024000 bytes)" in lines[0], lines[0]
    assert f"(writing {out}/checkpoints/.partial-step2/mp_rank_00_model_states.pt)" in lines[0], lines[0]
    assert "no earlier checkpoint exists" in lines[0]


def test_preprocessing_into_a_full_filesystem_fails_by_name_and_publishes_nothing(tmp_path):
    """Room for the finished input's parts (3 MB) but not for the merged shards as well: one line
    naming the output and the cause, exit 1, no shard under its name nor half-written, the finished
    input kept in `.work` for the rerun."""
    out = tmp_path / "out"
    out.mkdir()
    if not can_mount_tmpfs(out):
        pytest.skip("this kernel does not let an unprivileged user mount a tmpfs (no user namespaces)")
    preprocess = [sys.executable, "-m", "data_pipeline.preprocess", "--input", "data/corpus/shakespeare.jsonl.zst",
                  "--tokenizer", "data/tokenizers/gpt-neox-20b.json.xz", "--output-prefix", f"{out}/neox",
                  "--workers", "1", "--quiet", "--append-eod"]
    script = f"mount -t tmpfs -o size=4m tmpfs {out} && {{ {' '.join(preprocess)}; echo RC=$?; }}; " \
             f"ls -A {out}; ls -A {out}/neox.work"
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", script], cwd=ROOT,
                            env=child_env(), capture_output=True, text=True, timeout=300)
    assert "RC=1" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"preprocess: error: {out}/neox"), result.stderr[-3000:]
    assert "No space left on device" in errors[0] and f"kept in {out}/neox.work" in errors[0]
    listed = result.stdout.split("RC=1", 1)[1].split()
    assert not [name for name in listed if name.endswith((".bin", ".idx", ".tmp", "_stats.json"))], listed
    assert "neox.work" in listed and any(name.startswith("00000-") for name in listed)  # the finished input


@pytest.mark.distributed
def test_a_stop_asked_on_a_full_disk_reaches_the_ranks(shakespeare_shards, tmp_path):
    """SIGTERM to launch/pretrain.sh once the disk is full: its stop file cannot be written, so the one
    written at launch is renamed into place (renaming needs no space); the ranks stop at their next
    step (their save fails by name on the full disk) instead of training on."""
    out, log = tmp_path / "out", tmp_path / "launch.log"
    out.mkdir()
    if not can_mount_tmpfs(out):
        pytest.skip("this kernel does not let an unprivileged user mount a tmpfs (no user namespaces)")
    launch = f"PYTHON={sys.executable} NPROC=1 bash launch/pretrain.sh {TINY} data.prefixes=[{shakespeare_shards}] " \
             f"data.source=null train.output_dir={out}/run train.steps=100000 train.log_interval=100000 " \
             "checkpoint.interval=100000 train.eval_interval=100000 tracking.enabled=false"
    script = (f"mount -t tmpfs -o size=60m tmpfs {out} || exit 3; {launch} > {log} 2>&1 & pid=$!; "
              f"for i in $(seq 1 240); do grep -q 'phase bounded' {log} 2>/dev/null && break; sleep 0.5; done; "
              f"sleep 3; dd if=/dev/zero of={out}/fill bs=1M 2>/dev/null; kill -TERM $pid; start=$(date +%s); "
              "wait $pid; echo \"RC=$? AFTER=$(( $(date +%s) - start ))\"; " f"ls -A {out}/run")
    result = run_in_session(["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", script], timeout=300)
    said = log.read_text()
    assert "RC=" in result.stdout, result.stdout[-2000:] + said[-3000:]
    after = int(result.stdout.split("AFTER=")[1].split()[0])
    assert after < 120, said[-3000:]
    assert "stop-requested" in result.stdout.split()  # the armed file, renamed into place
    # the stop was agreed at the next step: its record (the only one: log_interval is 100000) or its
    # checkpoint cannot be written on the full disk, said in one line
    stopped = [line for line in said.splitlines() if line.startswith("error on rank 0: ")]
    assert stopped and "no space left on device" in stopped[0].lower(), said[-3000:]
    assert "metrics.jsonl: could not be written at step" in stopped[0] or "could not be saved" in stopped[0]
    assert "Traceback" not in said


CONVERTED_WITHOUT_ROOM = """
import hashlib, resource, shutil, subprocess, sys
from pathlib import Path

def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "a folder" for p in folder.iterdir()}

tag = Path(shutil.copytree(SOURCE, Path(OUT) / "checkpoints" / "bounded-step6"))
before = digests(tag)
if LIMIT:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))  # as `ulimit -f`; the tool inherits it
tool = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "universal", str(tag), "--workers", "1"],
                      capture_output=True, text=True)
print(tool.stderr, end="")
print("RC", tool.returncode, "LEFT", sorted(p.name for p in tag.parent.iterdir()), digests(tag) == before)
"""


@pytest.mark.processes
@pytest.mark.parametrize("room", ["a file size limit", "a full disk"])
def test_a_universal_conversion_without_room_is_one_line_and_leaves_the_checkpoint(room, zero1_run, tmp_path):
    """Room for the tag (2.3 MB) but not for its conversion (3.2 MB, and DeepSpeed's fragments): one
    line naming the tag, the cause and the file, in place of DeepSpeed's tracebacks and torch's
    "unexpected pos"; no temporary folder left, the tag's own files as they were."""
    limit = 200 << 10 if room == "a file size limit" else 0  # `ulimit -f 200`: below the embedding's 0.26 MB
    source = zero1_run / "checkpoints" / "bounded-step6"
    snippet = f"SOURCE = {str(source)!r}\nLIMIT = {limit}\n{CONVERTED_WITHOUT_ROOM}"
    if limit:
        (tmp_path / "out").mkdir()
        result = run_in_session([sys.executable, "-c", f"OUT = {str(tmp_path / 'out')!r}\n{snippet}"], timeout=120)
    else:
        result = on_a_small_tmpfs(tmp_path, 'mount -t tmpfs -o size=4m tmpfs "$OUT"', snippet)
    tag = re.escape(str(tmp_path / "out" / "checkpoints" / "bounded-step6"))
    cause = (rf"the file size limit of this process was reached \(ulimit -f: {limit} bytes\) \(writing "
             rf"{tag}/\.universal\.tmp/zero/embedding\.weight/fp32\.pt\)" if limit else
             rf"no space left on device \(\d+ bytes free\) \(writing {tag}/\.universal\.tmp/\S+\)")
    *said, left = result.stdout.splitlines()
    assert len(said) == 1 and re.fullmatch(rf"convert_checkpoint: {tag}: conversion to a universal checkpoint failed: "
                                           f"{cause}; the partial conversion was removed and the checkpoint itself is "
                                           "intact", said[0]), result.stdout[-3000:]
    assert left == "RC 2 LEFT ['bounded-step6'] True", left  # no temporary folder; the tag's files unchanged
