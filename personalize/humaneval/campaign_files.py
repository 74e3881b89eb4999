"""A campaign's judgments as files: exported (JSONL or CSV, with a summary of its figures beside them) and imported
from another studio's export, matched by item and arms, a judgment already here never added twice.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from personalize.humaneval.campaign import Campaigns
from personalize.humaneval.campaign_schema import CampaignError, judgment
from personalize.humaneval.table_export import write
from personalize.store import now


def export_judgments(camps: Campaigns, name: str, path: str | Path) -> tuple[Path, Path, int]:
    """One campaign's judgments as JSONL or CSV (by the extension) and a summary JSON beside it."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".csv"):
        raise CampaignError(f"export to a .jsonl or .csv file, not {path.name!r}")
    rows = camps.judgments(name)
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        buf = io.StringIO()
        cols = list(rows[0]) if rows else ["campaign", "uid", "item", "user", "prompt", "verdict", "rater"]
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()})
        text = buf.getvalue()
    summary = path.with_name(path.stem + ".summary.json")
    write(path, text)
    write(summary, json.dumps(camps.results(name), indent=2, ensure_ascii=False))
    return path, summary, len(rows)


def import_judgments(camps: Campaigns, name: str, path: str | Path) -> dict:
    """Merges judgments exported by another studio (JSONL or CSV) into this campaign: matched by item
    (user, prompt) and arms; a judgment already here (same uid, or same rater and unit) is not added again."""
    c = camps.get(name)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".csv":
            rows = list(csv.DictReader(io.StringIO(text)))
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise CampaignError(f"cannot read judgments from {path}: {e}") from None
    units = {(u["user"], u["prompt"], u["method_a"], u["method_b"]): u["id"]
             for u in camps.store.query("SELECT u.id, u.method_a, u.method_b, i.user, i.prompt FROM campaign_units u "
                                       "JOIN campaign_items i ON i.id = u.item WHERE u.campaign = ?", [c["id"]])}
    added = duplicate = unmatched = 0
    with camps.store.transaction() as db:
        for r in rows:
            if not isinstance(r, dict) or r.get("source") == "judge":
                unmatched += not isinstance(r, dict)
                continue
            key = (r.get("user"), r.get("prompt"), r.get("first"), r.get("second") or "")
            unit = units.get(key)
            if unit is None or not r.get("uid") or not str(r.get("rater") or "").strip():
                unmatched += 1
                continue
            scores = r.get("scores")
            scores = json.loads(scores) if isinstance(scores, str) and scores else scores or None
            swapped = int(str(r.get("method_a")) != str(r.get("first")))
            try:
                verdict, scores = judgment(c["config"].mode, r.get("verdict") or None, scores)
            except CampaignError:
                unmatched += 1
                continue
            cur = db.execute(
                "INSERT OR IGNORE INTO campaign_judgments (uid, campaign, unit, rater, swapped, verdict, scores, "
                "seconds, served, created, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'import')",
                [str(r["uid"]), c["id"], unit, str(r["rater"]).strip(), swapped, verdict,
                 json.dumps(scores) if scores else None, _float(r.get("seconds")), r.get("served") or None,
                 r.get("created") or now()])
            added += cur.rowcount == 1
            duplicate += cur.rowcount != 1
    return {"added": added, "duplicates": duplicate, "unmatched": unmatched}


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None

