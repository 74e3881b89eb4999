"""CARD's parts on tiny random models: clusters, pairs/features, the head, λ fits, decoding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from personalize.methods.card.adapters import add_warm_adapter, new_peft_model, sft_loss, train_adapter
from personalize.methods.card.config import LoraSettings
from personalize.methods.card.cluster import assign, fit_clusters
from personalize.methods.card.decoding import CardLogitsProcessor, card_generate
from personalize.serving.generation import generate
from personalize.serving.settings import DecodingSettings
from personalize.methods.card.style import (StyleTensors, UserStyle, fit_form, fit_lambda_bias,
    memory_from_features, style_scores)
from personalize.methods.card.config import StyleSettings
from personalize.lm.features import HiddenCapture, generate_with_states, teacher_forced
from personalize.methods.card.head import (PairData, PersonalizationHead, TokenData, diagnostics, fit_user,
    opening_key, train_population)
from personalize.methods.card.config import HeadSettings
from personalize.lm.tokens import TokenBudget

BUDGET = TokenBudget(max_prompt_tokens=24, max_target_tokens=8)
PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: coffee is ready", "Paraphrase: we won the match"]
LAMBDA_ONLY = StyleSettings(bias=False, memory=False, fallback=False)


def _styles(lam, n, style=LAMBDA_ONLY):
    return StyleTensors.of([UserStyle.of(np.asarray(lam, dtype=np.float32))] * n, style)


# ---------------------------------------------------------------- clusters

def test_kmeans_recovers_blobs_and_assigns_nearest():
    rng = np.random.default_rng(0)
    centers = np.eye(3, 8) * 5
    emb = np.concatenate([c + rng.normal(0, 0.1, (10, 8)) for c in centers]).astype(np.float32)
    cents = fit_clusters(emb, (1, 3))
    assert cents[1].shape == (1, 8) and cents[3].shape == (3, 8)
    labels = [assign(e, cents[3])[0] for e in emb]
    assert len(set(labels[:10])) == len(set(labels[10:20])) == len(set(labels[20:])) == 1
    assert len(set(labels)) == 3
    c, d = assign(centers[1], cents[3])
    assert d[c] == min(d) and len(d) == 3


def test_k_larger_than_population_is_refused():
    with pytest.raises(ValueError, match="not possible with 5 users"):
        fit_clusters(np.zeros((5, 4), np.float32), (1, 8))


# ---------------------------------------------------------------- features and pairs

def test_negatives_states_match_teacher_forced_states(tiny_model, tokenizer):
    """The states captured while generating y− are the states a teacher-forced pass gives (KV cache kept)."""
    negs = generate_with_states(tiny_model, tokenizer, PROMPTS, n_layers=2, budget=BUDGET, max_new_tokens=6)
    assert len(negs) == len(PROMPTS)
    for n in negs:
        assert n.h.shape == (len(n.ids), 2 * 32) and len(n.logprob) == len(n.ids) and len(n.ids) >= 1
    # teacher-force the generated tokens themselves (decode → encode may differ, so use ids directly)
    from personalize.lm.tokens import left_pad, prompt_ids

    seqs = [prompt_ids(tokenizer, x, BUDGET) + n.ids.tolist() for x, n in zip(PROMPTS, negs)]
    ids, mask = left_pad(seqs, tokenizer.pad_token_id)
    with HiddenCapture(tiny_model, 2) as cap:
        tiny_model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        h = cap.all()
    for j, n in enumerate(negs):
        T = len(n.ids)
        tf = h[j, ids.shape[1] - T - 1: ids.shape[1] - 1]
        torch.testing.assert_close(n.h.float(), tf.half().float(), atol=2e-2, rtol=2e-2)


def test_teacher_forced_features_cover_the_answer(tiny_model, tokenizer):
    feats = teacher_forced(tiny_model, tokenizer, [(PROMPTS[0], "late again"), (PROMPTS[1], "ok")], 4, BUDGET, top_k=5)
    for f, y in zip(feats, ["late again", "ok"]):
        expected = tokenizer(y, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert f.ids.tolist() == expected
        assert f.h.shape == (len(expected), 4 * 32) and f.top_ids.shape == (len(expected), 5)
        assert torch.all(f.logprob <= 0)


def test_teacher_forced_batches_by_length_and_answers_in_the_order_given(tiny_model, tokenizer):
    """Examples are grouped by length inside (batch_size 2 here: the two short ones share a batch), yet each
    feature comes back at its example's place, the same as that example read alone."""
    texts = ["a much longer answer than the others, with many more tokens in it", "ok", "late again and again", "no"]
    examples = [(PROMPTS[i % len(PROMPTS)], y) for i, y in enumerate(texts)]
    feats = teacher_forced(tiny_model, tokenizer, examples, 2, BUDGET, top_k=5, batch_size=2)
    assert [f.text for f in feats] == texts
    for ex, f in zip(examples, feats):
        (alone,) = teacher_forced(tiny_model, tokenizer, [ex], 2, BUDGET, top_k=5)
        assert torch.equal(f.ids, alone.ids) and torch.equal(f.top_ids, alone.top_ids)
        assert torch.allclose(f.logprob, alone.logprob, atol=1e-4)


