"""A campaign's data (METHOD §6): what a campaign is (CampaignConfig), an item, an assignment as a rater sees it,
a valid judgment and rater id, and the modes, criteria and arms they use; the tables that hold them (TABLES: their
DDL, made by the store's migration step once a Store is given them, and what "forget me" clears in them). The
queries on them are campaign.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from personalize.catalog import ALL_METHODS
import sqlite_utils

from personalize.store import WINNERS, StoreError, Tables

MODES = ("pairwise", "rubric")
CRITERIA = ("style", "content", "fluency")
REFERENCE, DEGENERATE = "reference", "degenerate"
INSTRUCTIONS = {
    "pairwise": "Which output is more like something this person would write?",
    "rubric": "Score the output from 1 (poor) to 5 (excellent): style — is it like something this person would "
              "write? content — does it do what the prompt asks? fluency — is it well-formed text?",
}
MAX_ITEMS = 1000

# A campaign's rows outlive the studio's users: an item keeps a snapshot of the person's history, and forget
# anonymises it rather than deleting the judgments on it.
_DDL = """
CREATE TABLE IF NOT EXISTS campaigns (
  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, created TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('open', 'closed')), config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS campaign_items (
  id INTEGER PRIMARY KEY AUTOINCREMENT, campaign INTEGER NOT NULL REFERENCES campaigns(id), position INTEGER NOT NULL,
  user TEXT NOT NULL, prompt TEXT NOT NULL, reference TEXT, history TEXT NOT NULL, UNIQUE (campaign, position));
CREATE TABLE IF NOT EXISTS campaign_outputs (
  item INTEGER NOT NULL REFERENCES campaign_items(id), method TEXT NOT NULL, output TEXT NOT NULL,
  seconds REAL NOT NULL, created TEXT NOT NULL, PRIMARY KEY (item, method));
CREATE TABLE IF NOT EXISTS campaign_units (
  id INTEGER PRIMARY KEY AUTOINCREMENT, campaign INTEGER NOT NULL REFERENCES campaigns(id),
  item INTEGER NOT NULL REFERENCES campaign_items(id), method_a TEXT NOT NULL, method_b TEXT NOT NULL,
  attention INTEGER NOT NULL, UNIQUE (item, method_a, method_b));
CREATE TABLE IF NOT EXISTS campaign_assignments (
  id INTEGER PRIMARY KEY AUTOINCREMENT, campaign INTEGER NOT NULL REFERENCES campaigns(id),
  unit INTEGER NOT NULL REFERENCES campaign_units(id), rater TEXT NOT NULL, swapped INTEGER NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'done', 'skipped')), served TEXT NOT NULL, served_at REAL NOT NULL,
  UNIQUE (unit, rater));
CREATE INDEX IF NOT EXISTS idx_campaign_assignments_rater ON campaign_assignments(campaign, rater, status);
CREATE TABLE IF NOT EXISTS campaign_judgments (
  id INTEGER PRIMARY KEY AUTOINCREMENT, uid TEXT NOT NULL UNIQUE, campaign INTEGER NOT NULL REFERENCES campaigns(id),
  unit INTEGER NOT NULL REFERENCES campaign_units(id), rater TEXT NOT NULL, swapped INTEGER NOT NULL,
  verdict TEXT CHECK (verdict IN ('a', 'b', 'tie', 'both_bad')), scores TEXT, seconds REAL, served TEXT,
  created TEXT NOT NULL, source TEXT NOT NULL CHECK (source IN ('rater', 'import', 'judge')), UNIQUE (unit, rater));
CREATE INDEX IF NOT EXISTS idx_campaign_judgments ON campaign_judgments(campaign, source);
"""


def _forget(db: sqlite_utils.Database, name: str) -> dict[str, int]:
    """The person's campaign items: the judgments keep their verdicts, their texts and outputs go."""
    n = db["campaign_items"].count_where("user = ?", [name])
    db.execute("UPDATE campaign_outputs SET output = '' WHERE item IN "
               "(SELECT id FROM campaign_items WHERE user = ?)", [name])
    db.execute("UPDATE campaign_items SET user = '(forgotten ' || id || ')', prompt = '', reference = NULL, "
               "history = '[]' WHERE user = ?", [name])
    return {"campaign_items_anonymised": n}


TABLES = Tables("campaigns", _DDL, _forget, ids=("campaign_assignments.rater", "campaign_judgments.rater"))


class CampaignError(StoreError):
    """A campaign request that cannot be carried out (unknown name, closed, bad verdict): nothing changed."""


DEFAULT_ITEMS = 10  # the first N queries a campaign takes when not told (CLI, desk and page alike)

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


def judgment(mode: str, verdict: str | None, scores: dict | None) -> tuple[str | None, dict | None]:
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


def rater_id(rater: str | None) -> str:
    if not isinstance(rater, str) or not rater.strip():
        raise CampaignError("enter a rater id first")
    return rater.strip()[:64]
