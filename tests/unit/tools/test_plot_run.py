"""tools/plot_run.py: a run folder read into curves against tokens (the last record of a step, the
phases as token spans) and two runs drawn into one PNG; a folder without metrics is refused."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import yaml
from support.processes import ROOT
from support.tools import load_tool

from implicit_megatron.config import Config, CurriculumConfig, PhaseConfig
from implicit_megatron.evaluation.run_plot import last_record_per_step, read_run
from implicit_megatron.tracking.launches_file import LAUNCHES_FILE, append_launch
from implicit_megatron.tracking.metrics_file import append_metrics

STEPS, BATCH, SEQ = 20, 4, 32  # 128 tokens per step


def make_run(folder, name: str, implicit: bool, loss_shift: float = 0.0):
    """A run folder as the trainer leaves it: config.yaml from the config dataclasses and
    metrics.jsonl from append_metrics, with steps 8-10 logged twice (a resumed launch)."""
    cfg = Config(name=name)
    cfg.train.steps, cfg.train.global_batch_size, cfg.train.micro_batch_size = STEPS, BATCH, BATCH
    cfg.data.seq_len, cfg.schedule.warmup_steps = SEQ, 2
    if implicit:
        cfg.implicit.enabled = True
        cfg.curriculum = CurriculumConfig(phases=[PhaseConfig("bounded", "bounded", 0.75, 4, 1),
                                                  PhaseConfig("free", "free", 0.25, 24, 4, tol=0.05)])
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    def train_record(step, loss):
        record = {"train/loss": loss, "train/lr": 1e-3 * min(1, step / 2), "train/grad_norm": 1.0 / step,
                  "train/consumed_samples": step * BATCH}
        if implicit:
            record.update({"solver/iterations": 4.0 if step <= 15 else 9.0, "solver/residual": 0.5 / step})
        return record

    append_launch(folder, 0, resumed=False, world_size=2, phase="bounded" if implicit else None)
    for step in range(2, 11, 2):  # the first launch, killed after step 10 with its checkpoint at 6
        append_metrics(folder, step, train_record(step, 9.0 + loss_shift))
    append_launch(folder, 6, resumed=True, world_size=2, phase="bounded" if implicit else None)
    for step in range(8, STEPS + 1, 2):  # the resumed launch logs 8 and 10 again
        append_metrics(folder, step, train_record(step, 5.0 - step / 10 + loss_shift))
        if step % 10 == 0:
            append_metrics(folder, step, {"val/loss": 4.0 - step / 20, "val/ppl": math.exp(4.0 - step / 20)})
    return folder


def test_a_run_is_read_against_tokens_with_the_last_record_of_each_step(tmp_path):
    run = read_run(make_run(tmp_path / "a", "tiny-a", implicit=True))
    assert run.name == "tiny-a" and run.tokens_per_step == BATCH * SEQ
    assert run.steps == list(range(2, STEPS + 1, 2))
    tokens, losses = run.series["train/loss"]
    assert tokens == [s * 128 for s in range(2, STEPS + 1, 2)]
    assert losses[:5] == [9.0, 9.0, 9.0, pytest.approx(4.2), pytest.approx(4.0)]  # 8, 10: the resumed launch's
    assert run.series["val/loss"] == ([10 * 128, 20 * 128], [pytest.approx(3.5), pytest.approx(3.0)])
    assert run.series["train/consumed_samples"][1][-1] == STEPS * BATCH
    spans = [(p.name, p.kind, p.label, p.first_step, p.end_step, p.start_tokens, p.end_tokens) for p in run.phases]
    assert spans == [("bounded", "bounded", "(4+1)", 0, 15, 0, 15 * 128),
                     ("free", "free", "(24+4), tol 0.05", 15, 20, 15 * 128, 20 * 128)]
    assert run.launches == [(0, "start"), (6 * 128, "resume")]
    assert read_run(make_run(tmp_path / "b", "tiny-b", implicit=False)).phases == []


def test_phases_are_shaded_where_the_run_trained_them(tmp_path):
    """An extended run (train.steps raised from 16 to 20 in its free phase) trained its bounded phase
    over steps 0-12, not the 15 the config's fractions of 20 give: the newest checkpoint says so."""
    import torch

    folder = make_run(tmp_path / "extended", "tiny-extended", implicit=True)
    tag = folder / "checkpoints" / "free-step20"
    tag.mkdir(parents=True)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    torch.save({"config": config, "phase_bounds": [["bounded", 0, 12], ["free", 12, 20]]},
               tag / "mp_rank_00_model_states.pt")
    (folder / "checkpoints" / "latest").write_text("free-step20\n")
    spans = [(p.name, p.first_step, p.end_step, p.start_tokens) for p in read_run(folder).phases]
    assert spans == [("bounded", 0, 12, 0), ("free", 12, 20, 12 * 128)]


def test_runs_and_phases_never_share_a_colour():
    from matplotlib.colors import to_rgb

    from implicit_megatron.evaluation.run_plot import PHASE_COLOURS

    runs = {to_rgb(f"C{i}") for i in range(10)}  # the colours the runs' lines take
    assert not runs & {to_rgb(colour) for colour in PHASE_COLOURS}


def test_records_of_one_step_merge_in_file_order():
    merged = last_record_per_step([{"step": 3, "a": 1.0}, {"step": 1, "a": 5.0}, {"step": 3, "b": 2.0},
                                   {"step": 3, "a": 7.0}, {"no": "step"}])
    assert merged == {1: {"step": 1, "a": 5.0}, 3: {"step": 3, "a": 7.0, "b": 2.0}}