def test_pair_data_is_user_text_against_cluster_output(tiny_model, tokenizer):
    from personalize.methods.card.head import PairData

    chosen = teacher_forced(tiny_model, tokenizer, [(p, "MY STYLE!!") for p in PROMPTS], 2, BUDGET)
    rejected = generate_with_states(tiny_model, tokenizer, PROMPTS, 2, BUDGET, max_new_tokens=5)
    pairs = PairData(chosen, rejected)
    assert len(pairs) == 3 and all(c.text == "MY STYLE!!" for c in pairs.chosen)
    assert all(r.text != "MY STYLE!!" for r in pairs.rejected)


# ---------------------------------------------------------------- head and λ fits

def _head(d=8, vocab=40, in_dim=12, seed=0):
    torch.manual_seed(seed)
    head = PersonalizationHead(in_dim, vocab, d)
    torch.nn.init.normal_(head.U, std=1.0)
    torch.nn.init.normal_(head.P.weight, std=0.5)
    return head.requires_grad_(False)


def test_token_fit_recovers_planted_vector():
    head, d = _head(), 8
    planted = torch.ones(d) + torch.randn(d)
    n, k = 3000, 6
    h, cand = torch.randn(n, 12), torch.randint(0, 40, (n, k))
    base = torch.randn(n, k)
    logits = base + head.correction(h, planted, cand)
    target = torch.distributions.Categorical(logits=logits).sample()
    lam, curve = fit_user(head, TokenData(h, cand, base, target), HeadSettings(d=d, rho=0.0, fit_iters=100))
    assert torch.nn.functional.cosine_similarity(lam, planted, dim=0) > 0.97
    assert (lam - planted).norm() / planted.norm() < 0.2
    assert curve[-1] < curve[0]


def test_pair_fit_recovers_planted_direction():
    from personalize.lm.features import SequenceFeatures

    head, d = _head(), 8
    planted = torch.ones(d) + 2 * torch.randn(d)
    chosen, rejected = [], []
    g = torch.Generator().manual_seed(1)
    for _ in range(800):
        a = SequenceFeatures("a", torch.randint(0, 40, (5,), generator=g), torch.randn(5, 12, generator=g), torch.zeros(5))
        b = SequenceFeatures("b", torch.randint(0, 40, (5,), generator=g), torch.randn(5, 12, generator=g), torch.zeros(5))
        p = torch.sigmoid(planted @ (head.phi(a) - head.phi(b)))
        (chosen.append(a), rejected.append(b)) if torch.rand(1, generator=g) < p else (chosen.append(b), rejected.append(a))
    lam, _ = fit_user(head, PairData(chosen, rejected), HeadSettings(d=d, rho=0.0, fit_iters=200))
    assert torch.nn.functional.cosine_similarity(lam, planted, dim=0) > 0.9


def _pair(g, lp):
    from personalize.lm.features import SequenceFeatures

    return SequenceFeatures("t", torch.randint(0, 40, (5,), generator=g), torch.randn(5, 12, generator=g),
                            torch.full((5,), float(lp)))


