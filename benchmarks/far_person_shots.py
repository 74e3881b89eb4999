"""A person through the page in headless Chromium on the demo build: their history pasted and saved, Fit my style,
and a Compare (greedy); a screenshot of each page, and the outputs in OUT/outputs.json. Run at two commits (a git
worktree each, this script copied in) it shows whether a change moved any output.

    python benchmarks/far_person_shots.py OUT subjects.txt [base,cluster,card]   # one text a line (git log --format=%s)
"""
import json, sys, tempfile, time
sys.path.insert(0, ".")  # the tree it runs in (a worktree of the commit under test)
from pathlib import Path
from tools.browser import Page, chromium, served
from personalize.studio.facade import Studio, StudioConfig

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
methods = sys.argv[3].split(",") if len(sys.argv) > 3 else ["base", "cluster", "card"]
db = Path(tempfile.mkdtemp())
studio = Studio.load(StudioConfig(artifacts="data/artifacts/demo", db=str(db / "studio.db"), demo_data="data/demo"))
studio.load_pending()
far_text = "\n\n".join(l.strip() for l in open(sys.argv[2]) if l.strip())
with served(studio) as url:
    d = chromium(db)
    p = Page(d, out)
    d.get(url)
    p.type("user-name", "jelle")
    p.type("history", far_text)
    p.click("save-history")
    print(p.until_text("writing-status", "Saved", "⚠️")[:300])
    fit = p.fit("jelle")
    print(fit)
    p.shot("fit-far")
    p.tab("Compare")
    p.type("prompt", "Fix crash on walrus operator in return annotations")
    p.choose_methods(methods)
    p.click("compare-button")
    print(p.until_text("compare-status", "Done:", "⚠️")[:300])
    time.sleep(2)
    outputs = {m: p.text(f"out-{m}").split("\n", 1)[-1] for m in methods}  # the column's text, not its timing line
    for m in methods:
        print(m, "|", outputs[m][:200].replace("\n", " "))
    p.shot("compare-far")
    d.quit()
json.dump(outputs, open(out / "outputs.json", "w"), indent=1)
