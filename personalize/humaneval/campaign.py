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

import csv
import hashlib
import io
import json
import random
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Sequence

from personalize.humaneval import agreement
from personalize.humaneval.leaderboard import LeaderboardConfig, leaderboard
from personalize.catalog import ALL_METHODS
from personalize.store import CAMPAIGN_PREFIX, MAX_NAME, WINNERS, Store, StoreError, now

MODES = ("pairwise", "rubric")
CRITERIA = ("style", "content", "fluency")
REFERENCE, DEGENERATE = "reference", "degenerate"
INSTRUCTIONS = {
    "pairwise": "Which output is more like something this person would write?",
    "rubric": "Score the output from 1 (poor) to 5 (excellent): style — is it like something this person would "
              "write? content — does it do what the prompt asks? fluency — is it well-formed text?",
}
MAX_ITEMS = 1000


class CampaignError(StoreError):
    """A campaign request that cannot be carried out (unknown name, closed, bad verdict): nothing changed."""


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign compares and how; stored with it, so its results can always be traced to its settings."""

    methods: tuple[str, ...]
    reference: bool = False  # the person's real text takes part as one more blinded arm
    mode: str = "pairwise"
    raters_per_item: int = 3  # judgments wanted per unit
    attention_every: int = 0  # every n-th unit a rater gets is an attention check (0: none; needs the reference)
    alpha: float | None = None  # decoding settings (None: the build's)
    top_k: int | None = None
    max_new_tokens: int | None = None
    artifacts: str = ""  # the build's folder, as given
    build: str = ""  # the build's id: outputs come from this build only
    data: str | None = None  # the LaMP folder and split the items came from, when they did
    split: str | None = None
    sources: tuple[str, ...] = ()  # only people from these sources (the ones a build left out)
    task: str = ""
    history_shown: int = 20  # history items a rater can scroll through
    pending_ttl_s: float = 1800.0  # a pending assignment older than this no longer counts as a unit's load
    # a unit that has a judgment (or a pending one) goes to further raters until it has this many, before any
    # unrated unit is opened: the overlap Krippendorff's α needs. None: 2 (raters_per_item when that is 1);
    # 1: plain least-rated first (raters may then judge disjoint units, and α stays undefined)
    min_raters_per_unit: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "methods", tuple(dict.fromkeys(self.methods)))
        unknown = [m for m in self.methods if m not in ALL_METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}: choose among {', '.join(ALL_METHODS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if len(self.arms) < (2 if self.mode == "pairwise" else 1):
            raise ValueError("a pairwise campaign compares at least two arms (methods, or a method and the reference)")
        if not 1 <= self.raters_per_item <= 100:
            raise ValueError("raters per item must be between 1 and 100")
        if self.min_raters_per_unit is None:
            object.__setattr__(self, "min_raters_per_unit", min(2, self.raters_per_item))
        if not 1 <= self.min_raters_per_unit <= self.raters_per_item:
            raise ValueError(f"min raters per unit (before new units are opened) must be between 1 and the raters "
                             f"per item ({self.raters_per_item}), not {self.min_raters_per_unit}")
        if self.attention_every < 0 or (self.attention_every and not self.reference):
            raise ValueError("attention checks need the reference (--reference) and attention_every >= 0")
        if self.history_shown < 5 or self.pending_ttl_s <= 0:
            raise ValueError("history_shown >= 5 and pending_ttl_s > 0")

    @property
    def arms(self) -> tuple[str, ...]:
        return self.methods + ((REFERENCE,) if self.reference else ())

    @classmethod
    def from_json(cls, text: str) -> "CampaignConfig":
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: (tuple(v) if k in ("methods", "sources") else v) for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class CampaignItem:
    user: str
    prompt: str
    history: tuple[str, ...]  # what the rater sees of the person (a snapshot: later edits do not change it)
    reference: str | None = None


@dataclass(frozen=True)
class Assignment:
    """One unit as a rater sees it: the outputs in shown order; the arms' names are for the record, not shown."""

    id: int
    campaign: str
    mode: str
    user: str
    history: tuple[str, ...]
    prompt: str
    outputs: tuple[str, ...]
    arms: tuple[str, ...] = field(repr=False)
    attention: bool = False
    done: int = 0
    total: int = 0

    @property
    def instruction(self) -> str:
        return INSTRUCTIONS[self.mode]