def test_hard_pairs_covariate_explains_likelihood_and_lambda_the_rest():
    """METHOD §1.9.3c: pairs whose outcome is γ·Δlogp + λ·Δφ. The fitted γ is positive, λ still recovers
    the planted direction, and the likelihood term alone gets fewer pairs right than the full logit."""
    head, d = _head(), 8
    planted = torch.ones(d) + 2 * torch.randn(d)
    g = torch.Generator().manual_seed(2)
    chosen, rejected = [], []
    for _ in range(1000):
        a, b = _pair(g, torch.randn(1, generator=g)), _pair(g, torch.randn(1, generator=g))
        logit = planted @ (head.phi(a) - head.phi(b)) + 2.0 * (a.mean_logprob - b.mean_logprob)
        (chosen.append(a), rejected.append(b)) if torch.rand(1, generator=g) < torch.sigmoid(logit) else \
            (chosen.append(b), rejected.append(a))
    s = HeadSettings(d=d, rho=0.0, fit_iters=200, objective="hard_pairs")
    data = PairData(chosen, rejected, covariate=True)
    from personalize.methods.card.head import fit_covariate

    gamma = fit_covariate(head, [data], s)
    assert gamma > 0.3 and float(head.gamma) == pytest.approx(gamma)
    lam, _ = fit_user(head, data, s)
    assert torch.nn.functional.cosine_similarity(lam, planted, dim=0) > 0.85
    diag = diagnostics(head, data, lam, [torch.ones(d)], s)
    assert diag["acc_own"] > diag["acc_covariate_only"] > 0.5
    # the same pairs without the covariate: γ plays no part, as in the paper's objective (a)
    plain = PairData(chosen, rejected)
    assert "acc_covariate_only" not in diagnostics(head, plain, lam, [], s)


def test_hard_pairs_split_keeps_every_negative_of_an_item_together():
    from personalize.methods.card.onboard import split_held_out

    g = torch.Generator().manual_seed(0)
    c = [_pair(g, 0) for _ in range(4)]
    data = PairData([c[0], c[1], c[2], c[3], c[0], c[1]], [_pair(g, -1) for _ in range(6)],
                    items=[0, 1, 2, 3, 0, 1], covariate=True)
    fit, held = split_held_out(data, 2, 4)
    assert sorted(held.items) == [0, 0, 1, 1] and sorted(fit.items) == [2, 3]
    assert held.covariate and fit.covariate and len(fit) + len(held) == len(data)
    with pytest.raises(ValueError, match="chosen against"):
        PairData(c, c[:2])


def test_other_users_negatives_come_from_the_same_cluster_only():
    from personalize.methods.card.build import _other_users_negatives

    g = torch.Generator().manual_seed(0)
    feats = {n: [_pair(g, 0) for _ in range(3)] for n in "abc"}
    data = {n: PairData(f, [_pair(g, -1) for _ in f], covariate=True) for n, f in feats.items()}
    out = _other_users_negatives(data, {"a": 0, "b": 0, "c": 1}, n_other=2, seed=0)
    ids = {n: {id(f) for f in fs} for n, fs in feats.items()}
    extra_a = out["a"].rejected[3:]
    assert len(extra_a) == 6 and all(id(f) in ids["b"] for f in extra_a)  # b's real texts, never c's
    assert out["a"].items == [0, 1, 2] + [0, 0, 1, 1, 2, 2]
    assert [id(f) for f in out["a"].chosen[3:]] == [id(feats["a"][i]) for i in (0, 0, 1, 1, 2, 2)]
    assert len(out["c"]) == 3  # alone in its cluster: no one else's text to contrast with


def test_population_training_learns_user_specific_vectors():
    """Two users who prefer opposite candidates: own λ must beat the other user's λ on held-out data."""
    torch.manual_seed(0)
    head = PersonalizationHead(12, 40, 8)
    s = HeadSettings(d=8, epochs=60, lr=3e-2, rho=0.0, batch_users=2)
    pref = {"a": torch.randn(8) * 3, "b": torch.randn(8) * 3}
    truth = _head(seed=3)

    def data(u, n):
        h, cand, base = torch.randn(n, 12), torch.randint(0, 40, (n, 6)), torch.zeros(n, 6)
        target = (base + truth.correction(h, pref[u], cand)).argmax(-1)
        return TokenData(h, cand, base, target)

    lams, curve = train_population(head, {"a": data("a", 400), "b": data("b", 400)}, s)
    assert curve[-1] < curve[0]
    d = diagnostics(head, data("a", 300), lams["a"], [lams["b"]], s)
    assert d["acc_own"] > d["acc_other"] and d["specificity_gap"] > 0


def test_head_weight_decay_shrinks_p_and_u_but_not_the_user_vectors():
    torch.manual_seed(0)
    h, cand = torch.randn(200, 12), torch.randint(0, 40, (200, 6))
    users = {"a": TokenData(h, cand, torch.zeros(200, 6), torch.randint(0, 6, (200,)))}
    norms = {}
    for wd in (0.0, 50.0):
        head = PersonalizationHead(12, 40, 8)
        lams, _ = train_population(head, users, HeadSettings(d=8, epochs=30, lr=1e-2, weight_decay=wd))
        norms[wd] = (head.U.norm().item(), head.P.weight.norm().item(), lams["a"].norm().item())
    assert norms[50.0][0] < norms[0.0][0] and norms[50.0][1] < norms[0.0][1]
    # λ keeps only its own prior (ρ towards 1): decayed too, it would be driven to 0 (here: it diverges)
    assert abs(norms[50.0][2] - 8 ** 0.5) < 0.5
    with pytest.raises(ValueError, match="weight_decay"):
        HeadSettings(weight_decay=-1.0)


