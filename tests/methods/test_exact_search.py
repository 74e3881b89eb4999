"""EXACT's attribute search over one cached prefix per pair and step (issue 12): the same margins as the
full-sequence pass, the same chosen attributes, on a tiny model and on the bundled one."""

from __future__ import annotations

import numpy as np
import pytest

from personalize.methods.exact import ExactConfig, ExactMethod

from test_methods_retrieval import ITEMS, QUERY, encoder, engine  # noqa: F401  (fixtures)

PAIRS = [(QUERY, "Fans party as team wins", "Team loses"), (ITEMS[0].x, "Parks win big", "A council vote"),
         (ITEMS[3].x, "Coffee boosts mouse memory", "Study on mice")]


def test_cached_margins_equal_the_full_sequence_pass(engine):  # noqa: F811
    m = ExactMethod(engine, cfg=ExactConfig(batch_size=5))
    rows = [(x, yw, yl, A) for x, yw, yl in PAIRS for A in [(), ("Formal",), ("Formal", "Humor"), ("Code", "Vivid")]]
    rows += [(x, yw, yl, ("Concise", a)) for x, yw, yl in PAIRS[:1] for a in ("Humor", "Direct", "Easy")]
    np.testing.assert_allclose(m.cached_margins(rows), m.lm_margins(rows), atol=1e-4)


def test_the_same_attributes_are_chosen(engine):  # noqa: F811
    new = ExactMethod(engine, cfg=ExactConfig(k=3)).select(PAIRS)
    old = ExactMethod(engine, cfg=ExactConfig(k=3, shared_prefix=False)).select(PAIRS)
    assert [e["attributes"] for e in new] == [e["attributes"] for e in old]
    assert [e["score"] for e in new] == pytest.approx([e["score"] for e in old], abs=1e-4)
