"""Open a training run's page in the real MLflow UI, in headless Chromium, and check what it shows.

The MLflow UI is a JavaScript application: what a user sees on a run's page (who ran it, its
source and commit, datasets, tags, metric charts, the view the UI opens in) can only be read in a
browser. This starts `mlflow ui` on 127.0.0.1 for a run folder's local store, opens the address the
trainer printed and the run's tabs, saves a screenshot and the visible text of each page to --out,
and exits 1 naming what a page lacks.

Needs the full MLflow (`bash scripts/setup.sh mlflow`), Playwright for Python
(`.venv/bin/pip install playwright`) and a Chromium (Debian: `apt-get install chromium`):

    .venv/bin/python tools/dev/mlflow_ui_look.py runs/quickstart --out /tmp/mlflow-look
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlflow import MlflowClient

from implicit_megatron.tracking.run_record import TRAINING_VIEW
from implicit_megatron.tracking.tracker import RUN_ID_FILE, STORE
from implicit_megatron.utils.ports import free_port

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# what each page must show (visible text), beside the run's own name and commit
EXPECTED = {
    "overview": ["Created by", "Status", "Source", "implicit_megatron.train", "Datasets",
                 "architecture", "curriculum", "phase", "train/loss", "curriculum.phases.0.max_iter"],
    "model-metrics": ["loss", "solver", "residual"],
    "artifacts": ["config.yaml"],
}
GENAI_VIEW = ["Evaluation runs", "Judges", "Prompts & versions"]  # the side bar of the view a run must not open in


def wait_for(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"mlflow ui did not answer at {url} within {seconds:.0f} s") from None
            time.sleep(1)


def missing_text(page_text: str, expected: list[str]) -> list[str]:
    """What a page should show but does not, and what it shows of the GenAI view."""
    return ([item for item in expected if item not in page_text]
            + [f"(GenAI view) {item}" for item in GENAI_VIEW if item in page_text])


def look(run_dir: Path, out: Path, chromium: str) -> list[str]:
    from playwright.sync_api import sync_playwright

    store = run_dir / STORE
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    run = MlflowClient(f"sqlite:///{store.resolve()}").get_run(run_id)
    expected = dict(EXPECTED)
    expected["overview"] = [*expected["overview"], run.info.run_name,
                            run.data.tags.get("mlflow.source.git.commit", "")[:7]]
    if any(key.startswith("system/") for key in run.data.metrics):
        expected["system-metrics"] = ["cpu_utilization_percentage", "system_memory_usage_megabytes"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri",
                               f"sqlite:///{store.resolve()}", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    problems = []
    try:
        wait_for(base + "/health")
        run_url = f"{base}/#/experiments/{run.info.experiment_id}/runs/{run_id}"
        pages = {"overview": run_url + TRAINING_VIEW, "model-metrics": f"{run_url}/model-metrics{TRAINING_VIEW}",
                 "system-metrics": f"{run_url}/system-metrics{TRAINING_VIEW}",
                 "artifacts": f"{run_url}/artifacts{TRAINING_VIEW}"}
        out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            for name, url in pages.items():
                page.goto(url)
                page.wait_for_timeout(6000)  # the application fetches the run after it loads
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                text = page.inner_text("body")
                (out / f"{name}.txt").write_text(f"{page.url}\n{text}")
                lacks = missing_text(text, expected.get(name, []))
                print(f"{name:15s} {'ok' if not lacks else 'lacks ' + ', '.join(map(repr, lacks))}  {url}")
                problems += [f"{name}: {item}" for item in lacks]
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run's output folder (holding mlflow.db and mlflow_run_id)")
    parser.add_argument("--out", type=Path, required=True, help="where the screenshots and page texts go")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium executable")
    args = parser.parse_args(argv)
    for needed in (args.run_dir / STORE, args.run_dir / RUN_ID_FILE):
        if not needed.is_file():
            parser.error(f"{needed} is missing: the run folder of a run tracked in a local store is needed")
    problems = look(args.run_dir, args.out, args.chromium)
    print(f"screenshots and page texts in {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
