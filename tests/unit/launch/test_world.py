"""How many processes a launch starts and where (launch/world.py, launch/environment.py)."""

from __future__ import annotations

import pytest

from implicit_megatron.launch.environment import LaunchEnvironment, LaunchError, launched_rank, slurm_task_rank
from implicit_megatron.launch.world import World, world_of


def env(tmp_path, **settings: str) -> LaunchEnvironment:
    """No GPU device node: torch is never asked."""
    return LaunchEnvironment.read({"GPU_DEVICE_NODES": str(tmp_path / "nvidia0"), **settings})


def test_cpu_processes_come_from_nproc_and_nodes(tmp_path):
    assert world_of(env(tmp_path)) == World(gpus=0, per_node=1, nodes=1, size=1)
    assert world_of(env(tmp_path, NPROC="3", NUM_NODES="2")) == World(gpus=0, per_node=3, nodes=2, size=6)


def test_a_hostfile_gives_every_host_its_slots(tmp_path):
    (tmp_path / "h").write_text("# two nodes\na slots=2\nb slots=5\n")
    assert world_of(env(tmp_path, HOSTFILE=str(tmp_path / "h"))) == World(gpus=0, per_node=5, nodes=None, size=7)
    # NUM_NODES with a hostfile: the first NUM_NODES hosts, NPROC processes on each (DeepSpeed's reading)
    assert world_of(env(tmp_path, HOSTFILE=str(tmp_path / "h"), NUM_NODES="2", NPROC="2")).size == 4
    (tmp_path / "h").write_text("a slots=2\na slots=5\n")
    with pytest.raises(LaunchError, match=rf"^pretrain.sh: HOSTFILE {tmp_path / 'h'}:2: host 'a' is listed twice"):
        world_of(env(tmp_path, HOSTFILE=str(tmp_path / "h")))


def test_threads_share_the_cores_and_the_users_setting_wins(tmp_path):
    import os

    cores = len(os.sched_getaffinity(0))
    assert World(0, 1, 1, 1).threads({}) == str(cores)
    assert World(0, cores + 1, 1, cores + 1).threads({}) == "1"
    assert World(0, 1, 1, 1).threads({"OMP_NUM_THREADS": "7"}) == "7"


def test_one_node_takes_a_free_port_unless_told_and_several_agree_on_one(tmp_path):
    assert World(0, 1, 1, 1).port(env(tmp_path, MASTER_PORT="12345")) == 12345
    assert World(0, 1, 2, 2).port(env(tmp_path)) == 29500
    assert World(0, 1, 1, 1).port(env(tmp_path)) not in (29500, 0)


@pytest.mark.parametrize("name", ["NUM_NODES", "GPUS_PER_NODE", "NPROC", "MASTER_PORT"])
@pytest.mark.parametrize("value", ["x[$(touch m)]", "0", "-1", "2.5", " 2"])
def test_a_count_that_is_no_whole_number_of_at_least_one_is_refused_by_name(tmp_path, name, value):
    with pytest.raises(LaunchError, match=rf"^pretrain.sh: {name}=.* is not a whole number of at least 1$"):
        env(tmp_path, **{name: value})


@pytest.mark.parametrize("value", ["65536", "70000", "99999999999999999999"])
def test_a_port_beyond_65535_is_refused_by_name(tmp_path, value):
    with pytest.raises(LaunchError, match=rf"^pretrain.sh: MASTER_PORT={value} is not a port: a whole number from 1 "
                                          "to 65535$"):
        env(tmp_path, MASTER_PORT=value)
    assert env(tmp_path, MASTER_PORT="65535").master_port == 65535


def test_an_srun_task_of_several_is_a_rank(tmp_path):
    task = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0",
            "MASTER_ADDR": "node1"}
    assert slurm_task_rank(task) == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "node1",
                                     "MASTER_PORT": "29500"}
    assert slurm_task_rank({**task, "SLURM_NTASKS": "1"}) == {}  # one task: it launches the world itself
    assert slurm_task_rank({**task, "RANK": "0"}) == {}  # a launcher set the rank already
    with pytest.raises(LaunchError, match=r"^pretrain.sh: SLURM_NTASKS='4;x' is not a whole number"):
        slurm_task_rank({**task, "SLURM_NTASKS": "4;x"})


def test_a_batch_script_of_several_tasks_without_srun_is_refused_by_name():
    """sbatch --ntasks=2 running pretrain.sh itself: rank 0 would wait for a rank 1 that never comes."""
    batch = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "node1"}
    with pytest.raises(LaunchError, match=r"^pretrain.sh: SLURM_NTASKS=2 but SLURM_STEP_ID is not set: this is the "
                                          r"job's batch script, not one of srun's tasks; .*srun"):
        slurm_task_rank(batch)
    assert slurm_task_rank({**batch, "SLURM_STEP_ID": "0"})["WORLD_SIZE"] == "2"


@pytest.mark.parametrize("left", [{"RANK": "0", "LOCAL_RANK": "0"}, {"RANK": "3"}, {"LOCAL_RANK": "1"},
                                  {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}])
def test_a_rank_s_variables_left_in_the_shell_are_named(left):
    with pytest.raises(LaunchError) as caught:
        launched_rank(left)
    said = str(caught.value)
    assert said.startswith("pretrain.sh: ") and "\n" not in said and "left in this shell" in said, said
    assert all(f"{name}={value}" in said for name, value in left.items() if name in ("RANK", "LOCAL_RANK")), said


def test_a_launcher_s_rank_is_one_and_a_launch_is_not():
    assert launched_rank({}) is False
    assert launched_rank({"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a",
                          "MASTER_PORT": "29500"}) is True