# ---------------------------------------------------------------- decoding

def test_topk_restriction_and_correction_stay_in_candidates():
    head = _head(d=8, vocab=40, in_dim=12)

    class Cap:
        def last(self):
            return torch.randn(2, 12)

    proc = CardLogitsProcessor(head, _styles(np.ones(8) * 5, 2), LAMBDA_ONLY, Cap(), alpha=10.0, top_k=5)
    scores = torch.randn(2, 40)
    out = proc(torch.zeros(2, 1, dtype=torch.long), scores.clone())
    for row, s in zip(out, scores):
        finite = torch.isfinite(row).nonzero().squeeze(-1)
        assert set(finite.tolist()) == set(s.topk(5).indices.tolist())
    assert not torch.equal(out.argmax(-1), scores.argmax(-1)) or True  # re-ranking may or may not flip the top
    zero = CardLogitsProcessor(head, _styles(np.ones(8), 2), LAMBDA_ONLY, Cap(), alpha=0.0, top_k=5)(None, scores.clone())
    assert torch.equal(zero.argmax(-1), scores.argmax(-1))


def _peft_tiny(tiny_model):
    model = new_peft_model(tiny_model, LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj")))
    for n, p in model.named_parameters():  # a non-trivial adapter, so it changes outputs
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    return model


def test_alpha_zero_reproduces_cluster_greedy_and_alpha_changes_it(tiny_model, tokenizer):
    model = _peft_tiny(tiny_model)
    torch.manual_seed(1)
    head = PersonalizationHead(2 * 32, len(tokenizer), 8)
    torch.nn.init.normal_(head.U, std=1.0)
    head.requires_grad_(False)
    s = DecodingSettings(alpha=0.0, top_k=50, max_new_tokens=10)
    plain = generate(model, tokenizer, PROMPTS, BUDGET, s)
    ones, minus = [UserStyle.of(np.ones(8, np.float32))] * 3, [UserStyle.of(-np.ones(8, np.float32))] * 3
    card0 = card_generate(model, tokenizer, PROMPTS, BUDGET, s, head=head, styles=ones, style=LAMBDA_ONLY, n_layers=2)
    assert [g.text for g in plain] == [g.text for g in card0]
    strong = card_generate(model, tokenizer, PROMPTS, BUDGET, DecodingSettings(alpha=5.0, top_k=50, max_new_tokens=10),
                      head=head, styles=ones, style=LAMBDA_ONLY, n_layers=2)
    assert [g.text for g in plain] != [g.text for g in strong]
    # the user vector matters: another λ gives another output at the same α
    other = card_generate(model, tokenizer, PROMPTS, BUDGET, DecodingSettings(alpha=5.0, top_k=50, max_new_tokens=10),
                     head=head, styles=minus, style=LAMBDA_ONLY, n_layers=2)
    assert [g.text for g in strong] != [g.text for g in other]


def test_trace_records_before_and_after_logits(tiny_model, tokenizer):
    head = PersonalizationHead(2 * 32, len(tokenizer), 4).requires_grad_(False)
    g = card_generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, DecodingSettings(alpha=1.0, top_k=7, max_new_tokens=3),
                 head=head, styles=[UserStyle.of(np.ones(4, np.float32))], style=LAMBDA_ONLY, n_layers=2,
                 trace=True)[0]
    assert len(g.trace) >= 1 and g.trace[0]["cand"].shape == (1, 7)