def degenerate(text: str | None) -> str:
    """An output nobody attentive prefers to a person's real text: its first words, looped."""
    words = (text or "").split()[:3] or ["the"]
    return " ".join(words * 6)


def canonical_label(row: dict) -> str:
    """A pairwise judgment as the arm that won (or 'tie' / 'both_bad'), independent of the shown order."""
    v = row["winner"]
    return row["first"] if v == "a" else row["second"] if v == "b" else v


class Campaigns:
    """Campaigns in the studio's SQLite file: creation, the output pool, assignment, judgments, results."""

    def __init__(self, store: Store, seed: int | None = None):
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
                for a, b in pairs:
                    db["campaign_units"].insert({"campaign": cid, "item": iid, "method_a": a, "method_b": b,
                                                 "attention": 0})
                if cfg.attention_every:
                    self._output(db, iid, DEGENERATE, degenerate(it.reference), 0.0)
                    a, b = (REFERENCE, DEGENERATE) if cfg.mode == "pairwise" else (DEGENERATE, "")
                    db["campaign_units"].insert({"campaign": cid, "item": iid, "method_a": a, "method_b": b,
                                                 "attention": 1})
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
        rater = _rater(rater)
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
        rater = _rater(rater)
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
        rater = _rater(rater)
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
            verdict, scores = _judgment(mode, verdict, scores)
            jid = db["campaign_judgments"].insert(
                {"uid": uuid.uuid4().hex, "campaign": row[0], "unit": row[1], "rater": rater, "swapped": row[3],
                 "verdict": verdict, "scores": json.dumps(scores) if scores else None,
                 "seconds": round(time.time() - row[6], 3), "served": row[5], "created": now(),
                 "source": "rater"}).last_pk
            db.execute("UPDATE campaign_assignments SET status = 'done' WHERE id = ?", [assignment])
        return int(jid)

    def skip(self, assignment: int, rater: str) -> None:
        """The rater passes on this unit: others get it, this rater not again."""
        rater = _rater(rater)
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
        verdict, scores = _judgment(c["config"].mode, verdict, scores)
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

    def export(self, name: str, path: str | Path) -> tuple[Path, Path, int]:
        """One campaign's judgments as JSONL or CSV (by the extension) and a summary JSON beside it."""
        path = Path(path)
        if path.suffix not in (".jsonl", ".csv"):
            raise CampaignError(f"export to a .jsonl or .csv file, not {path.name!r}")
        rows = self.judgments(name)
        path.parent.mkdir(parents=True, exist_ok=True)
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
        _atomic(path, text)
        _atomic(summary, json.dumps(self.results(name), indent=2, ensure_ascii=False))
        return path, summary, len(rows)

    def import_judgments(self, name: str, path: str | Path) -> dict:
        """Merges judgments exported by another studio (JSONL or CSV) into this campaign: matched by item
        (user, prompt) and arms; a judgment already here (same uid, or same rater and unit) is not added again."""
        c = self.get(name)
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
                 for u in self.store.query("SELECT u.id, u.method_a, u.method_b, i.user, i.prompt FROM campaign_units u "
                                           "JOIN campaign_items i ON i.id = u.item WHERE u.campaign = ?", [c["id"]])}
        added = duplicate = unmatched = 0
        with self.store.transaction() as db:
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
                    verdict, scores = _judgment(c["config"].mode, r.get("verdict") or None, scores)
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

    # ------------------------------------------------------------ results
    def results(self, name: str, cfg: LeaderboardConfig = LeaderboardConfig()) -> dict:
        """The study's figures: strengths or rubric means with intervals, the reference's place, agreement
        (Krippendorff's α, position bias, each rater against the others), attention checks, the LLM judge."""
        c = self.get(name)
        conf: CampaignConfig = c["config"]
        rows = self.judgments(name)
        main = [r for r in rows if not r["attention"]]
        checks = [r for r in rows if r["attention"]]
        judge_rows = self.judgments(name, judge=True)
        res = {"name": c["name"], "status": c["status"], "mode": conf.mode, "arms": list(conf.arms),
               "items": len(self.items(name)), "outputs": self.outputs(name), "judgments": len(main),
               "raters": len({r["rater"] for r in main}), "attention": _attention(checks, conf.mode),
               "min_raters_per_unit": conf.min_raters_per_unit}
        by_unit: dict[tuple, set] = {}
        for r in main:
            by_unit.setdefault((r["first"], r["second"], r["item"]), set()).add(r["rater"])
        shared = sum(len(v) >= 2 for v in by_unit.values())  # α is defined only over units two raters judged
        if conf.mode == "pairwise":
            human = _strengths(main, cfg)
            units = {}
            for r in main:
                units.setdefault((r["first"], r["second"], r["item"]), {})[r["rater"]] = canonical_label(r)
            res["agreement"] = {"krippendorff_alpha": agreement.krippendorff_alpha(units, "nominal"),
                                "position_bias": agreement.position_bias([r["verdict"] for r in main]),
                                "raters": agreement.rater_agreement(units), "shared_units": shared}
            res["leaderboard"] = human["methods"]
            judge_scores = _judge_wins(judge_rows) or {
                m["method"]: m["strength"] for m in _strengths(judge_rows, cfg)["methods"]}
            human_scores = {m["method"]: m["strength"] for m in human["methods"]}
        else:
            scored = [{"method": r["method_a"], **r["scores"]} for r in main if r["scores"]]
            res["leaderboard"] = agreement.rubric_means(scored, CRITERIA, seed=cfg.seed)
            per = {crit: {} for crit in CRITERIA}
            for r in main:
                for crit in CRITERIA:
                    per[crit].setdefault((r["first"], r["item"]), {})[r["rater"]] = r["scores"][crit]
            res["agreement"] = {"krippendorff_alpha": {k: agreement.krippendorff_alpha(u, "interval")
                                                       for k, u in per.items()},
                                "position_bias": None,
                                "raters": agreement.rater_agreement(per["style"]), "shared_units": shared}
            judge_scores = {m["method"]: m["mean"] for m in agreement.rubric_means(
                [{"method": r["method_a"], **r["scores"]} for r in judge_rows if r["scores"]], CRITERIA, n_boot=1)}
            human_scores = {m["method"]: m["mean"] for m in res["leaderboard"]}
        ranked = [m["method"] for m in res["leaderboard"]]
        res["reference"] = ({"rank": ranked.index(REFERENCE) + 1, "of": len(ranked)}
                            if REFERENCE in ranked else None)
        res["judge"] = None if not judge_rows else {
            "model": judge_rows[0]["rater"], "judgments": len(judge_rows), "scores": judge_scores,
            "verdicts": dict(Counter(r["verdict"] for r in judge_rows if r["verdict"])),
            "rank_correlation": agreement.rank_correlation(human_scores, judge_scores)}
        return res


