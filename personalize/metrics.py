"""Evaluation metrics (METHOD §6): ROUGE-1 / ROUGE-L F1 with stemming, macro-averaged over queries; whether an
output repeats one of the person's past texts, and ROUGE-L that counts such a copy as a miss (issue 57); whether an
output loops or echoes its prompt's scaffold (issue 36)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np


@lru_cache(maxsize=1)
def _scorer():
    """Made on first use: rouge-score pulls in nltk, which the app's start does not need."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def _scores(predictions: Sequence[str], golds: Sequence[str]) -> list[dict]:
    if len(predictions) != len(golds):
        raise ValueError("predictions and golds differ in length")
    return [_scorer().score(g, p) for p, g in zip(predictions, golds)]


def rouge_per_query(predictions: Sequence[str], golds: Sequence[str]) -> list[float]:
    """ROUGE-L F1 of each query (for paired bootstrap intervals)."""
    return [s["rougeL"].fmeasure for s in _scores(predictions, golds)]


def rouge_scores(predictions: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    scores = _scores(predictions, golds)
    if not scores:
        return {"rouge1": 0.0, "rougeL": 0.0, "n": 0}
    return {k: sum(s[k].fmeasure for s in scores) / len(scores) for k in ("rouge1", "rougeL")} | {"n": len(scores)}


NEAR = 0.8  # ROUGE-L F1 from which two texts count as the same text (issue 57's "within ROUGE-L 0.8")


def plain_words(text: str) -> str:
    """The text's words, lowercase, punctuation and spacing aside: what "word for word" compares."""
    return " ".join(re.findall(r"\w+", text.lower()))


@dataclass(frozen=True)
class Repeat:
    """Which past text an output repeats (its index in the list given) and whether word for word."""

    index: int
    exact: bool


def repeated_text(output: str, past: Sequence[str], near: float = NEAR) -> Repeat | None:
    """The past text `output` repeats: the first one equal to it word for word, else the closest one within ROUGE-L
    `near`; None when it repeats none (an empty output repeats nothing). A line of two or more words counts on its
    own too: a past text handed back with more lines after it is handed back all the same. Why: ROUGE-L against one
    gold scores a person's old text handed back as a style match; the product counts it as a text not written for
    the prompt."""
    texts = [plain_words(t) for t in past]
    lines = [line for line in output.strip().splitlines() if len(plain_words(line).split()) >= 2]
    parts = [p for p in [output, *(lines if "\n" in output.strip() else [])] if plain_words(p)]
    for part in parts:
        if plain_words(part) in texts:
            return Repeat(texts.index(plain_words(part)), True)
    scored = [(_scorer().score(t, part)["rougeL"].fmeasure, i)
              for part in parts for i, t in enumerate(past) if texts[i]]
    best = max(scored, default=(0.0, -1))
    return Repeat(best[1], False) if best[0] >= near else None


def copy_aware(predictions: Sequence[str], golds: Sequence[str], pasts: Sequence[Sequence[str]],
               near: float = NEAR) -> dict:
    """Copying, per query and on average: `rougeL_copy_aware` is ROUGE-L against the gold, 0 for an output that
    repeats one of its person's past texts (`pasts[i]`) unless it is also within ROUGE-L `near` of the gold (the
    answer itself); `repeats` / `repeats_near` the shares of outputs that repeat a past text word for word / at all.
    `per_query`: the copy-aware scores (for paired intervals)."""
    raw = rouge_per_query(predictions, golds)
    found = [repeated_text(p, past, near) for p, past in zip(predictions, pasts)]
    per = [0.0 if r is not None and s < near and plain_words(p) != plain_words(g) else s
           for p, g, s, r in zip(predictions, golds, raw, found)]
    return {"rougeL_copy_aware": sum(per) / max(len(per), 1), **_shares(found), "per_query": per}


def repeat_shares(texts: Sequence[str], pasts: Sequence[Sequence[str]], near: float = NEAR) -> dict:
    """The shares of `texts` that repeat their person's past text word for word and at all (the golds': how often
    people repeat themselves, the rate a method's copying is held to)."""
    return _shares([repeated_text(t, past, near) for t, past in zip(texts, pasts)])


def _shares(found: Sequence[Repeat | None]) -> dict:
    n = max(len(found), 1)
    return {"repeats": sum(bool(r and r.exact) for r in found) / n,
            "repeats_near": sum(r is not None for r in found) / n}


_UNIT = re.compile(r"\w+|[^\w\s]+")  # a word, or a run of punctuation ("...", "****" are one unit each)


def text_units(text: str) -> list[str]:
    """The units the loop check counts, lowercase: words and runs of punctuation. Not the model's tokens, so that
    every method and model is measured alike ("dev-dev-dev" is dev, -, dev, -, dev)."""
    return _UNIT.findall(text.lower())


def looping(text: str, max_n: int = 6, times: int = 3, cover: float = 0.5) -> bool:
    """True when the text loops (issue 36's check): some n-gram of up to `max_n` units (text_units) occurs
    `times` times back to back anywhere ("dev-dev-dev-dev", "Synthesizer. Synthesizer. Synthesizer."), or one
    phrase of up to `max_n` units, seen at least `times` times, covers over `cover` of the units ("The previous
    response was: a The previous response was: b The previous response was: c")."""
    w = text_units(text)
    for n in range(1, max_n + 1):
        for i in range(len(w) - times * n + 1):
            if all(w[i + j * n: i + (j + 1) * n] == w[i: i + n] for j in range(1, times)):
                return True
    for n in range(1, max_n + 1):
        counts = Counter(tuple(w[i: i + n]) for i in range(len(w) - n + 1))
        if any(c >= times and c * n > cover * len(w) for c in counts.values()):
            return True
    return False


def _norm(line: str) -> str:
    return " ".join(line.lower().split())


def echoes(text: str, scaffold: Sequence[str], min_words: int = 3) -> bool:
    """True when the output repeats a line of the prompt's scaffold (its instruction, a retrieved-item header):
    a scaffold line of `min_words` or more words inside the output, or an output line of that many words that
    begins one (an echo cut short by the token budget). `scaffold`: the lines no output should repeat."""
    lines = [_norm(s) for s in scaffold]
    lines = [s for s in lines if len(s.split()) >= min_words]
    if not lines:
        return False
    flat = _norm(text)
    outs = [o for o in (_norm(x) for x in text.splitlines()) if len(o.split()) >= min_words]
    return any(s in flat for s in lines) or any(s.startswith(o) for o in outs for s in lines)


def paired_interval(d: np.ndarray, n_boot: int = 1000, seed: int = 0, rng: np.random.Generator | None = None) -> dict:
    """Mean of paired differences with its bootstrap 95 % interval (the pairs resampled), wins and losses."""
    rng = rng or np.random.default_rng(seed)
    d = np.asarray(d, dtype=float)
    boots = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": round(float(d.mean()), 4), "ci95": [round(float(lo), 4), round(float(hi), 4)],
            "wins": int((d > 0).sum()), "losses": int((d < 0).sum()), "n": len(d)}