def test_decoding_step_applies_the_rule_the_tokens_head_was_trained_with(tiny_model, tokenizer):
    """The head's teacher-forced ranking (TokenData: base + Δ + b over the top-k, as fit_lambda_bias trains it) and one
    decoding step of CardLogitsProcessor on the same state give the same scores."""
    torch.manual_seed(3)
    head = PersonalizationHead(2 * 32, len(tokenizer), 8)
    torch.nn.init.normal_(head.U, std=1.0)
    head.requires_grad_(False)
    x = PROMPTS[0]
    ids, _ = left_pad_prompt(tokenizer, x)
    with torch.no_grad():
        ranked = tiny_model(input_ids=ids).logits[0, -1].topk(50).indices.tolist()
    # a likely first token whose text tokenises back to itself, so the teacher-forced pass reads that token
    first = next(t for t in ranked if tokenizer(tokenizer.decode([t]), add_special_tokens=False)["input_ids"] == [t])
    feats = teacher_forced(tiny_model, tokenizer, [(x, tokenizer.decode([first]))], 2, BUDGET, top_k=500)
    data = TokenData.from_features(feats)  # the positions whose token is among the candidates
    assert len(data) and data.h.shape[0] == len(data.target)
    step0 = bool((feats[0].top_ids[0] == feats[0].ids[0]).any())  # the first answer token is a candidate
    lam, bias_ids, bias, _ = fit_lambda_bias(head, data, rho=0.01, rho_bias=0.01, max_bias_tokens=64)
    style = UserStyle(lam.numpy(), bias_ids.numpy(), bias.numpy())
    trained = data.base[0] + head.correction(data.h[:1], lam, data.cand[:1])[0] + torch.tensor(
        [dict(zip(bias_ids.tolist(), bias.tolist())).get(int(c), 0.0) for c in data.cand[0]])
    s = StyleSettings(memory=False, fallback=False)
    with HiddenCapture(tiny_model, 2) as cap, torch.no_grad():
        scores = tiny_model(input_ids=ids).logits[:, -1].float()
        proc = CardLogitsProcessor(head, StyleTensors.of([style], s), s, cap, alpha=1.0, top_k=500)
        out = proc(ids, scores.clone())[0]
    assert step0  # so row 0 of the data is the state this decoding step sees
    assert torch.equal(torch.isfinite(out).nonzero().squeeze(-1), data.cand[0].sort().values)
    torch.testing.assert_close(out[data.cand[0]], trained, atol=2e-2, rtol=0)  # h is stored in fp16
    assert int(out.argmax()) == int(data.cand[0][trained.argmax()])
    assert len(bias_ids) > 0 and bias.abs().max() > 0


def left_pad_prompt(tokenizer, x):
    from personalize.lm.tokens import left_pad, prompt_ids
    return left_pad([prompt_ids(tokenizer, x, BUDGET)], tokenizer.pad_token_id)


def test_lambda_is_pulled_to_its_prior_centre_where_the_text_says_nothing():
    """λ's prior centre (StyleSettings.lambda_prior): with no rows to fit, λ stays at it; 0 gives no correction."""
    head = _head()
    empty = TokenData(torch.zeros(0, 12), torch.zeros(0, 6, dtype=torch.long), torch.zeros(0, 6),
                      torch.zeros(0, dtype=torch.long))
    for centre in (0.0, 1.0):
        lam, *_ = fit_lambda_bias(head, TokenData(torch.zeros(1, 12), torch.arange(6)[None], torch.zeros(1, 6),
                                                  torch.zeros(1, dtype=torch.long)), rho=10.0, rho_bias=0.01,
                                  max_bias_tokens=5, center=centre)
        assert torch.allclose(lam, torch.full_like(lam, centre), atol=0.05)
    assert len(empty) == 0


def test_token_bias_is_fitted_jointly_and_learns_a_planted_preference():
    head, d = _head(), 8
    n, k = 2000, 6
    h, cand = torch.randn(n, 12), torch.stack([torch.randperm(40)[:k] for _ in range(n)])
    base = torch.randn(n, k)
    liked = 7  # the person picks token 7 whenever it is a candidate, whatever the model says
    logits = base + 4.0 * (cand == liked)
    target = torch.distributions.Categorical(logits=logits).sample()
    lam, ids, vals, curve = fit_lambda_bias(head, TokenData(h, cand, base, target), rho=0.01, rho_bias=0.001,
                                      max_bias_tokens=5)
    assert len(ids) <= 5 and int(ids[vals.argmax()]) == liked and float(vals.max()) > 2.0
    assert curve[-1] < curve[0]


def _opening_features(first_ids, k=5):
    """Texts whose cluster model prefers token 1 to open with (then token 0 at every later place), and whose
    person opened with first_ids[i] instead: SequenceFeatures as one teacher-forced pass gives them."""
    from personalize.lm.features import SequenceFeatures

    feats = []
    for first in first_ids:
        ids = torch.tensor([first, 3, 4])
        top = torch.arange(k).repeat(3, 1)  # candidates 0..k-1 at every place
        logits = torch.zeros(3, k)
        logits[0, 1], logits[1:, 0] = 4.0, 4.0
        feats.append(SequenceFeatures("", ids, torch.zeros(3, 64), torch.zeros(3), top, logits))
    return feats