def _strengths(rows: Sequence[dict], cfg: LeaderboardConfig) -> dict:
    """Bradley–Terry over the judgments in canonical order (first vs second arm, the winner unswapped)."""
    return leaderboard([{"method_a": r["first"], "method_b": r["second"], "winner": r["winner"]}
                        for r in rows if r["winner"]], cfg)


def _judge_wins(rows: Sequence[dict]) -> dict[str, float]:
    """Each arm's mean probability of winning by the judge (its p_a, not its thresholded verdict): a weak judge
    whose verdicts are mostly ties still ranks the arms. Empty when the judge kept no probabilities."""
    wins: dict[str, list[float]] = {}
    for r in rows:
        p = (r["scores"] or {}).get("p_a")
        if p is None:
            return {}
        wins.setdefault(r["first"], []).append(p)
        wins.setdefault(r["second"], []).append(1 - p)
    return {m: round(sum(v) / len(v), 4) for m, v in wins.items()}


def _attention(rows: Sequence[dict], mode: str) -> dict:
    """Pass rate of the attention checks, overall and per rater (the reference preferred to the degenerate
    output; in rubric mode the degenerate output scored 2 or less on average)."""
    def passed(r):
        if mode == "pairwise":
            return canonical_label(r) == REFERENCE
        return sum(r["scores"].values()) / len(r["scores"]) <= 2
    per: dict[str, list[bool]] = {}
    for r in rows:
        per.setdefault(r["rater"], []).append(passed(r))
    every = [p for v in per.values() for p in v]
    return {"checks": len(every), "pass_rate": (sum(every) / len(every)) if every else None,
            "raters": {k: round(sum(v) / len(v), 3) for k, v in per.items()}}


