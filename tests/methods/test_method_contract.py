"""One contract (methods/base.py) checked over every registered method, on the tiny built artifacts: its shape,
prepare / is_prepared, generate, and its rows decoded in a mixed batch beside other methods' rows giving
exactly what its own generate gives."""

from __future__ import annotations

import dataclasses

import pytest

from personalize.serving.rows import DecodeRow
from personalize.serving.generation import Generation
from personalize.methods.registry import REGISTRY
from personalize.methods.base import Method, UserContext
from personalize.methods.p2p import P2PConfig, P2PMethod, train_p2p
from personalize.methods.card.person import prepared_items
from personalize.methods.card import card_decode

from conftest import tiny_studio

PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: we won the match on Sunday"]


@pytest.fixture(scope="module")
def setup(tiny_artifacts, tmp_path_factory):
    st = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("contract"))
    name = sorted(st.runtime.demo_users)[0]
    st.histories.save_history(name, st.histories.demo_items(name), st.runtime.engine.task.name)
    st.fits.fit(name)
    prepared_items(st.runtime.engine, st.runtime.store, name)
    state = st.histories.user_state(name)
    user = UserContext.from_store(st.runtime.store, name, st.runtime.task, state.cluster, state.k, state.lam)
    # the tiny build has no hypernetwork: train one for two steps on the demo population
    users = {u: st.histories.demo_items(u)[:4] for u in sorted(st.runtime.demo_users)[:4]}
    hyper, _ = train_p2p(st.runtime.engine, st.runtime.engine.encoder, users, P2PConfig(steps=2, rank=2, hidden=16, eval_users=2))
    st.runtime.methods["p2p"] = P2PMethod(st.runtime.engine, st.runtime.store, P2PConfig(), hypernet=hyper)
    yield st, user
    st.runtime.store.close()


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_method_keeps_the_contract(setup, name):
    st, user = setup
    m = st.runtime.method(name)
    assert isinstance(m, Method) and m.name == name and isinstance(m.batch, str) and m.batch
    assert dataclasses.is_dataclass(m.config_class) and m.config_class.__dataclass_params__.frozen
    assert isinstance(m.cfg, m.config_class)
    assert isinstance(m.is_prepared(user), bool)
    info = m.prepare(user)
    assert isinstance(info, dict) and info["method"] == name
    assert m.is_prepared(user)
    s = st.runtime.engine.cfg.decoding
    alone = m.generate(user, PROMPTS, s)
    assert len(alone) == len(PROMPTS) and all(isinstance(g, Generation) and isinstance(g.text, str) for g in alone)
    rows = m.rows(user, PROMPTS, s)
    assert len(rows) == len(PROMPTS) and all(isinstance(r, DecodeRow) for r in rows)
    others = [DecodeRow("Paraphrase: a much longer prompt than the others, to pad them", st.runtime.engine.cfg.budget, s),
              *card_decode.rows(st.runtime.engine, [PROMPTS[0]], "cluster", 1, k=2, settings=s)]
    mixed = st.runtime.engine.decode_rows([others[0], *rows, others[1]])[1:-1]
    assert [(g.text, g.n_tokens) for g in mixed] == [(g.text, g.n_tokens) for g in alone]
    assert [g.trace for g in mixed] == [g.trace for g in alone] or name in ("card", "cope")  # tensors / by request


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_what_callers_read_of_a_method_lives_on_its_class(name, tmp_path):
    """Bench's rows, the studio's first-use line and a method's own files come from its class, not from a caller
    that knows its name: a method in bench's table says what it stores, a slow first use says what it does, and
    local_config gives a folder only to a method that keeps files per person and only the budgets its config has."""
    from personalize.catalog import BENCH_METHODS, BY_NAME
    from personalize.methods.registry import local_config

    cls = REGISTRY[name]
    if name in BENCH_METHODS:
        assert isinstance(cls.stored, str) and cls.stored
        assert name == "card" or callable(getattr(cls, "stored_bytes", None))
    if BY_NAME[name].slow_first_use:
        assert cls.first_use_note.format(max_pairs=4)
    cfg = local_config(name, tmp_path / name, max_pairs=4, report_loss=False)
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    assert set(cfg) <= fields and (("folder" in cfg) == bool(getattr(cls, "per_person_files", False)))
    cls.config_class(**cfg)  # a valid config
