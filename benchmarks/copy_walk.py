"""A git author through the page in headless Chromium on the demo build (issue 57): their older subjects pasted, Fit
(with its decoded check), Compare on their five newest real changes (the change's files and diff as the prompt, the
real subject beside it) and Explore; every column's "repeats your text N" mark read off the page, a screenshot of
each step, and in OUT/walk.json what the page said, how many of each method's outputs repeat one of the pasted texts,
and how many of the author's own five real subjects do.

    python -m personalize population from-git --out J --max-items 40 --repo REPO   # a project's authors, LaMP files
    python -m benchmarks.copy_walk OUT J "AUTHOR NAME"
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

from selenium.webdriver.support.ui import WebDriverWait

from personalize.data import read_lamp
from personalize.metrics import repeated_text
from personalize.studio.facade import Studio, StudioConfig
from tools.browser import Page, chromium, served

METHODS = ["base", "cluster", "card", "rag", "cope"]
CHANGES, HISTORY = 5, 24  # the newest changes are the prompts; the history is the next 24 subjects, newest first


def main() -> None:
    out, folder, author = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    out.mkdir(parents=True, exist_ok=True)
    _, queries = read_lamp(folder, "dev")
    person = next(q for q in queries if q.user.startswith(author))
    changes, history = person.profile[:CHANGES], person.profile[CHANGES: CHANGES + HISTORY]
    pasted = [it.y for it in history]
    db = Path(tempfile.mkdtemp())
    studio = Studio.load(StudioConfig(artifacts="data/artifacts/demo", db=str(db / "studio.db"), demo_data="data/demo"))
    studio.load_pending()
    name = re.sub(r"\W+", "-", author.lower()).strip("-")
    said: dict = {"author": person.user, "source": person.source, "pasted": pasted, "changes": []}
    with served(studio) as url:
        d = chromium(db)
        p = Page(d, out)
        d.get(url)
        p.type("user-name", name)
        p.type("history", "\n".join(reversed(pasted)))  # as written, oldest first: the last line is the newest
        p.click("save-history")
        said["saved"] = p.until_text("writing-status", "Saved", "⚠️")
        said["fit"] = p.fit(name)
        said["fit_check"] = p.wait.until(lambda dr: (t := p.settled("fit-check")) and any(
            w in t for w in ("Decoded on your", "⚠️", "Too few", "No check by decoding")) and t)
        p.shot("1-fit")
        p.wait = WebDriverWait(d, 1200, poll_frequency=1)  # RAG's first Compare waits for Save's rewrites
        p.tab("Compare")
        p.choose_methods(METHODS)
        if p.el("#use-template input").is_selected():  # the change's text already holds the instruction
            p.d.execute_script("arguments[0].click()", p.el("#use-template input"))
        for i, change in enumerate(changes, 1):
            p.type("prompt", change.x)
            before, t0 = p.text("compare-status"), time.perf_counter()
            p.click("compare-button")
            status = p.wait.until(lambda dr: (t := p.settled("compare-status")) and t != before
                                  and ("Done:" in t or "⚠️" in t) and t)  # this Compare's, not the last one's
            time.sleep(1)
            columns = {m: p.text(f"out-{m}") for m in METHODS}
            said["changes"].append({"truth": change.y, "status": status, "seconds": round(time.perf_counter() - t0, 1),
                                    "columns": columns,
                                    "marked": {m: bool(re.search(r"repeats your text \d+", c)) for m, c in columns.items()},
                                    "truth_repeats": repeated_text(change.y, pasted) is not None})
            p.shot(f"2-compare-{i}")
        p.tab("Explore")
        p.click("explore-button")
        said["explore"] = p.until_text("explore-status", "Held out", "⚠️")
        time.sleep(2)
        said["explore_table"] = p.text("explore-table")
        p.shot("3-explore")
        d.quit()
    said["repeats"] = {m: sum(c["marked"][m] for c in said["changes"]) for m in METHODS}
    said["truth_repeats"] = sum(c["truth_repeats"] for c in said["changes"])
    (out / "walk.json").write_text(json.dumps(said, indent=1, ensure_ascii=False))
    print(json.dumps({k: said[k] for k in ("fit_check", "repeats", "truth_repeats", "explore")}, indent=1,
                     ensure_ascii=False))


if __name__ == "__main__":
    main()