def test_form_bias_raises_the_persons_opening_after_their_own_opening_only():
    """A person who opens with token 2 where the cluster model opens with token 1: the form bias lifts token 2
    at the answer's first place, by more the more often they wrote it; after their opening it lifts what they
    wrote next (3), and after an opening they never wrote, or past the places it covers, nothing changes."""
    feats = _opening_features([2] * 9 + [4])
    keys, ids, vals = fit_form(feats, positions=2, prior=2.0, cap=6.0)
    first = dict(zip(ids[keys == opening_key(())].tolist(), vals[keys == opening_key(())].tolist()))
    assert set(first) == {2, 4} and first[2] > first[4] > 0 and max(first.values()) <= 6.0
    assert ids[keys == opening_key([2])].tolist() == [3] == ids[keys == opening_key([4])].tolist()
    head = PersonalizationHead(64, 10, 8).requires_grad_(False)  # U = 0: no Δ, the form alone
    style = UserStyle(np.ones(8, np.float32), form_keys=keys, form_ids=ids, form_bias=vals)
    s = StyleSettings(bias=False, memory=False, fallback=False)
    st = StyleTensors.of([style], s)
    cand, base = torch.arange(5)[None], feats[0].top_logits[:1]

    def scores(opening, alpha=1.0, tensors=st):
        return style_scores(head, tensors, s, torch.zeros(1, 64), cand, base, alpha, openings=[opening_key(opening)])[1]

    assert int(scores(()).argmax()) == 2 and int(base.argmax()) == 1
    assert int(scores([2]).argmax()) == 3
    torch.testing.assert_close(scores([1]), base)  # an opening they never wrote
    torch.testing.assert_close(scores([2, 3]), base)  # past the places it covers
    torch.testing.assert_close(scores((), alpha=0.0), base)  # α = 0: the cluster model
    torch.testing.assert_close(scores((), tensors=StyleTensors.of([style], replace(s, form=False))), base)
    back = UserStyle.from_bytes(style.lam, style.extras_bytes())  # stored and read back
    assert back.form_keys.tolist() == keys.tolist() and np.allclose(back.form_bias, vals, atol=1e-2)


def test_form_bias_decodes_the_persons_opening(tiny_model, tokenizer):
    """Through generate: a style whose form says "open with this token" makes the first token that one, and the
    processor's openings follow the tokens chosen."""
    head = PersonalizationHead(2 * 32, len(tokenizer), 8).requires_grad_(False)
    plain = generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, DecodingSettings(alpha=0.0, max_new_tokens=2))[0]
    with torch.no_grad():
        ids, _ = left_pad_prompt(tokenizer, PROMPTS[0])
        ranked = tiny_model(input_ids=ids).logits[0, -1].topk(10).indices.tolist()
    want = ranked[5]  # a candidate the cluster model ranks sixth
    style = UserStyle(np.ones(8, np.float32), form_keys=np.asarray([opening_key(())]), form_ids=np.asarray([want]),
                      form_bias=np.asarray([50.0], np.float32))
    s = StyleSettings(bias=False, memory=False, fallback=False)
    out = card_generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, DecodingSettings(alpha=1.0, max_new_tokens=2),
                   head=head, styles=[style], style=s, n_layers=2)[0]
    first = tokenizer(out.text, add_special_tokens=False)["input_ids"][0]
    assert tokenizer.decode([first]).strip() == tokenizer.decode([want]).strip() != plain.text.split()[0]


def test_memory_neighbours_bring_the_persons_next_token(tiny_model, tokenizer):
    """A person who always answered with the same word: the kNN memory, keyed by the state before it, makes
    it win at that step even when the cluster model prefers something else."""
    head = PersonalizationHead(2 * 32, len(tokenizer), 8).requires_grad_(False)
    word = tokenizer(" zebra", add_special_tokens=False)["input_ids"][0]
    feats = teacher_forced(tiny_model, tokenizer, [(p, "zebra") for p in PROMPTS], 2, BUDGET, top_k=20)
    feats = [f.__class__(f.text, torch.tensor([word, f.ids[-1]]), f.h[:2], f.logprob[:2]) for f in feats]
    keys, values = memory_from_features(feats, 32, 100)
    assert keys.shape == (6, 32) and np.allclose(np.linalg.norm(keys.astype(np.float32), axis=1), 1, atol=1e-2)
    style = UserStyle(np.ones(8, np.float32), keys=keys, values=values)
    s = StyleSettings(bias=False, memory=True, fallback=False, knn_weight=0.9, knn_neighbours=3, key="state")
    plain = generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, DecodingSettings(alpha=0.0, max_new_tokens=1))[0]
    card = card_generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, DecodingSettings(alpha=1.0, max_new_tokens=2),
                    head=head, styles=[style], style=s, n_layers=2)[0]  # U = 0: no Δ, the memory alone
    assert card.text.split()[0] == "zebra" != plain.text.split()[0]
    off = card_generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, DecodingSettings(alpha=0.0, max_new_tokens=1),
                   head=head, styles=[style], style=s, n_layers=2)[0]
    assert off.text == plain.text  # α = 0 is the cluster model, memory or not
    st = StyleTensors.of([style], s)
    ids, sc = style_scores(head, st, s, torch.randn(1, 64), torch.arange(5)[None], torch.randn(1, 5), 1.0)
    assert torch.exp(sc[torch.isfinite(sc)]).sum().item() == pytest.approx(1.0, abs=1e-4)  # still a distribution


