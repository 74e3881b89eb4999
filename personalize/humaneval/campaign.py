"""Human-evaluation campaigns (METHOD §6; the CARD paper's human study, §4.5 and Appendix B): a fixed set of
(user, prompt) items, every method's output generated ahead of rating, blinded units served to raters from
SQLite, and the study's statistics.

A *unit* is what one judgment judges: in `pairwise` mode the outputs of two arms for one item (every pair of
the campaign's methods; the reference, the person's real text, is one more blinded arm), in `rubric` mode one
output. A rater is given, among the units they have not seen, one that others have started but that has fewer
than `min_raters_per_unit` judgments (default 2: so agreement exists from the first two raters on), else the
least-rated one, in the A/B order used less often for that unit so far (counterbalancing), and keeps it until
they judge or skip it: the pending assignment is a row, so a reload or a restart gives it back. Attention
checks (the reference against a degenerate output) are units of their own, flagged, and kept out of every
statistic but the raters' pass rate. Every write is one transaction,
so concurrent raters lose nothing and a unit is never judged twice by one rater (a UNIQUE constraint, too).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import asdict
from itertools import combinations
from typing import Sequence

from personalize.humaneval import campaign_report
from personalize.humaneval.campaign_schema import (DEGENERATE, MAX_ITEMS, REFERENCE, TABLES, Assignment,
                                                   CampaignConfig, CampaignError, CampaignItem, degenerate, judgment,
                                                   rater_id)
from personalize.humaneval.bradley_terry import LeaderboardConfig
from personalize.store import Store, now

class Campaigns:
    """Campaigns in the studio's SQLite file: creation, the output pool, assignment, judgments, results."""

    def __init__(self, store: Store, seed: int | None = None):
        store.attach(TABLES)
        self.store = store
        self.rng = random.Random(seed)

    # ------------------------------------------------------------ definition
    def create(self, name: str, items: Sequence[CampaignItem], cfg: CampaignConfig) -> dict:
        name = (name or "").strip()
        if not name or len(name) > 64:
            raise CampaignError("a campaign needs a name of 1 to 64 characters")
        if not items:
            raise CampaignError("a campaign needs at least one (user, prompt) item")
        if len(items) > MAX_ITEMS:
            raise CampaignError(f"{len(items)} items; a campaign holds at most {MAX_ITEMS}")
        if cfg.reference and any(not (it.reference or "").strip() for it in items):
            raise CampaignError("--reference: some items have no reference text (gold output)")
        with self.store.transaction() as db:
            if db.execute("SELECT 1 FROM campaigns WHERE name = ?", [name]).fetchone():
                raise CampaignError(f"a campaign named {name!r} exists already")
            cid = db["campaigns"].insert({"name": name, "created": now(), "status": "open",
                                          "config": json.dumps(asdict(cfg))}).last_pk
            arms = cfg.arms
            for pos, it in enumerate(items):
                iid = db["campaign_items"].insert(
                    {"campaign": cid, "position": pos, "user": it.user, "prompt": it.prompt,
                     "reference": it.reference, "history": json.dumps(list(it.history[: cfg.history_shown]))}).last_pk
                if cfg.reference:
                    self._output(db, iid, REFERENCE, it.reference, 0.0)
                pairs = combinations(sorted(arms), 2) if cfg.mode == "pairwise" else ((a, "") for a in sorted(arms))
                units = [(a, b, 0) for a, b in pairs]
                if cfg.attention_every:
                    self._output(db, iid, DEGENERATE, degenerate(it.reference), 0.0)
                    units.append((REFERENCE, DEGENERATE, 1) if cfg.mode == "pairwise" else (DEGENERATE, "", 1))
                for a, b, attention in units:
                    db["campaign_units"].insert({"campaign": cid, "item": iid, "method_a": a, "method_b": b,
                                                 "attention": attention})
        return self.get(name)

    def get(self, name: str) -> dict:
        rows = self.store.query("SELECT * FROM campaigns WHERE name = ?", [(name or "").strip()])
        if not rows:
            known = ", ".join(self.names()) or "none yet"
            raise CampaignError(f"unknown campaign {name!r} (campaigns: {known})")
        return rows[0] | {"config": CampaignConfig.from_json(rows[0]["config"])}

    def names(self) -> list[str]:
        return [r["name"] for r in self.store.query("SELECT name FROM campaigns ORDER BY id")]

    def set_status(self, name: str, status: str) -> None:
        if status not in ("open", "closed"):
            raise CampaignError("status is open or closed")
        cid = self.get(name)["id"]
        with self.store.transaction() as db:
            db.execute("UPDATE campaigns SET status = ? WHERE id = ?", [status, cid])

    def items(self, name: str) -> list[dict]:
        rows = self.store.query("SELECT * FROM campaign_items WHERE campaign = ? ORDER BY position",
                                [self.get(name)["id"]])
        return [r | {"history": json.loads(r["history"])} for r in rows]

    # ------------------------------------------------------------ the output pool
    @staticmethod
    def _output(db, item: int, method: str, output: str, seconds: float) -> bool:
        cur = db.execute("INSERT OR IGNORE INTO campaign_outputs (item, method, output, seconds, created) "
                         "VALUES (?, ?, ?, ?, ?)", [item, method, output, float(seconds), now()])
        return cur.rowcount == 1

    def add_output(self, item: int, method: str, output: str, seconds: float) -> bool:
        """Stores an output once: False (and nothing written) when the item already has this arm's output."""
        with self.store.transaction() as db:
            return self._output(db, item, method, output, seconds)

    def missing(self, name: str) -> list[tuple[dict, str]]:
        """(item, method) pairs still to generate, method by method (a method's per-user work is done once)."""
        c = self.get(name)
        have = {(r["item"], r["method"]) for r in self.store.query(
            "SELECT o.item, o.method FROM campaign_outputs o JOIN campaign_items i ON i.id = o.item "
            "WHERE i.campaign = ?", [c["id"]])}
        items = self.items(name)
        return [(it, m) for m in c["config"].methods for it in items if (it["id"], m) not in have]

    def outputs(self, name: str) -> dict:
        c = self.get(name)
        n_items = self.store.query("SELECT COUNT(*) AS n FROM campaign_items WHERE campaign = ?", [c["id"]])[0]["n"]
        done = self.store.query("SELECT COUNT(*) AS n FROM campaign_outputs o JOIN campaign_items i ON i.id = o.item "
                                "WHERE i.campaign = ?", [c["id"]])[0]["n"]
        per_item = len(c["config"].arms) + (1 if c["config"].attention_every else 0)
        return {"done": done, "total": n_items * per_item}

    # ------------------------------------------------------------ assignment
    def next(self, name: str, rater: str) -> Assignment | None:
        """The rater's pending unit, else a new one among the units whose outputs are ready and that this rater
        has not seen: first a unit others started that has fewer than `min_raters_per_unit` judgments (pending
        ones count), else the least-rated one; ties at random; None when nothing is left for them."""
        rater = rater_id(rater)
        c = self.get(name)
        if c["status"] != "open":
            raise CampaignError(f"campaign {c['name']!r} is closed")
        cfg: CampaignConfig = c["config"]
        with self.store.transaction() as db:
            row = db.execute("SELECT id FROM campaign_assignments WHERE campaign = ? AND rater = ? AND "
                             "status = 'pending' ORDER BY id LIMIT 1", [c["id"], rater]).fetchone()
            if row:
                aid = row[0]
            else:
                n_seen = db.execute("SELECT COUNT(*) FROM campaign_assignments WHERE campaign = ? AND rater = ?",
                                    [c["id"], rater]).fetchone()[0]
                want_check = bool(cfg.attention_every) and (n_seen + 1) % cfg.attention_every == 0
                unit = (self._pick(db, c["id"], cfg, rater, attention=True) if want_check else None) \
                    or self._pick(db, c["id"], cfg, rater, attention=False)
                if unit is None:
                    return None
                uid, orders = unit
                swapped = 0 if cfg.mode == "rubric" else (
                    int(orders[0] > orders[1]) if orders[0] != orders[1] else uid % 2)
                aid = db["campaign_assignments"].insert(
                    {"campaign": c["id"], "unit": uid, "rater": rater, "swapped": swapped, "status": "pending",
                     "served": now(), "served_at": time.time()}).last_pk
        return self._assignment(aid, c, rater)

    def _pick(self, db, cid: int, cfg: CampaignConfig, rater: str, attention: bool):
        ready = ("EXISTS (SELECT 1 FROM campaign_outputs o WHERE o.item = u.item AND o.method = u.method_a) AND "
                 "(u.method_b = '' OR EXISTS (SELECT 1 FROM campaign_outputs o WHERE o.item = u.item AND "
                 "o.method = u.method_b))")
        sql = f"""
            SELECT u.id,
              (SELECT COUNT(*) FROM campaign_judgments j WHERE j.unit = u.id AND j.source != 'judge') AS done,
              (SELECT COUNT(*) FROM campaign_assignments x WHERE x.unit = u.id AND x.status = 'pending'
                 AND x.served_at > ?) AS pending,
              (SELECT COUNT(*) FROM campaign_assignments x WHERE x.unit = u.id AND x.status != 'skipped'
                 AND x.swapped = 0) AS plain,
              (SELECT COUNT(*) FROM campaign_assignments x WHERE x.unit = u.id AND x.status != 'skipped'
                 AND x.swapped = 1) AS flipped
            FROM campaign_units u
            WHERE u.campaign = ? AND u.attention = ? AND {ready}
              AND NOT EXISTS (SELECT 1 FROM campaign_assignments x WHERE x.unit = u.id AND x.rater = ?)
              AND NOT EXISTS (SELECT 1 FROM campaign_judgments j WHERE j.unit = u.id AND j.rater = ?)"""
        rows = db.execute(sql, [time.time() - cfg.pending_ttl_s, cid, int(attention), rater, rater]).fetchall()
        if not attention:
            rows = [r for r in rows if r[1] < cfg.raters_per_item]
        if not rows:
            return None

        def rank(r) -> tuple[int, int]:  # started units short of the overlap first, then least-rated first
            load = r[1] + r[2]
            return (0 if not attention and 0 < load < cfg.min_raters_per_unit else 1), load

        best = min(rank(r) for r in rows)
        uid, _, _, plain, flipped = self.rng.choice([r for r in rows if rank(r) == best])
        return uid, (plain, flipped)

    def _assignment(self, aid: int, c: dict, rater: str) -> Assignment:
        r = self.store.query(
            "SELECT a.id, a.swapped, u.method_a, u.method_b, u.attention, i.id AS item, i.user, i.prompt, i.history "
            "FROM campaign_assignments a JOIN campaign_units u ON u.id = a.unit JOIN campaign_items i ON i.id = u.item "
            "WHERE a.id = ?", [aid])[0]
        arms = tuple(m for m in (r["method_a"], r["method_b"]) if m)
        if r["swapped"]:
            arms = arms[::-1]
        out = {o["method"]: o["output"] for o in self.store.query(
            "SELECT method, output FROM campaign_outputs WHERE item = ?", [r["item"]])}
        done, total = self.rater_progress(c["name"], rater)
        return Assignment(aid, c["name"], c["config"].mode, r["user"], tuple(json.loads(r["history"])), r["prompt"],
                          tuple(out[m] for m in arms), arms, bool(r["attention"]), done, total)

    def rater_progress(self, name: str, rater: str) -> tuple[int, int]:
        """(judged, judged + still available to this rater): "12 of 40 done" (attention checks come on top)."""
        rater = rater_id(rater)
        c = self.get(name)
        cfg = c["config"]
        done = self.store.query("SELECT COUNT(*) AS n FROM campaign_judgments j JOIN campaign_units u ON u.id = j.unit "
                                "WHERE j.campaign = ? AND j.rater = ? AND u.attention = 0", [c["id"], rater])[0]["n"]
        open_units = self.store.query(
            "SELECT COUNT(*) AS n FROM campaign_units u WHERE u.campaign = ? AND u.attention = 0 "
            "AND (SELECT COUNT(*) FROM campaign_judgments j WHERE j.unit = u.id AND j.source != 'judge') < ? "
            "AND NOT EXISTS (SELECT 1 FROM campaign_judgments j WHERE j.unit = u.id AND j.rater = ?) "
            "AND NOT EXISTS (SELECT 1 FROM campaign_assignments x WHERE x.unit = u.id AND x.rater = ? "
            "AND x.status = 'skipped')", [c["id"], cfg.raters_per_item, rater, rater])[0]["n"]
        return done, done + open_units

    def submit(self, assignment: int, rater: str, verdict: str | None = None, scores: dict | None = None) -> int:
        """Stores the judgment of a pending assignment (the shown order's verdict, or rubric scores) once."""
        rater = rater_id(rater)
        with self.store.transaction() as db:
            row = db.execute("SELECT a.campaign, a.unit, a.rater, a.swapped, a.status, a.served, a.served_at, "
                             "c.config, c.status FROM campaign_assignments a JOIN campaigns c ON c.id = a.campaign "
                             "WHERE a.id = ?", [assignment]).fetchone()
            if row is None or row[2] != rater:
                raise CampaignError("this judgment is not yours or no longer exists: load the next one")
            if row[4] != "pending":
                raise CampaignError("this unit was already judged or skipped: load the next one")
            if row[8] != "open":
                raise CampaignError("this campaign is closed")
            mode = CampaignConfig.from_json(row[7]).mode
            verdict, scores = judgment(mode, verdict, scores)
            jid = db["campaign_judgments"].insert(
                {"uid": uuid.uuid4().hex, "campaign": row[0], "unit": row[1], "rater": rater, "swapped": row[3],
                 "verdict": verdict, "scores": json.dumps(scores) if scores else None,
                 "seconds": round(time.time() - row[6], 3), "served": row[5], "created": now(),
                 "source": "rater"}).last_pk
            db.execute("UPDATE campaign_assignments SET status = 'done' WHERE id = ?", [assignment])
        return int(jid)

    def skip(self, assignment: int, rater: str) -> None:
        """The rater passes on this unit: others get it, this rater not again."""
        rater = rater_id(rater)
        with self.store.transaction() as db:
            cur = db.execute("UPDATE campaign_assignments SET status = 'skipped' WHERE id = ? AND rater = ? "
                             "AND status = 'pending'", [assignment, rater])
            if cur.rowcount != 1:
                raise CampaignError("nothing pending to skip: load the next one")

    def add_judge(self, name: str, unit: int, judge: str, verdict: str | None, scores: dict | None,
                  p_a: float | None = None) -> bool:
        """An LLM judge's judgment of a unit (canonical order), kept apart from the raters' (source 'judge');
        `p_a`, the judge's probability that the first arm wins, is kept beside a pairwise verdict."""
        c = self.get(name)
        verdict, scores = judgment(c["config"].mode, verdict, scores)
        if p_a is not None and c["config"].mode == "pairwise":
            scores = {"p_a": float(p_a)}
        with self.store.transaction() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO campaign_judgments (uid, campaign, unit, rater, swapped, verdict, scores, "
                "seconds, served, created, source) VALUES (?, ?, ?, ?, 0, ?, ?, NULL, NULL, ?, 'judge')",
                [uuid.uuid4().hex, c["id"], unit, judge, verdict, json.dumps(scores) if scores else None, now()])
            return cur.rowcount == 1

    def units(self, name: str, attention: bool = False) -> list[dict]:
        """The units with their item and outputs (for the LLM judge), in item order."""
        c = self.get(name)
        rows = self.store.query(
            "SELECT u.id, u.method_a, u.method_b, i.id AS item, i.position, i.user, i.prompt, i.history "
            "FROM campaign_units u JOIN campaign_items i ON i.id = u.item WHERE u.campaign = ? AND u.attention = ? "
            "ORDER BY i.position, u.id", [c["id"], int(attention)])
        outs = {(o["item"], o["method"]): o["output"] for o in self.store.query(
            "SELECT o.item, o.method, o.output FROM campaign_outputs o JOIN campaign_items i ON i.id = o.item "
            "WHERE i.campaign = ?", [c["id"]])}
        return [r | {"history": json.loads(r["history"]), "output_a": outs.get((r["item"], r["method_a"])),
                     "output_b": outs.get((r["item"], r["method_b"]))} for r in rows]

    # ------------------------------------------------------------ judgments, export, import
    def judgments(self, name: str, judge: bool = False) -> list[dict]:
        """One row per judgment as shown to the rater (export form), raters' or the judge's."""
        c = self.get(name)
        rows = self.store.query(
            "SELECT j.*, u.method_a AS first, u.method_b AS second, u.attention, i.position AS item, i.user, "
            "i.prompt, oa.output AS first_output, ob.output AS second_output FROM campaign_judgments j "
            "JOIN campaign_units u ON u.id = j.unit JOIN campaign_items i ON i.id = u.item "
            "LEFT JOIN campaign_outputs oa ON oa.item = u.item AND oa.method = u.method_a "
            "LEFT JOIN campaign_outputs ob ON ob.item = u.item AND ob.method = u.method_b "
            f"WHERE j.campaign = ? AND j.source {'=' if judge else '!='} 'judge' ORDER BY j.id", [c["id"]])
        out = []
        for r in rows:
            shown = [(r["first"], r["first_output"]), (r["second"], r["second_output"])]
            if r["swapped"]:
                shown = shown[::-1]
            (ma, oa), (mb, ob) = shown
            winner = None if r["verdict"] is None else (
                r["verdict"] if not r["swapped"] or r["verdict"] not in "ab" else {"a": "b", "b": "a"}[r["verdict"]])
            out.append({"campaign": c["name"], "uid": r["uid"], "item": r["item"], "user": r["user"],
                        "prompt": r["prompt"], "method_a": ma, "output_a": oa, "method_b": mb or None,
                        "output_b": ob if mb else None, "verdict": r["verdict"],
                        "scores": json.loads(r["scores"]) if r["scores"] else None, "rater": r["rater"],
                        "seconds": r["seconds"], "served": r["served"], "created": r["created"],
                        "attention": bool(r["attention"]), "source": r["source"],
                        "first": r["first"], "second": r["second"] or None, "winner": winner})
        return out

    def results(self, name: str, cfg: LeaderboardConfig = LeaderboardConfig()) -> dict:
        """The study's figures (campaign_report.results)."""
        return campaign_report.results(self, name, cfg)
