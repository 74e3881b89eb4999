"""A person unlike the demo build's population (Debian changelog writers) in headless Chromium: their history
pasted and saved, Fit my style, and a Compare of base, cluster, card; a screenshot of each page.

    python benchmarks/far_person_shots.py OUT subjects.txt     # one text a line (e.g. git log --format=%s)
"""
import sys, tempfile, time
sys.path.insert(0, "tests")
from pathlib import Path
from browser import Page, chromium, served
from personalize.studio.facade import Studio, StudioConfig

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
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
    p.choose_methods(["base", "cluster", "card"])
    p.click("compare-button")
    print(p.until_text("compare-status", "Done:", "⚠️")[:300])
    time.sleep(2)
    for m in ("base", "cluster", "card"):
        print(m, "|", p.text(f"out-{m}")[:200].replace("\n", " "))
    p.shot("compare-far")
    d.quit()