def plot_run_tool():
    return load_tool("plot_run")


def test_two_runs_are_drawn_into_one_png(tmp_path):
    from matplotlib.image import imread

    first = make_run(tmp_path / "implicit", "tiny-implicit", implicit=True)
    second = make_run(tmp_path / "explicit", "tiny-explicit", implicit=False, loss_shift=0.3)
    out = tmp_path / "plots" / "runs.png"
    assert plot_run_tool().main([str(first), str(second), "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(out)
    assert image.shape[0] > 600 and image.shape[1] > 1200
    from matplotlib.colors import to_rgb

    def pixels_of(colour: str) -> int:
        return int((abs(image[..., :3] - to_rgb(colour)).max(axis=-1) < 0.02).sum())

    # each run's lines in its own colour (a drawing of the first run alone has no C1 pixel), over
    # many panels: hundreds of pixels each, beyond the legend's short line
    assert pixels_of("C0") > 500 and pixels_of("C1") > 500, (pixels_of("C0"), pixels_of("C1"))


def test_two_runs_phases_each_have_a_strip_and_every_launch_is_marked(tmp_path):
    """Two curricula of other phase bounds: each run's phases shaded in a strip of its own along the
    panel's foot, edged in its colour (shaded over the whole panel, they lay on top of each other), and
    a triangle in the run's colour where each of its launches began. A damaged launch line is skipped."""
    from matplotlib.colors import to_rgba

    from implicit_megatron.evaluation.run_plot import STRIP, figure

    first = make_run(tmp_path / "first", "tiny-first", implicit=True)
    second = make_run(tmp_path / "second", "tiny-second", implicit=True, loss_shift=0.3)
    with open(second / LAUNCHES_FILE, "a") as f:
        f.write('{"step": 12, "kind": "resu\n')  # cut by a kill
    config = yaml.safe_load((second / "config.yaml").read_text())
    config["curriculum"]["phases"][0]["fraction"], config["curriculum"]["phases"][1]["fraction"] = 0.5, 0.5
    (second / "config.yaml").write_text(yaml.safe_dump(config))
    fig = figure([read_run(first), read_run(second)])
    for ax in fig.axes[:6]:
        spans = [p for p in ax.patches if p.get_height() < 1.0 or p.get_y() > 0]
        assert len(spans) == len(ax.patches) == 4, [(p.get_y(), p.get_height()) for p in ax.patches]
        for index in (0, 1):
            own = [p for p in spans if to_rgba(p.get_edgecolor())[:3] == to_rgba(f"C{index}")[:3]]
            assert len(own) == 2 and all(p.get_y() == pytest.approx(index * STRIP) and
                                         p.get_height() == pytest.approx(STRIP) for p in own)
            bounds = sorted(p.get_x() + p.get_width() for p in own)  # where its bounded and free phases end
            assert bounds == [(15 if index == 0 else 10) * 128, 20 * 128], bounds
            marks = [line for line in ax.lines if line.get_marker() == "v" and line.get_color() == f"C{index}"]
            assert sorted((list(line.get_xdata()), line.get_markerfacecolor() == "none") for line in marks) == \
                [([0], True), ([6 * 128], False)]  # a hollow start, a filled resume
    import matplotlib.pyplot as plt

    plt.close(fig)
    one = figure([read_run(first)])  # one run: its phases over the whole panel, as before
    assert {(p.get_y(), p.get_height()) for p in one.axes[0].patches} == {(0.0, 1.0)}
    plt.close(one)


@pytest.mark.processes
def test_a_folder_without_metrics_is_refused_by_name(tmp_path):
    good = make_run(tmp_path / "run", "tiny", implicit=False)
    (tmp_path / "empty").mkdir()
    result = subprocess.run([sys.executable, "tools/plot_run.py", str(good), str(tmp_path / "empty"), "--output",
                             str(tmp_path / "x.png")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"plot_run: {tmp_path / 'empty' / 'metrics.jsonl'}: not found; "
                                     f"{tmp_path / 'empty'} is not a run's output folder, or its run has not "
                                     "logged a step yet")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.processes
def test_files_that_are_not_utf8_are_named_or_skipped(tmp_path):
    """A damaged metrics.jsonl line is skipped (the other records plot); a config.yaml that is not
    text is named in one line, as a run's config error is."""
    run = make_run(tmp_path / "run", "tiny", implicit=False)
    with open(run / "metrics.jsonl", "ab") as handle:
        handle.write(b'{"step": 99, "train/loss": \xff}\n')
    result = subprocess.run([sys.executable, "tools/plot_run.py", str(run), "--output", str(tmp_path / "x.png")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and (tmp_path / "x.png").is_file(), result.stderr[-2000:]
    (run / "config.yaml").write_bytes(b"name: \xff\xfe\n")
    result = subprocess.run([sys.executable, "tools/plot_run.py", str(run), "--output", str(tmp_path / "y.png")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"plot_run: config error: {run / 'config.yaml'}: not UTF-8 text (byte 6): not " \
                                    "a YAML config, or damaged"


@pytest.mark.processes
def test_without_matplotlib_one_line_says_how_to_install_it(tmp_path):
    hide = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['plot_run', {str(tmp_path)!r}, '--output', 'x.png']; "
            "runpy.run_path('tools/plot_run.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert line.startswith("plot_run: drawing figures needs matplotlib, which does not import here (") and \
        line.endswith("install the 'eval' extra: bash scripts/setup.sh eval (or pip install -e .[eval])"), line
    assert "\n" not in line
