"""A person no cluster fits, through the page in headless Chromium on the demo build (issue 48): their history saved,
Fit over their cluster (which offers a cluster of one to a far person), *Train my own adapter* (the page polled until
it is ready), Fit my style over it, Compare (cluster, card) and Explore; a screenshot of each step, and what each page
said in OUT/walk.json. The demo build runs as a build made now has it: own adapters start on the button alone.

    python -m benchmarks.own_adapter_shots OUT subjects.txt NAME "a prompt"   # one text a line (git log --format=%s)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from selenium.webdriver.support.ui import WebDriverWait

from personalize.studio.facade import Studio, StudioConfig
from tools.browser import Page, chromium, served


def decoded_check(p: Page, before: str) -> str:
    """Fit's decoded verdict once the fit's own check replaced `before` (the verdict before it stays on the page
    while the check runs)."""
    return p.wait.until(lambda d: (t := p.settled("fit-check")) and t != before and ("Decoded on your" in t or "⚠️" in t)
                        and t)


def main() -> None:
    out, subjects, name, prompt = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    out.mkdir(parents=True, exist_ok=True)
    db = Path(tempfile.mkdtemp())
    studio = Studio.load(StudioConfig(artifacts="data/artifacts/demo", db=str(db / "studio.db"), demo_data="data/demo"))
    studio.load_pending()
    eng = studio.runtime.engine  # a demo built before OwnSettings.far's default changed stored it on
    eng.cfg = replace(eng.cfg, own=replace(eng.cfg.own, far=False))
    text = "\n".join(line.strip() for line in open(subjects) if line.strip())
    said, t0 = {}, time.perf_counter()
    with served(studio) as url:
        d = chromium(db)
        p = Page(d, out)
        d.get(url)
        p.type("user-name", name)
        p.type("history", text)
        p.click("save-history")
        said["saved"] = p.until_text("writing-status", "Saved", "⚠️")
        p.shot("1-saved")
        said["save_s"] = round(time.perf_counter() - t0, 1)
        said["fit_over_cluster"] = p.fit(name)
        said["fit_check_over_cluster"] = decoded_check(p, "")
        p.shot("2-fit-over-cluster")
        p.click("own-adapter")
        said["own_button"] = p.until_text("fit-status", "Your own adapter", "could not be trained")
        t_button = time.perf_counter()
        while (job := studio.first_use_jobs.own_job(name)) is None or job["state"] in ("queued", "running"):
            if time.perf_counter() - t0 > 900:
                break
            time.sleep(1)
        said["own_job"] = {k: v for k, v in (job or {}).items() if k in ("state", "error", "seconds", "done", "total")}
        said["own_ready_s_after_button"] = round(time.perf_counter() - t_button, 1)
        said["fit"] = p.fit(name)
        said["fit_check"] = decoded_check(p, said["fit_check_over_cluster"])
        p.shot("3-fit-over-own")
        p.tab("Compare")
        p.type("prompt", prompt)
        p.choose_methods(["cluster", "card"])
        p.click("compare-button")
        said["compare"] = p.until_text("compare-status", "Done:", "⚠️")
        time.sleep(2)
        said["outputs"] = {m: p.text(f"out-{m}") for m in ("cluster", "card")}
        p.shot("4-compare")
        p.tab("Explore")
        p.wait = WebDriverWait(d, 1200, poll_frequency=1)  # a far person's sweep trains a throwaway own adapter first
        p.click("explore-button")
        said["explore"] = p.until_text("explore-status", "held-out", "⚠️", "ROUGE")
        time.sleep(2)
        said["explore_table"] = p.text("explore-table")
        p.shot("5-explore")
        d.quit()
    (out / "walk.json").write_text(json.dumps(said, indent=1, ensure_ascii=False))
    print(json.dumps(said, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