def _judgment(mode: str, verdict: str | None, scores: dict | None) -> tuple[str | None, dict | None]:
    if mode == "pairwise":
        if verdict not in WINNERS:
            raise CampaignError(f"a pairwise judgment is one of {', '.join(WINNERS)}, not {verdict!r}")
        return verdict, None
    if not isinstance(scores, dict) or set(scores) != set(CRITERIA):
        raise CampaignError(f"a rubric judgment scores {', '.join(CRITERIA)} from 1 to 5")
    try:
        clean = {k: float(scores[k]) for k in CRITERIA}
    except (TypeError, ValueError):
        raise CampaignError("rubric scores are numbers from 1 to 5") from None
    if any(not 1 <= v <= 5 for v in clean.values()):
        raise CampaignError("rubric scores are numbers from 1 to 5")
    return None, clean


def _rater(rater: str | None) -> str:
    if not isinstance(rater, str) or not rater.strip():
        raise CampaignError("enter a rater id first")
    return rater.strip()[:64]


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# ------------------------------------------------------------ items from a LaMP folder, and generation

def lamp_items(folder: str | Path, split: str, limit: int, history_shown: int = 20, sources: Sequence[str] = ()):
    """The first `limit` queries of a LaMP split (of people from `sources` only, when given: people a build left
    out) as campaign items: (task, items, {user: profile items})."""
    from personalize.data import select_sources
    from personalize.data import read_lamp

    if limit < 1:
        raise CampaignError("--limit must be at least 1")
    task, queries = read_lamp(folder, split)
    picked = [q for q in select_sources(queries, tuple(sources)) if len(q.profile) >= 1][:limit]
    if not picked:
        raise CampaignError(f"no queries with a profile in {folder} ({split})")
    items, profiles = [], {}
    for q in picked:
        user = (q.user or q.id)[:64]
        profiles[user] = list(q.profile)
        items.append(CampaignItem(user, q.input, tuple(it.y for it in q.profile[:history_shown]), q.gold))
    return task, items, profiles


def person_name(task: str, user: str, history: Sequence[str]) -> str:
    """The name a campaign's person is stored under for generation: in the store's reserved campaign namespace
    (kept out of the studio's users, so a LaMP folder's people never mix with the studio's own), keyed by the
    task, the person's id and the history the raters see, so the same id with another profile (another folder
    or task) is another stored person, and the same person in two campaigns is stored and fitted once."""
    key = hashlib.sha1(json.dumps([task, user, list(history)]).encode()).hexdigest()[:8]
    return f"{CAMPAIGN_PREFIX}{key}:{user}"[:MAX_NAME].rstrip()