def test_a_far_persons_own_memory_weight_decodes_when_the_builds_style_has_no_memory(tiny_model, tokenizer):
    """The memory is the person's own weight (far from every cluster) even under a style whose memory is off; the
    paper's λ-alone variant (far_knn_weight 0) leaves it out; the weight survives the store's bytes."""
    head = PersonalizationHead(2 * 32, len(tokenizer), 8).requires_grad_(False)
    word = tokenizer(" zebra", add_special_tokens=False)["input_ids"][0]
    feats = teacher_forced(tiny_model, tokenizer, [(p, "zebra") for p in PROMPTS], 2, BUDGET, top_k=20)
    feats = [f.__class__(f.text, torch.tensor([word, f.ids[-1]]), f.h[:2], f.logprob[:2]) for f in feats]
    keys, values = memory_from_features(feats, 32, 100)
    far = UserStyle(np.ones(8, np.float32), keys=keys, values=values, knn_weight=0.9)
    near = UserStyle(np.ones(8, np.float32), keys=keys, values=values)
    s = StyleSettings(bias=False, memory=False, fallback=False, knn_neighbours=3, key="state", form=False)
    assert far.memory_weight(s) == 0.9 and near.memory_weight(s) is None
    assert far.memory_weight(replace(s, far_knn_weight=0.0)) is None  # card_paper and the one-part variants
    assert far.memory_weight(replace(s, memory=True, knn_weight=0.3)) == 0.9  # the larger of the two
    assert UserStyle(far.lam, knn_weight=0.15).memory_weight(replace(s, memory=True, knn_weight=0.3)) == 0.3
    one = DecodingSettings(alpha=1.0, max_new_tokens=2)

    def first(style, settings):
        return card_generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, one, head=head, styles=[style], style=settings,
                        n_layers=2)[0].text.split()[0]

    assert first(far, s) == "zebra" != first(near, s)
    assert first(far, replace(s, far_knn_weight=0.0)) == first(near, s)
    back = UserStyle.from_bytes(far.lam, far.extras_bytes())
    assert back.knn_weight == pytest.approx(0.9) and UserStyle.from_bytes(near.lam, near.extras_bytes()).knn_weight is None


def test_repetition_control_ignores_the_prompt_and_stops_loops(tiny_model, tokenizer):
    s = DecodingSettings(alpha=0.0, max_new_tokens=24, no_repeat_ngram=0)
    loose = generate(tiny_model, tokenizer, PROMPTS, BUDGET, s)
    tight = generate(tiny_model, tokenizer, PROMPTS, BUDGET, DecodingSettings(alpha=0.0, max_new_tokens=24,
                                                                              no_repeat_ngram=2))
    from personalize.metrics import looping
    for g in tight:
        ids = tokenizer(g.text, add_special_tokens=False)["input_ids"]
        pairs = list(zip(ids, ids[1:]))
        assert len(pairs) - len(set(pairs)) <= 1  # (re-tokenising the text may merge a pair)
        assert not looping(g.text)
    assert any(looping(g.text) for g in loose) or loose != tight
    # an end-of-sequence first would be an empty output: never
    from personalize.serving.generation import repetition_processors
    (first,) = repetition_processors(DecodingSettings(no_repeat_ngram=0, loop_period=0), 5, tokenizer.eos_token_id)
    scores = torch.zeros(1, 10)
    scores[0, tokenizer.eos_token_id % 10] = 5.0
    if tokenizer.eos_token_id < 10:
        assert first(torch.zeros(1, 5, dtype=torch.long), scores.clone())[0, tokenizer.eos_token_id] == float("-inf")
    # the prompt's words stay available: the first token is the same with and without the blocker
    assert [g.text.split()[:1] for g in loose] == [g.text.split()[:1] for g in tight]


