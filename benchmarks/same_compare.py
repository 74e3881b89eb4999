"""The same person and prompt through the page in headless Chromium (save, Fit my style, Compare of base, cluster,
card, rag, cope; greedy): the outputs as JSON, to compare two commits (run it in each tree, e.g. a git worktree).

    python benchmarks/same_compare.py OUT subjects.txt     # one text a line (e.g. git log --format=%s)
"""
import json, sys, tempfile, time
sys.path.insert(0, "tests")
from pathlib import Path
from browser import Page, chromium, served
from personalize.studio.facade import Studio, StudioConfig

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
db = Path(tempfile.mkdtemp())
studio = Studio.load(StudioConfig(artifacts="data/artifacts/demo", db=str(db / "studio.db"), demo_data="data/demo"))
studio.load_pending()
text = "\n\n".join(l.strip() for l in open(sys.argv[2]) if l.strip())
methods = ["base", "cluster", "card", "rag", "cope"]
with served(studio) as url:
    d = chromium(db)
    p = Page(d, out)
    d.get(url)
    p.type("user-name", "jelle")
    p.type("history", text)
    p.click("save-history")
    print(p.until_text("writing-status", "Saved", "⚠️")[:200])
    print(p.fit("jelle")[:200])
    p.tab("Compare")
    p.type("prompt", "Fix crash on walrus operator in return annotations")
    p.choose_methods(methods)
    p.click("compare-button")
    print(p.until_text("compare-status", "Done:", "⚠️")[:300])
    time.sleep(2)
    res = {m: p.text(f"out-{m}") for m in methods}
    p.shot("same-compare")
    d.quit()
json.dump(res, open(out / "outputs.json", "w"), indent=1)
print(json.dumps(res, indent=1))