def _stored_person(store: Store, task: str, item: dict) -> str:
    """The stored user whose style generates an item's outputs: the campaign's own copy of the person, else (a
    campaign made before people were kept apart, or over the studio's own users) the user of that name."""
    own = person_name(task, item["user"], item["history"])
    return own if store.query("SELECT 1 FROM users WHERE name = ?", [own]) else item["user"]


def create_from_lamp(store: Store, name: str, data: str | Path, split: str, limit: int, artifacts: str | Path,
                     build: str, task: str, sources: Sequence[str] = (), **settings) -> dict:
    """A campaign over the first `limit` queries of a LaMP split, for the build `artifacts` serving `task`; each
    query's person is stored from their profile for generation, apart from the studio's users (person_name:
    a studio user of the same name is neither shown their history nor changed)."""
    lamp_task, items, profiles = lamp_items(data, split, int(limit), sources=sources)
    if lamp_task.name != task:
        raise CampaignError(f"{data} is a {lamp_task.name} folder, but the build serves {task}")
    cfg = CampaignConfig(artifacts=str(artifacts), build=build, data=str(data), split=split, task=task,
                         sources=tuple(sources), **settings)
    camps = Campaigns(store)
    if (name or "").strip() in camps.names():
        raise CampaignError(f"a campaign named {name.strip()!r} exists already")
    known = {u["name"] for u in store.users(campaign=True)}
    for it in items:
        stored = person_name(task, it.user, it.history[: cfg.history_shown])
        if stored not in known:
            store.add_user(stored, profiles[it.user], task, campaign=True)
            known.add(stored)
    return camps.create(name, items, cfg)