# ---------------------------------------------------------------- cluster adapters

def test_cluster_adapter_training_lowers_loss_and_warm_start_copies(tiny_model, tokenizer):
    s = LoraSettings(r=8, alpha=16, lr=1e-1, batch_size=4, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    model = new_peft_model(tiny_model, s)
    ex = [(p, "ALL CAPS YES") for p in PROMPTS]
    before = sft_loss(model, tokenizer, ex, BUDGET)
    report = train_adapter(model, tokenizer, "k1c0", ex, 30, s, BUDGET, held_out=ex)
    assert report["held_out_loss"][-1][1] < before - 0.5 and report["tokens"] > 0
    add_warm_adapter(model, "k2c0", s)
    model.set_adapter("k2c0", inference_mode=True)
    assert abs(sft_loss(model, tokenizer, ex, BUDGET) - report["held_out_loss"][-1][1]) < 1e-4
    assert all(not p.requires_grad for p in model.parameters())


def test_early_stopping_keeps_the_best_epoch_on_held_out_users():
    """Pure-noise targets: the head can only overfit, so held-out loss rises and training stops early."""
    torch.manual_seed(0)

    def noise(n):
        return TokenData(torch.randn(n, 12), torch.randint(0, 40, (n, 6)), torch.zeros(n, 6), torch.randint(0, 6, (n,)))

    train = {u: noise(60) for u in "abcd"}
    held = {u: noise(60) for u in "abcd"}
    s = HeadSettings(d=8, epochs=40, lr=5e-2, batch_users=4, patience=2)
    head = PersonalizationHead(12, 40, 8)
    lams, curve = train_population(head, train, s, held_out=held)
    assert len(curve) < s.epochs  # stopped early
    from personalize.methods.card.head import user_loss
    with torch.no_grad():
        kept = sum(float(user_loss(head, lams[u], held[u], s)) for u in held) / len(held)
    full = PersonalizationHead(12, 40, 8)
    lams_full, _ = train_population(full, train, HeadSettings(d=8, epochs=40, lr=5e-2, batch_users=4))
    with torch.no_grad():
        last = sum(float(user_loss(full, lams_full[u], held[u], s)) for u in held) / len(held)
    assert kept < last


def test_newer_or_broken_artifacts_are_refused_before_loading_models(tmp_path):
    from personalize.methods.engine import ArtifactsError, Engine

    (tmp_path / "config.json").write_text('{"format_version": 99, "settings": {}}')
    with pytest.raises(ArtifactsError, match="newer than this code"):
        Engine.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ArtifactsError, match="unreadable"):
        Engine.load(tmp_path)
    with pytest.raises(ArtifactsError, match="run `python -m personalize build`"):
        Engine.load(tmp_path / "missing")


def test_repetition_processors_see_the_generated_tokens_only():
    """Prompt [1, 2, 3, 1] then generated [5, 6, 5]: the bigram (5, 6) is blocked after 5, the prompt's own bigram
    (1, 2) is not; the penalty lowers generated tokens, never tokens that only the prompt holds."""
    from personalize.serving.generation import repetition_processors

    ids = torch.tensor([[1, 2, 3, 1, 5, 6, 5]])
    blocker, = repetition_processors(DecodingSettings(no_repeat_ngram=2, loop_period=0), prompt_length=4)
    out = blocker(ids, torch.zeros(1, 10))[0]
    assert out[6] == float("-inf") and out[2] == 0 and torch.isfinite(out).sum() == 9
    after_one = blocker(torch.tensor([[1, 2, 3, 1, 1]]), torch.zeros(1, 10))[0]
    assert torch.isfinite(after_one).all()  # (1, 2) is the prompt's: 2 stays open after a generated 1
    penalty, = repetition_processors(DecodingSettings(no_repeat_ngram=0, loop_period=0, repetition_penalty=2.0),
                                     prompt_length=4)
    scores = torch.full((1, 10), 4.0)
    out = penalty(ids, scores.clone())[0]
    assert out[5] == out[6] == 2.0 and out[1] == out[2] == out[3] == 4.0


def test_no_features_make_an_empty_problem():
    """A pass with nothing to learn from (no items, or no target tokens) is an empty problem, not a TypeError."""
    from personalize.methods.card.head import TokenData

    assert len(TokenData.from_features([])) == 0
