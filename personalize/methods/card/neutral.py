"""Neutral rewrites of free-form history items (METHOD §1.8): the content of a text without its style.

The base model writes the rewrite; a small model often echoes the instruction
or drops the content instead (SmolLM2-135M on emoji-heavy tweets answered
"Rewrite the following text in plain, neutral English: ☺🔥🔥"). Such a rewrite
would become the prompt of every pair, so it is checked, and when it fails the
item gets a rule-based plain version: no emoji or hashtags marks, no shouting
case, no repeated punctuation. Style gone, content kept, which is all §1.8 asks. A rewrite that adds content
the text lacks (a number, new words) fails the check too.
"""

from __future__ import annotations

import re
from typing import Sequence

from personalize.serving.rows import DecodeRow
from personalize.serving.settings import DecodingSettings

NEUTRAL_TEMPLATE = "Rewrite the following text in plain, neutral English: {text}"

_SYMBOLS = re.compile(r"[^\w\s.,;:!?'\"()&%$@/-]", re.UNICODE)  # emoji, pictographs, decorations
_WORD = re.compile(r"[a-z0-9]+")
_ECHO = ("rewrite the following", "neutral english", "plain english")


def content_words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def plain(text: str) -> str:
    """A deterministic style-free version: symbols and '#' dropped, case and punctuation tamed."""
    t = _SYMBOLS.sub(" ", text.replace("#", " "))
    t = re.sub(r"([!?.,])\1+", r"\1", t)  # "!!!" -> "!"
    t = re.sub(r"\s+([.,;:!?])", r"\1", re.sub(r"\s+", " ", t)).strip()
    letters = [c for c in t if c.isalpha()]
    if letters and sum(c.isupper() for c in letters) > 0.5 * len(letters):
        t = t.lower()
    if t:
        t = t[0].upper() + t[1:]
        if t[-1] not in ".!?":
            t += "."
    return t or text


# words a plain rewrite may add without adding content ("gonna" -> "I am going to")
_FUNCTION = frozenset("""a an the and or but so of to in on at for with by from as into about than then is are was
were be been being am it its this that these those i you he she we they me him her us them my your his our their not
no do does did have has had will would can could should may might just very really there here what which who""".split())


def added_content(original: str, rewrite: str) -> set[str]:
    """The rewrite's words that the original lacks, function words aside."""
    return content_words(rewrite) - content_words(original) - _FUNCTION


def keeps_content(original: str, rewrite: str, max_added: float = 1 / 3) -> bool:
    """Whether a rewrite says no more than its text (issue 59): no number the text lacks, and at most a third as many
    new words as the text has (2 for a short one). A small model invents ("The latest version of the game is
    0.7.4"); a rewrite is shown to the person and is the prompt their style is fitted on, so it must not."""
    added = added_content(original, rewrite)
    if any(c.isdigit() for w in added for c in w):
        return False
    return len(added) <= max(2, max_added * len(content_words(original)))


def accept(original: str, rewrite: str, min_recall: float = 0.5) -> bool:
    """A rewrite is usable when it does not echo the instruction, keeps most of the content words and adds none
    of its own (keeps_content)."""
    low = rewrite.lower()
    if not rewrite.strip() or any(e in low for e in _ECHO):
        return False
    words = content_words(original)
    kept = not words or len(words & content_words(rewrite)) >= min_recall * len(words)
    return kept and keeps_content(original, rewrite)


def neutral(original: str, rewrite: str) -> str:
    return rewrite.strip() if accept(original, rewrite) else plain(original)


def raw_rewrites(engine, texts: Sequence[str], batch_size: int = 32) -> list[str]:
    """The base model's rewrites as decoded, all in one mixed batch (Engine.decode_rows, the frozen LM) per
    `batch_size` texts of similar length, each row stopped at its own budget: 1.5x its text plus a little
    (the cost is the decoding steps; a 6-token subject line does not wait for a 40-token entry). Each is
    what the text decodes alone. Why one batch: Fit right after Save waited for the rewrites."""
    if not texts:
        return []
    lengths = [len(engine.tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    cap = engine.cfg.budget.max_target_tokens + 8
    out: list[str] = [""] * len(texts)
    for j in range(0, len(order), batch_size):
        idx = order[j: j + batch_size]
        rows = [DecodeRow(NEUTRAL_TEMPLATE.format(text=texts[i]), engine.cfg.budget,
                          DecodingSettings(max_new_tokens=min(cap, int(1.5 * lengths[i]) + 6))) for i in idx]
        for i, g in zip(idx, engine.decode_rows(rows)):
            out[i] = g.text
    return out