def generate(studio, name: str, progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Fills the campaign's output pool, method by method; resumable: what is stored is not generated again, and
    each output is stored the moment it exists, so a kill loses at most the one being decoded."""
    camps = studio.campaigns
    c = camps.get(name)
    cfg: CampaignConfig = c["config"]
    if cfg.build and cfg.build != studio.engine.artifacts_id:
        raise CampaignError(f"campaign {name!r} was made for build {cfg.build} ({cfg.artifacts}); the studio runs "
                            f"{studio.engine.artifacts_id}: generate with that build")
    todo = camps.missing(name)
    s = studio.settings(cfg.alpha, cfg.top_k, cfg.max_new_tokens)
    fitted: set[str] = set()
    made, failed, t0 = 0, [], time.perf_counter()
    for i, (item, method) in enumerate(todo):
        if progress:
            progress(i, len(todo), f"{method} for {item['user']}")
        user = _stored_person(studio.store, cfg.task, item)
        if method == "card" and user not in fitted and not studio.user_state(user).fitted:
            studio.fit(user)
        fitted.add(user)
        out = studio.run_method(method, studio.user_state(user), item["prompt"], s)
        if out.error:
            failed.append(f"{method} for {item['user']}: {out.error}")
            continue
        made += camps.add_output(item["id"], method, out.text, out.latency_s)
    if progress:
        progress(len(todo), len(todo), "done")
    return {"generated": made, "failed": failed, "outputs": camps.outputs(name),
            "seconds": round(time.perf_counter() - t0, 1)}


def run_judge(camps: Campaigns, name: str, judge, progress: Callable[[int, int, str], None] | None = None,
              lock=None) -> dict:
    """The LLM judge scores every unit whose outputs exist (units it judged already are kept): the campaign's
    ranking by the judge, next to the raters', answers RQ5."""
    from contextlib import nullcontext

    mode = camps.get(name)["config"].mode
    judged = {(r["first"], r["second"] or "", r["item"]) for r in camps.judgments(name, judge=True)}
    units = [u for u in camps.units(name) if (u["method_a"], u["method_b"], u["position"]) not in judged
             and u["output_a"] is not None and (not u["method_b"] or u["output_b"] is not None)]
    for i, u in enumerate(units):
        if progress:
            progress(i, len(units), f"unit {i + 1} of {len(units)}")
        with lock or nullcontext():
            if mode == "pairwise":
                v = judge.pairwise(u["history"], u["prompt"], u["output_a"], u["output_b"])
                verdict, scores, p_a = v["verdict"], None, v.get("p_a")
            else:
                verdict, scores, p_a = None, judge.rubric(u["history"], u["prompt"], u["output_a"]), None
        camps.add_judge(name, u["id"], judge.label, verdict, scores, p_a)
    return {"judged": len(units)}


def overlap_text(res: dict) -> str:
    """How many units agreement is computed over: "agreement needs 2 raters on a unit: N units have them"."""
    n, m = res["agreement"].get("shared_units", 0), res.get("min_raters_per_unit") or 1
    return (f"agreement needs 2 raters on a unit: {n} unit{'' if n == 1 else 's'} {'has' if n == 1 else 'have'} "
            f"them (a started unit goes to {m} rater{'' if m == 1 else 's'} before new ones open)")


def format_status(res: dict) -> str:
    """`campaign status` for a terminal: progress, the leaderboard, agreement, attention, the judge."""
    def num(v, fmt="{:.3f}"):
        return "—" if v is None else fmt.format(v)
    ag = res["agreement"]
    lines = [f"campaign {res['name']} ({res['status']}, {res['mode']}): {res['items']} items, arms "
             f"{', '.join(res['arms'])}",
             f"outputs {res['outputs']['done']}/{res['outputs']['total']}; {res['judgments']} judgments by "
             f"{res['raters']} rater(s)"]
    if res["mode"] == "pairwise":
        lines.append("Bradley–Terry strength (Elo scale, 95% bootstrap interval):")
        lines += [f"  {m['method']:>10}  {m['strength']:7.1f}  [{m['lower']:.1f}, {m['upper']:.1f}]  {m['votes']} votes"
                  for m in res["leaderboard"]]
        pb = ag["position_bias"]
        lines.append(f"Krippendorff's α (nominal): {num(ag['krippendorff_alpha'])}; position bias: A won "
                     f"{num(pb['a_share'], '{:.0%}')} of {pb['n']} decided [{num(pb['lower'], '{:.0%}')}, "
                     f"{num(pb['upper'], '{:.0%}')}]")
    else:
        lines.append("Mean rubric scores (1–5, 95% bootstrap interval):")
        lines += [f"  {m['method']:>10}  " + "  ".join(f"{c} {m[c]:.2f} [{m[c + '_lower']:.2f}, {m[c + '_upper']:.2f}]"
                                                     for c in CRITERIA) for m in res["leaderboard"]]
        lines.append("Krippendorff's α (interval): " + ", ".join(f"{k} {num(v)}"
                                                               for k, v in ag["krippendorff_alpha"].items()))
    lines.append(f"  {overlap_text(res)}")
    if res["reference"]:
        lines.append(f"the reference ranks {res['reference']['rank']} of {res['reference']['of']}")
    lines += [f"  rater {r}: agrees with the others on {num(v['agreement'], '{:.0%}')} of {v['n']} shared units"
              for r, v in ag["raters"].items()]
    att = res["attention"]
    if att["checks"]:
        lines.append(f"attention checks: {att['checks']}, passed {num(att['pass_rate'], '{:.0%}')}")
    if res["judge"]:
        rc = res["judge"]["rank_correlation"]
        lines.append(f"LLM judge {res['judge']['model']}: {res['judge']['judgments']} judgments "
                     f"({', '.join(f'{k} {v}' for k, v in sorted(res['judge']['verdicts'].items()))}); rank correlation "
                     f"with the raters: Spearman {num(rc['spearman'])}, Kendall {num(rc['kendall'])} (n = {rc['n']})")
    return "\n".join(lines)
