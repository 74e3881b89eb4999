"""RAG, PAG and EXACT (METHOD §2, §5) on a tiny random Llama and the bundled MiniLM encoder, with planted data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import personalize.methods.base as base_mod
import personalize.methods.pag as pag_mod
from personalize.methods.card.adapters import new_peft_model
from personalize.methods.card.config import LoraSettings
from personalize.methods.card.config import CardConfig
from personalize.data import TASKS, Item
from personalize.serving.settings import DecodingSettings
from personalize.methods.engine import Engine
from personalize.methods.base import UserContext, n_tokens
from personalize.methods.registry import get_method
from personalize.methods.exact import ATTRIBUTES, ExactConfig, ExactMethod, attributed, MEMORY_KIND
from personalize.methods.pag import PagMethod, SUMMARY_INSTRUCTION
from personalize.methods.rag import RagConfig, RagMethod
from personalize.lm.models import LM, load_encoder
from personalize.store import Store
from personalize.lm.tokens import TokenBudget

TASK = TASKS["headlines"]
BUDGET = TokenBudget(max_prompt_tokens=32, max_target_tokens=8)
SETTINGS = DecodingSettings(max_new_tokens=4)
ARTICLES = [  # (id, article, headline); only h2, h4, h5, h8 share words with QUERY
    ("h0", "city council approved new budget for parks", "Parks win big in budget"),
    ("h1", "local bakery won national bread contest", "Bakery takes bread crown"),
    ("h2", "football team lost in overtime", "Heartbreak in overtime"),
    ("h3", "study shows coffee improves memory in mice", "Coffee boosts mouse memory"),
    ("h4", "football fans celebrated first championship", "Fans party as team wins"),
    ("h5", "club hired coach before football season", "Club names new coach"),
    ("h6", "bread prices rise as wheat harvest fails", "Bread costs climb"),
    ("h7", "council debates parking fees downtown", "Parking fee fight"),
    ("h8", "concert fans queued overnight for tickets", "Fans camp out for tickets"),
]
ITEMS = [Item(y, TASK.prompt(a), i) for i, a, y in ARTICLES]
QUERY = TASK.prompt("football fans cheer championship")


@pytest.fixture(scope="module")
def encoder():
    return load_encoder()


@pytest.fixture()
def engine(tiny_model, tokenizer, encoder):
    model = new_peft_model(tiny_model, LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj")))
    cfg = CardConfig(budget=BUDGET, ks=(1,), default_k=1, decoding=SETTINGS)
    lm = LM(model=model, tokenizer=tokenizer, model_id="tiny", device=torch.device("cpu"))
    return Engine(cfg, lm, model, encoder, None, {}, TASK, {})


@pytest.fixture()
def store(tmp_path):
    s = Store(tmp_path / "studio.db")
    s.add_user("ann", ITEMS, TASK.name)
    s.add_user("bob", ITEMS[:1], TASK.name)
    yield s
    s.close()


def user(items=ITEMS, **kw) -> UserContext:
    return UserContext("ann", list(items), **kw)


# ---------------------------------------------------------------- RAG

def test_rag_retrieves_the_lexically_closest_items_into_the_prompt(engine):
    rag = RagMethod(engine)
    hits = rag.retrieve(user(), QUERY)
    ids = [ITEMS[i].id for i, _ in hits]
    assert set(ids) == {"h2", "h4", "h5", "h8"} and ids[0] == "h4"  # h4 shares three query words
    assert all(s > 0 for _, s in hits)
    prompt, _ = rag.build_prompt(user(), QUERY)
    assert prompt.endswith(QUERY)  # the task prompt comes last, whole
    for it in ITEMS:
        assert (it.y in prompt) == (it.id in ids)
    assert f"football fans celebrated first championship → Fans party as team wins" in prompt
    g = rag.generate(user(), [QUERY], SETTINGS)[0]
    assert g.trace[0]["retrieved"] == ids


def test_rag_context_stays_within_its_token_allowance(engine, tokenizer):
    long_items = [Item("word " * 60, TASK.prompt("football " * 80), f"l{i}") for i in range(6)]
    rag = RagMethod(engine, cfg=RagConfig(top_k=4, context_tokens=64))
    long_query = TASK.prompt("football " * 100)
    prompt, hits = rag.build_prompt(user(long_items), long_query)
    assert len(hits) == 4
    assert n_tokens(tokenizer, prompt) <= BUDGET.max_prompt_tokens + rag.extra_tokens
    for i, _ in hits:
        assert n_tokens(tokenizer, rag.line(user(long_items), i)) <= 64 // 4 + 2


def test_rag_free_form_items_show_only_their_output(engine):
    u = user(templated=frozenset({4}))
    assert RagMethod(engine).line(u, 4) == "Fans party as team wins"
    assert "→" in RagMethod(engine).line(u, 2)


def test_rag_lines_of_full_prompt_tasks_leave_out_their_instruction(engine):
    """Commit prompts are whole prompts that all open with one instruction: repeated in every retrieved line it
    matched every item and was what card_cad's amplified context copied (16 of 40 outputs,
    docs/results/2026-11-25-issue-23.md)."""
    from personalize.fitting.population import COMMIT_PROMPT

    task = TASKS["commit_subjects"]
    x = COMMIT_PROMPT.format(stat=" parser.py | 2 +-\n", diff="-old\n+new\n")
    assert x.startswith(task.fixed_start) and task.prefix == ""
    rag = RagMethod(engine)
    engine.task = task
    try:
        line = rag.line(user([Item("fix the parser", x, "c0")]), 0)
    finally:
        engine.task = TASK
    assert line.startswith("Files changed:") and line.endswith("→ fix the parser")
    assert task.instruction not in line


# ---------------------------------------------------------------- PAG

def test_pag_summary_is_generated_once_stored_and_reused(engine, store, monkeypatch):
    calls = []

    def counting(model, tok, prompts, *a, **kw):
        calls.extend(p for p in prompts if p.startswith(SUMMARY_INSTRUCTION))
        return real(model, tok, prompts, *a, **kw)

    real = pag_mod.generate
    monkeypatch.setattr(pag_mod, "generate", counting)
    pag = PagMethod(engine, store)
    first = pag.prepare(user())
    assert first["summary_generated"] and len(calls) == 1
    assert "Bakery takes bread crown" in calls[0]  # the user's texts are what is summarised
    assert store.blob("ann", "pag_summary", "summary")["summary"] == first["summary"]
    assert not pag.prepare(user())["summary_generated"]
    assert not PagMethod(engine, store).prepare(user())["summary_generated"]  # a new process reads the store
    g = pag.generate(user(), [QUERY], SETTINGS)[0]
    assert len(calls) == 1 and g.trace[0]["summary"] == first["summary"]
    assert PagMethod(engine, store).prepare(user(ITEMS[:3]))["summary_generated"]  # new history, new summary
    assert len(calls) == 2


# ---------------------------------------------------------------- EXACT

WEIGHTS = {"Concise": 3.0, "Formal": 2.5, "Direct": 2.0, "Humor": 0.1}


def planted(rows):
    """Additive weights plus a bonus that Humor earns only next to Concise: greedy must condition on A."""
    planted.calls.append(len(rows))
    return np.array([sum(WEIGHTS.get(a, 0.0) for a in A) + 5.0 * ({"Concise", "Humor"} <= set(A))
                     for _, _, _, A in rows])


def topical(rows):
    """A user who wants food prompts vivid and sports prompts short."""
    want = {"food": ("Vivid", "Storyteller", "Emotion"), "sport": ("Concise", "Direct", "Energy")}
    out = []
    for x, _, _, A in rows:
        topic = "food" if any(w in x for w in ("bread", "bakery", "coffee", "pasta")) else "sport"
        out.append(sum(3.0 - want[topic].index(a) if a in want[topic] else 0.0 for a in A))
    return np.array(out)


def test_library_is_seeds_004_table_4():
    assert len(ATTRIBUTES) == 42 and len(set(ATTRIBUTES)) == 42
    assert {"Base", "Internet Slang", "Tech Industry Priority", "Eco-friendly", "Old-fashioned"} <= set(ATTRIBUTES)
    assert all(d.strip() for d in ATTRIBUTES.values())
    assert attributed("Q", ["Direct", "Concise"]) == "Q\nAttributes: Direct, Concise"


def test_exact_greedy_picks_what_the_planted_scorer_prefers(engine):
    planted.calls = []
    m = ExactMethod(engine, score_fn=planted)
    pairs = [("x1", "w", "l"), ("x2", "w", "l")]
    sel = m.select(pairs)
    assert [s["attributes"] for s in sel] == [["Concise", "Humor", "Formal"]] * 2  # not the top-3 singletons
    assert sel[0]["score"] == pytest.approx(3.0 + 0.1 + 5.0 + 2.5) and sel[0]["base_score"] == 0.0
    # one call for the empty set, then one call per step holding every pair's candidates
    assert planted.calls == [2, 2 * 42, 2 * 41, 2 * 40]


def test_exact_lm_scorer_is_the_log_prob_margin_batched_or_not(engine):
    m = ExactMethod(engine, cfg=ExactConfig(batch_size=4))
    rows = [(QUERY, "Fans party", "Team loses", ()), (QUERY, "Fans party", "Team loses", ("Formal", "Humor")),
            (ITEMS[0].x, "Parks win", "A", ("Code",))]
    batched = m.lm_margins(rows)
    single = np.array([m.lm_margins([r])[0] for r in rows])
    np.testing.assert_allclose(batched, single, atol=1e-3)
    swapped = m.lm_margins([(x, yl, yw, A) for x, yw, yl, A in rows])
    np.testing.assert_allclose(swapped, -batched, atol=1e-4)
    assert abs(batched[0] - batched[1]) > 1e-4  # the attribute line changes the model's margin


def test_exact_memory_and_retrieval_of_the_nearest_prompts_attributes(engine, store, monkeypatch):
    m = ExactMethod(engine, store, score_fn=topical)
    info = m.prepare(user())
    assert info["memory"] == len(ITEMS) and len(store.blobs("ann", MEMORY_KIND)) == len(ITEMS)
    entry = store.blob("ann", MEMORY_KIND, ITEMS[1].x)
    assert entry["attributes"] == ["Vivid", "Storyteller", "Emotion"] and entry["source"] == "history"
    seen, real = [], base_mod.generate  # EXACT decodes through base.framed_generate

    def recording(model, tok, prompts, *a, **kw):
        seen.extend(prompts)
        return real(model, tok, prompts, *a, **kw)

    monkeypatch.setattr(base_mod, "generate", recording)
    food, sport = TASK.prompt("bakery sells fresh bread every morning"), TASK.prompt("football team wins the cup")
    gens = m.generate(user(), [food, sport], SETTINGS)
    assert gens[0].trace[0]["attributes"] == ["Vivid", "Storyteller", "Emotion"]
    assert gens[0].trace[0]["retrieved_prompt"] in (ITEMS[1].x, ITEMS[6].x)
    assert gens[1].trace[0]["attributes"] == ["Concise", "Direct", "Energy"]
    assert seen == [f"{food}\nAttributes: Vivid, Storyteller, Emotion", f"{sport}\nAttributes: Concise, Direct, Energy"]


def test_exact_ratings_and_feedback_change_the_memory(engine, store):
    pasta = TASK.prompt("a recipe for fresh pasta with tomato")
    store.add_rating("r1", pasta, "ann", "card", "Silky pasta, sunny sauce", "base", "Pasta recipe", "a", {})
    store.add_rating("r1", TASK.prompt("tie prompt"), "ann", "card", "x", "base", "y", "tie", {})
    store.add_rating("r1", TASK.prompt("bad prompt"), "ann", "card", "x", "base", "y", "both_bad", {})
    store.add_rating("r1", TASK.prompt("bob prompt"), "bob", "card", "x", "base", "y", "b", {})
    m = ExactMethod(engine, store, score_fn=topical)
    assert m.rating_pairs("ann") == [(pasta, "Silky pasta, sunny sauce", "Pasta recipe")]
    m.prepare(user(ITEMS[2:3]))  # one football item + the rating
    mem = m.memory("ann")
    assert set(mem) == {ITEMS[2].x, pasta} and mem[pasta]["source"] == "rating"
    assert mem[pasta]["attributes"] == ["Vivid", "Storyteller", "Emotion"]
    query = TASK.prompt("how to cook pasta at home")
    assert m.retrieve(user(), [query])[0][0]["prompt"] == pasta

    # feedback in the app: appended without a rebuild, seen by a new process through the store
    calls = []
    m.score_fn = lambda rows: calls.append(len(rows)) or topical(rows)
    coffee = TASK.prompt("coffee shop opens a second cafe")
    entry = m.add_feedback(user(), coffee, "Coffee crowd gets a second home", "Cafe opens")
    assert calls == [1, 42, 41, 40] and entry["source"] == "feedback"
    assert set(ExactMethod(engine, store).memory("ann")) == {ITEMS[2].x, pasta, coffee}
    with pytest.raises(ValueError, match="same text"):
        m.add_feedback(user(), coffee, "same", "same ")


# ---------------------------------------------------------------- little or no history, and the registry

@pytest.mark.parametrize("name", ["rag", "pag", "exact"])
def test_empty_history_is_a_clear_error(engine, name):
    m = get_method(name, engine)
    with pytest.raises(ValueError, match="at least one"):
        m.prepare(user([]))
    with pytest.raises(ValueError, match="at least one"):
        m.generate(user([]), [QUERY], SETTINGS)


@pytest.mark.parametrize("name", ["rag", "pag", "exact"])
def test_one_item_history_works_end_to_end(engine, name):
    """One item: RAG/PAG retrieve it, EXACT scores its single pair with the real model (no planted scorer)."""
    m = get_method(name, engine)
    m.prepare(user(ITEMS[:1]))
    g = m.generate(user(ITEMS[:1]), [QUERY], SETTINGS)[0]
    assert g.n_tokens >= 1 and g.trace
    if name == "exact":
        assert len(g.trace[0]["attributes"]) == 3 and set(g.trace[0]["attributes"]) <= set(ATTRIBUTES)
    else:
        assert g.trace[0]["retrieved"] == ["h0"]


def test_configs_are_validated():
    with pytest.raises(ValueError):
        RagConfig(top_k=0)
    with pytest.raises(ValueError):
        ExactConfig(k=0)
    with pytest.raises(ValueError):
        ExactConfig(library=("A", "A"))
    with pytest.raises(ValueError, match="cluster"):
        UserContext("ann", [], cluster=2, k=2)
    with pytest.raises(ValueError, match="prompt"):
        UserContext("ann", [Item("y")])
