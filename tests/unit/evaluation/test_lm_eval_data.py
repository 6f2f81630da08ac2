"""implicit_megatron.evaluation.lm_eval_data: the download mode is settled before `datasets` is
imported (as set, offline for local tasks, offline where the Hub does not answer), and a Hub that
refuses connections is told apart at once."""

from __future__ import annotations

import pytest

from implicit_megatron.evaluation.lm_eval_data import data_source, hub_unreachable, settle_offline_mode


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def never(*_):
    raise AssertionError("the Hub must not be probed here")


def test_offline_as_set_and_for_local_tasks(clean_env):
    import os

    clean_env.setenv("HF_HUB_OFFLINE", "1")
    assert settle_offline_mode(None, probe=never) == "downloads are off (HF_HUB_OFFLINE=1)"
    clean_env.setenv("HF_HUB_OFFLINE", "0")  # online on purpose
    assert settle_offline_mode(None, probe=never) is None
    clean_env.delenv("HF_HUB_OFFLINE")
    assert settle_offline_mode("tasks/", probe=never) == "downloads are off for local tasks (--lm-eval-include tasks/)"
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_the_hub_decides_when_nothing_is_set(clean_env):
    import os

    assert settle_offline_mode(None, probe=lambda: None) is None and os.environ["HF_DATASETS_OFFLINE"] == "0"
    clean_env.delenv("HF_DATASETS_OFFLINE")
    assert settle_offline_mode(None, probe=lambda: "the Hub (x) cannot be reached") == "the Hub (x) cannot be reached"
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


@pytest.mark.timeout(120)
def test_a_refused_connection_is_reported_at_once():
    """A refused connection is an answer: the probe does not wait out its timeout (an hour here,
    which the test's own two-minute limit would catch)."""
    reason = hub_unreachable("http://127.0.0.1:9", timeout=3600.0)
    assert reason.startswith("the Hub (http://127.0.0.1:9) cannot be reached (ConnectError")


def test_only_plain_tasks_name_a_data_set():
    from types import SimpleNamespace

    def entry(kind="TASK", **cfg):
        return SimpleNamespace(kind=SimpleNamespace(name=kind), cfg=cfg)

    assert data_source(entry(dataset_path="allenai/ai2_arc", dataset_name="ARC-Easy",
                             dataset_kwargs={"trust_remote_code": True, "revision": "x"})) == \
        ("allenai/ai2_arc", "ARC-Easy", {"revision": "x"})
    assert data_source(entry("GROUP", dataset_path="a")) is None
    assert data_source(entry(dataset_path="a", custom_dataset="module.load")) is None
    assert data_source(None) is None


def test_a_passed_check_is_not_repeated_and_a_failed_one_is(clean_env, monkeypatch):
    """evaluate checks before the model loads and again where lm_eval runs: the data sets are looked
    up once. A check that failed is run again (the data may have been provided since)."""
    from pathlib import Path

    from implicit_megatron.evaluation import lm_eval_data
    from implicit_megatron.evaluation.lm_eval_options import LmEvalOptions

    tasks = str(Path(__file__).parent / "fixtures" / "lm_eval")
    looked_up = []
    real = lm_eval_data.missing_data
    monkeypatch.setattr(lm_eval_data, "missing_data", lambda manager, names: looked_up.append(names) or
                        real(manager, names))
    lm_eval_data.checked_tasks.cache_clear()
    options = LmEvalOptions(tasks=["tiny_piqa"], include_path=tasks)
    first = lm_eval_data.check_tasks(options)
    assert lm_eval_data.check_tasks(options) is first and looked_up == [["tiny_piqa"]]

    failed = []
    monkeypatch.setattr(lm_eval_data, "missing_data", lambda manager, names: failed.append(names) or
                        (["tiny_gen (json: gone)"], False))
    broken = LmEvalOptions(tasks=["tiny_gen"], include_path=tasks)
    for _ in range(2):
        with pytest.raises(lm_eval_data.MissingTaskData, match=r"^lm_eval cannot get the data of 1 task\(s\): "
                                                               r"tiny_gen \(json: gone\)$"):
            lm_eval_data.check_tasks(broken)
    assert failed == [["tiny_gen"], ["tiny_gen"]]  # the failed check ran again, not remembered
    lm_eval_data.checked_tasks.cache_clear()
