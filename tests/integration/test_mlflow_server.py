"""A training run logs to a real MLflow tracking server started on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.processes import ROOT, child_env, free_port, kill_tree


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                             "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None and time.time() < deadline, "the MLflow server did not start"
        time.sleep(0.5)
    yield url
    kill_tree(proc.pid)
    proc.wait()


@pytest.mark.distributed
def test_training_logs_to_a_server(mlflow_server, shakespeare_shards, tmp_path):
    env = child_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    result = subprocess.run(
        [sys.executable, "-m", "implicit_megatron.train", "configs/tiny/llama-implicit.yaml",
         f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={tmp_path / 'run'}",
         "train.steps=6", "train.log_interval=2", "train.eval_interval=6", f"tracking.uri={mlflow_server}",
         "tracking.experiment=server-test"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("server-test").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["model.arch"] == "llama"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [2, 4, 6]
    assert client.get_metric_history(run.info.run_id, "val/ppl")[0].value > 1
    assert "config.yaml" in [f.path for f in client.list_artifacts(run.info.run_id)]
