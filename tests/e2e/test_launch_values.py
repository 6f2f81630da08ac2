"""Values that the launch scripts compute with, write row by row or hand to a remote shell run
nothing: each is checked before use and refused by name (a payload here only creates a marker file)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT, child_env

TINY = str(ROOT / "configs" / "tiny" / "mamba2-implicit.yaml")


def launch(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", f"launch/{script}.sh", *args], cwd=ROOT, env=child_env(PYTHON=sys.executable, **env),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("variable", ["NUM_NODES", "NPROC", "GPUS_PER_NODE", "MASTER_PORT"])
def test_a_count_that_is_not_a_number_is_refused_before_any_arithmetic(variable, tmp_path):
    marker = tmp_path / "marker"
    result = launch("pretrain", TINY, f"train.output_dir={tmp_path / 'run'}", **{variable: f"x[$(touch {marker})]"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"pretrain.sh: {variable}=") and "is not a whole number" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("variable", ["SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NUM_NODES",
                                      "SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "MASTER_PORT"])
def test_a_count_the_sbatch_example_computes_with_is_refused_when_not_a_number(variable, tmp_path):
    """SLURM leaves some unset (no GPU gres: SLURM_GPUS_ON_NODE): sbatch's --export=ALL brings the
    submitting shell's value instead."""
    marker = tmp_path / "marker"
    result = subprocess.run(["bash", "launch/examples/slurm.sbatch", TINY, f"train.output_dir={tmp_path / 'run'}"],
                            cwd=ROOT, env=child_env(PYTHON=sys.executable, SLURM_SUBMIT_DIR=str(ROOT),
                                                    SLURM_JOB_NODELIST="node1", **{variable: f"x[$(touch {marker})]"}),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"slurm.sbatch: {variable}=") and "is not a whole number" in result.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("address", ["node1;touch {marker}", "$(touch {marker})", "node1 -o ProxyCommand=x"])
def test_a_master_address_that_is_not_an_address_is_refused(address, tmp_path):
    marker = tmp_path / "marker"
    result = launch("pretrain", TINY, f"train.output_dir={tmp_path / 'run'}",
                    MASTER_ADDR=address.format(marker=marker))
    assert result.returncode == 2 and "is not a host name or address" in result.stderr, result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("variable", ["MLFLOW_TRACKING_URI", "PYTHONWARNINGS", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS",
                                      "TOKENIZERS_PARALLELISM", "DS_ACCELERATOR"])
def test_a_value_deepspeed_hands_every_node_is_refused_before_a_multi_node_launch(variable, tmp_path):
    """DeepSpeed's pdsh launch writes these into `export KEY="VALUE";` of every node's command: its own
    (MLFLOW*, PYTHON*, NCCL*...) and those pretrain.sh passes its ranks through its environment file."""
    marker = tmp_path / "marker"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    result = launch("pretrain", TINY, f"train.output_dir={tmp_path / 'run'}", HOSTFILE=str(hostfile),
                    **{variable: f"x$(touch {marker})"})
    assert result.returncode == 2, result.stderr
    assert f"pretrain.sh: {variable}='x$(touch {marker})' holds '$', which a shell reads inside double quotes" \
        in result.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_a_received_config_cannot_forge_a_row_of_the_curriculum_plan(tmp_path):
    """curriculum.sh reads its plan as tab-separated rows: an output folder holding a newline and tabs
    made a row of its own, whose node count reached pretrain.sh's arithmetic."""
    marker, out = tmp_path / "marker", tmp_path / "out"
    forged = f"{out}\\nfree\\ttodo\\tx[$(touch {marker})]\\t2\\t-\\t{out}"
    received = tmp_path / "received.yaml"
    received.write_text(f"base: {ROOT / 'configs' / 'tiny' / 'mamba2-curriculum.yaml'}\n"
                        f'train:\n  output_dir: "{forged}"\n')
    result = launch("curriculum", str(received))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "train.output_dir: " in result.stderr and "holds a control character" in result.stderr
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("hosts,line,says", [
    ("node1 slots=1\nnode1 slots=1\n", 2, "host 'node1' is listed twice"),
    ("node1 slots=two\n", 1, "slots=two: expected a whole number of at least 1"),
    ("node1 slots=0\nnode2 slots=1\n", 1, "slots=0: expected a whole number of at least 1"),
    ("# nodes\nnode1 slots=1 gpus=2\n", 2, "expected 'HOST slots=N'"),
    ("node1;touch {marker} slots=1\n", 1, "is not a host name or address"),
])
def test_a_hostfile_mistake_is_one_line_naming_its_line_before_anything_starts(hosts, line, says, tmp_path):
    """What DeepSpeed's launcher ended in a traceback (a host twice, slots=two) or took (slots=0, a
    field it ignores) stops the launch in pretrain.sh, naming the file and the line."""
    marker = tmp_path / "marker"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hosts.format(marker=marker))
    result = launch("pretrain", TINY, f"train.output_dir={tmp_path / 'run'}", HOSTFILE=str(hostfile))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line, no traceback
    assert result.stderr.startswith(f"pretrain.sh: HOSTFILE {hostfile}:{line}: ") and says in result.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()
