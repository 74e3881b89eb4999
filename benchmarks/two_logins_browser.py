"""Two logins at once on the demo build, in headless Chromium: ana saves real writing (the changelog entries of the
Debian package with the most of them here), ben (another package's) types her person's name and tries to see,
overwrite, forget and export it. Starts app.py itself (a fresh database under OUT); screenshots in OUT/shots.

    python benchmarks/two_logins_browser.py [OUT]      # from the project root; OUT defaults to /tmp/two-logins
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.browser import Page, chromium, free_port  # noqa: E402


def entries(changelog: Path, n: int = 14) -> list[str]:
    """The first n "* " entries of a changelog.Debian.gz."""
    lines = gzip.open(changelog, "rt", errors="replace").read().splitlines()
    return [line.strip()[2:] for line in lines if line.strip().startswith("* ")][:n]


def two_writers() -> tuple[list[str], list[str]]:
    """The entries of the two packages with the most distinct first entries (two different maintainers' texts)."""
    found = sorted(((len(set(e)), e) for f in Path("/usr/share/doc").glob("*/changelog.Debian.gz") if (e := entries(f))),
                   key=lambda t: -t[0])
    first = found[0][1]
    second = next(e for _, e in found[1:] if not set(e) & set(first))
    return first, second


def login(out: Path, url: str, user: str, password: str) -> Page:
    from selenium.webdriver.common.by import By

    d = chromium(out / user)
    p = Page(d, out / "shots")
    d.get(url)
    p.el("input[type=password]")
    name, secret = [e for e in d.find_elements(By.CSS_SELECTOR, "input") if e.is_displayed()][:2]
    name.send_keys(user)
    secret.send_keys(password)
    next(b for b in d.find_elements(By.TAG_NAME, "button") if "login" in b.text.lower()).click()
    p.el("#user-name")
    time.sleep(2)
    return p


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ana_texts, ben_texts = two_writers()
    db, port = out / "studio.db", free_port()
    for f in out.glob("studio.db*"):
        f.unlink()
    log = out / "server.log"
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--db", str(db), "--auth", "ana:pa,ben:pb"],
                              cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    pages = []
    try:
        while "ready in" not in log.read_text():
            if server.poll() is not None:
                raise SystemExit(f"app.py stopped:\n{log.read_text()}")
            time.sleep(1)
        url = f"http://127.0.0.1:{port}/"
        a = login(out, url, "ana", "pa")
        b = login(out, url, "ben", "pb")
        pages = [a, b]
        a.type("user-name", "harbour")
        a.type("history", "\n".join(ana_texts))
        a.click("save-history")
        print("ana saves:", a.until_text("writing-status", "Saved", "⚠️"))
        a.shot("01-ana-saved")
        b.d.refresh()
        b.el("#user-name")
        time.sleep(2)
        print("ben's stored users:", b.d.execute_script(
            "return Array.from(document.querySelectorAll('#stored-users ul li')).map(e => e.textContent)"))
        b.type("user-name", "harbour")
        time.sleep(3)
        print("ben types her name:", b.text("writing-status"), "| items table:", b.text("items").split())
        b.shot("02-ben-types-her-name")
        b.type("history", "\n".join(ben_texts))
        for press in (1, 2):  # the second press is the no-login flow's "replace": never for another login's name
            b.click("save-history")
            time.sleep(4)
            print(f"ben saves over her ({press}):", b.until_text("writing-status", "Saved", "⚠️"))
        b.shot("03-ben-saves-over-her")
        b.click("forget-box")
        b.click("forget-confirm")
        b.click("forget-button")
        print("ben forgets her:", b.until_text("forget-status", "Forgot", "⚠️"))
        b.shot("04-ben-forgets-her")
        b.tab("Export")
        b.click("export-predictions")
        status = b.until_text("export-status", "Exported", "⚠️")
        b.shot("05-ben-exports")
        exported = sorted((ROOT / "data" / "exports" / "ben").glob("*/predictions_card.json"))[-1].read_text()
        print("ben's export holds any of her texts:", any(t in exported for t in ana_texts), f"({status.split()[0]})")
        con = sqlite3.connect(db)
        stored = [r[0] for r in con.execute("SELECT y FROM items WHERE user = 'harbour' ORDER BY position")]
        print("her history as she saved it:", stored == list(dict.fromkeys(ana_texts)), f"({len(stored)} items)")
        a.type("user-name", "harbour")
        time.sleep(3)
        print("ana sees:", a.text("writing-status"))
        a.shot("06-ana-after")
        print(json.dumps({"shots": str(out / "shots")}))
    finally:
        for p in pages:
            p.d.quit()
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/two-logins"))
