"""Whether lm-eval's tasks can get their data, told in one line before a model is loaded.

Without a network the harness used to fail late and loudly: after the model was loaded and every
task indexed, `datasets` retried the Hub for half a minute and raised a ConnectionError traceback.
Here the download mode is settled first: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE as set; local task
YAMLs (include_path) offline; otherwise online where the Hub answers within a few seconds, and
offline where it does not (data sets then come from the local cache, as `datasets` would after its
retries). Offline, each task's data set is looked up the way the harness will load it
(`datasets.load_dataset_builder`, which offline reads only HF_DATASETS_CACHE); the tasks whose data
is not there are named, with their data sets, the reason and how to provide them.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from implicit_megatron.errors import first_line

if TYPE_CHECKING:
    from implicit_megatron.evaluation.lm_eval_options import LmEvalOptions

OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
PROBE_SECONDS = 3.0


class MissingTaskData(ValueError):
    """lm-eval tasks whose data sets cannot be had here; the message is one line."""


def hub_unreachable(endpoint: str | None = None, timeout: float = PROBE_SECONDS) -> str | None:
    """Why the Hub cannot be reached (None: it answered, whatever the status). One request, no
    retries; proxies from the environment are used as `datasets` would."""
    import httpx

    endpoint = endpoint or os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx.head(endpoint, timeout=timeout)
    except httpx.HTTPError as err:
        return f"the Hub ({endpoint}) cannot be reached ({first_line(err)})"
    return None


def settle_offline_mode(include_path: str | None, probe=hub_unreachable) -> str | None:
    """Set HF_DATASETS_OFFLINE before `datasets` is imported; returns why downloads are off (None:
    they are on). Must run before lm_eval or datasets is imported to take effect."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE"):
            return f"downloads are off ({name}={os.environ[name]})"
    if any(name in os.environ for name in OFFLINE_VARIABLES):
        return None  # set to 0 on purpose: online
    if include_path:
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        return f"downloads are off for local tasks (--lm-eval-include {include_path})"
    unreachable = probe()
    os.environ["HF_DATASETS_OFFLINE"] = "1" if unreachable else "0"
    return unreachable


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None, include_defaults: bool):
    """lm-eval's task index (indexing its own thousands of tasks takes seconds: built once)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def data_source(entry) -> tuple[str, str | None, dict] | None:
    """(dataset path, name, load keywords) of a plain task entry; None for groups, tags, tasks
    written in Python or with their own loader (those are left to the harness)."""
    cfg = getattr(entry, "cfg", None) or {}
    if getattr(getattr(entry, "kind", None), "name", "TASK") != "TASK" or "class" in cfg \
            or cfg.get("custom_dataset") or not isinstance(cfg.get("dataset_path"), str):
        return None
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    kwargs.pop("trust_remote_code", None)  # as the harness does for datasets >= 4
    return cfg["dataset_path"], cfg.get("dataset_name"), kwargs


def missing_data(manager, tasks: list[str]) -> tuple[list[str], bool]:
    """'task (data set: why)' for each task whose data set does not load here, and whether any of
    them is a data set missing from the local cache (offline)."""
    import datasets

    missing, uncached = [], False
    for task in tasks:
        source = data_source(manager.task_index.get(task))
        if source is None:
            continue
        path, name, kwargs = source
        try:
            datasets.load_dataset_builder(path, name, **kwargs)
        except ConnectionError:
            missing.append(f"{task} ({path}{f', {name}' if name else ''}: not in the local cache)")
            uncached = True
        except Exception as err:  # noqa: BLE001 - the harness would fail on the same call; say why now
            missing.append(f"{task} ({path}: {first_line(err)})")
    return missing, uncached


def check_tasks(options: LmEvalOptions):
    """lm-eval's task manager for `options`, once every task is known and, offline, its data can be
    loaded; otherwise MissingTaskData (or ValueError for unknown names), in one line. A check that
    passed is not repeated in the process (evaluate checks before loading the model, and again
    where lm_eval runs)."""
    include_defaults = options.include_path is None if options.include_defaults is None else options.include_defaults
    return checked_tasks(options.include_path, include_defaults, tuple(options.tasks))


@functools.lru_cache(maxsize=4)
def checked_tasks(include_path: str | None, include_defaults: bool, tasks: tuple[str, ...]):
    """check_tasks, remembered when it passes (a failure raises, and is not remembered)."""
    offline = settle_offline_mode(include_path)
    manager = task_manager(include_path, include_defaults)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = include_path or "lm-eval's default tasks"
        raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)} in {where}")
    if offline is None:
        return manager
    missing, uncached = missing_data(manager, list(tasks))
    if missing:
        import datasets

        advice = (f"; {offline}, and the data set cache HF_DATASETS_CACHE={datasets.config.HF_DATASETS_CACHE} does "
                  "not hold them: run these tasks once where the Hub can be reached and copy that cache here (or "
                  "point HF_DATASETS_CACHE or HF_HOME at a copy), or name local task YAMLs with --lm-eval-include"
                  if uncached else "")
        raise MissingTaskData(f"lm_eval cannot get the data of {len(missing)} task(s): {'; '.join(missing)}{advice}")
    return manager
