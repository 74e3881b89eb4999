"""CARD writes new text like the person, not their past texts handed back (issue 57): no_copy.PastTextGuard on its
own and in card's decoding on a tiny random model, alone and as a row of a mixed batch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from personalize.lm.features import teacher_forced
from personalize.lm.tokens import TokenBudget
from personalize.methods.card.adapters import BASE_ADAPTER, new_peft_model
from personalize.methods.card.config import LoraSettings, StyleSettings
from personalize.methods.card.decoding import card_generate
from personalize.methods.card.head import PersonalizationHead
from personalize.methods.card.no_copy import PastTextGuard, own_reuse, past_text_guard, past_texts
from personalize.methods.card.steer import CardSteer
from personalize.methods.card.style import UserStyle, memory_from_features
from personalize.serving.rows import DecodeRow
from personalize.serving.runner import decode_rows
from personalize.serving.settings import DecodingSettings

BUDGET = TokenBudget(max_prompt_tokens=24, max_target_tokens=16)
PROMPT = "Paraphrase: the train was late again"
PAST = "the quick brown fox jumps over the lazy dog near the river bank"


def test_the_guard_masks_the_token_that_would_make_a_run_longer_than_the_limit_unless_the_prompt_holds_it():
    eos = 2
    texts = past_texts([5, 6, 7, 8, 9, eos, 5, 6, 7, 10, 11, eos, 20, 21, 22, eos], eos)
    assert texts == ((5, 6, 7, 8, 9, eos), (5, 6, 7, 10, 11, eos), (20, 21, 22, eos))
    assert own_reuse(texts, 1) == 3 and own_reuse(texts, 4) == 4  # "5 6 7" is the phrase they reuse; the floor
    guard = PastTextGuard([texts], [3], eos)
    scores = torch.zeros(1, 30)
    assert guard(torch.tensor([[1, 1, 6, 7, 8]]), scores) is scores  # the prompt: nothing generated yet
    masked = guard(torch.tensor([[1, 1, 6, 7, 8, 5, 6, 7]]), scores)
    assert torch.isinf(masked[0]).nonzero().flatten().tolist() == [8, 10]  # either past text's 4th token
    assert guard(torch.tensor([[1, 1, 6, 7, 8, 20, 21, 22]]), scores)[0, eos] == -np.inf  # a short text, ended
    held = PastTextGuard([texts], [3], eos)
    held(torch.tensor([[1, 5, 6, 7, 8, 9]]), scores)  # a prompt that holds "5 6 7 8": that run stays writable
    assert torch.isinf(held(torch.tensor([[1, 5, 6, 7, 8, 9, 5, 6, 7]]), scores)[0]).nonzero().flatten().tolist() == [10]
    retrieved = PastTextGuard([texts], [3], eos, prompt_exempt=False)  # the prompt holds their retrieved items
    retrieved(torch.tensor([[1, 5, 6, 7, 8, 9]]), scores)
    assert torch.isinf(retrieved(torch.tensor([[1, 5, 6, 7, 8, 9, 5, 6, 7]]), scores)[0]).nonzero().flatten().tolist() \
        == [8, 10]
    one = torch.full((1, 30), -np.inf)
    one[0, 8] = 0.0  # the past text's next token is the only candidate: the row ends rather than copy it
    ended = PastTextGuard([texts], [3], eos)
    ended(torch.tensor([[1]]), one)
    assert ended(torch.tensor([[1, 5, 6, 7]]), one)[0].argmax().item() == eos
    assert past_text_guard([UserStyle(np.ones(4, np.float32))], StyleSettings(), eos) is None  # no memory: no guard
    remembered = [UserStyle(np.ones(4, np.float32), values=np.array([5, 6, eos]))]
    assert past_text_guard(remembered, StyleSettings(no_copy=False), eos) is None
    assert past_text_guard(remembered, StyleSettings(), eos).prompt_exempt
    assert not past_text_guard(remembered, StyleSettings(retrieval=True), eos).prompt_exempt


def test_a_line_may_not_end_while_it_nearly_is_a_past_text():
    """The near-copy end (issue 57's walk: "clarify block scope docs" for "clarify block outer scope docs"): the line
    ends (end-of-sequence, a newline token) are masked while the line is within ROUGE-L 0.8 of a past text in its
    tokens; a line that is not, and a row where ending is not among the likeliest tokens, keep them."""
    from personalize.methods.card.no_copy import lcs_f

    eos, newline = 2, 3
    texts = past_texts([5, 6, 7, 8, 9, eos, 20, 21, 22, 23, 24, 25, eos], eos)
    assert lcs_f([5, 6, 8, 9], [5, 6, 7, 8, 9]) == 8 / 9 and lcs_f([5, 30, 31], [5, 6, 7, 8, 9]) == 0.25
    guard = PastTextGuard([texts], [4], eos, breaks=frozenset({eos, newline}))
    ending = torch.zeros(1, 40)
    ending[0, [eos, newline]] = 5.0  # ending the line is the likeliest
    guard(torch.tensor([[1, 1]]), ending)
    near = guard(torch.tensor([[1, 1, 5, 6, 8, 9]]), ending)  # "7" left out: a near copy
    assert near[0, eos] == -np.inf and near[0, newline] == -np.inf and torch.isfinite(near[0, 10])
    after = guard(torch.tensor([[1, 1, 40, 41, newline, 5, 6, 8, 9]]), ending)  # its own line, after another
    assert after[0, eos] == -np.inf
    assert guard(torch.tensor([[1, 1, 5, 30, 31]]), ending) is ending  # new text ends as it likes
    unlikely = torch.zeros(1, 40)
    unlikely[0, 10:30] = 5.0
    assert guard(torch.tensor([[1, 1, 5, 6, 8, 9]]), unlikely) is unlikely  # not about to end: no LCS work
    plain = PastTextGuard([texts], [4], eos)  # no breaks given: the runs alone
    plain(torch.tensor([[1, 1]]), ending)
    assert plain(torch.tensor([[1, 1, 5, 6, 8, 9]]), ending) is ending


def _copying_person(model, tok):
    """A person with one past text whose memory, at weight 0.9 and one neighbour, walks card through it word for word
    (the states of the same prompt and prefix are the memory's own keys)."""
    head = PersonalizationHead(2 * 32, len(tok), 8).requires_grad_(False)  # U = 0: no Δ, the memory alone
    feats = teacher_forced(model, tok, [(PROMPT, PAST)], 2, BUDGET)
    keys, values = memory_from_features(feats, 32, 100)
    style = UserStyle(np.ones(8, np.float32), keys=keys, values=values)
    settings = StyleSettings(bias=False, memory=True, fallback=False, form=False, knn_weight=0.9, knn_neighbours=1,
                             key="state")
    return head, style, settings


def test_card_no_longer_hands_back_a_past_text_alone_or_in_a_mixed_batch(tiny_model, tokenizer):
    tiny_model = new_peft_model(tiny_model, LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj")))  # B = 0
    head, style, settings = _copying_person(tiny_model, tokenizer)
    s = DecodingSettings(alpha=1.0, max_new_tokens=16)

    def card(st: StyleSettings) -> str:
        return card_generate(tiny_model, tokenizer, [PROMPT], BUDGET, s, head=head, styles=[style], style=st,
                             n_layers=2)[0].text

    assert card(replace(settings, no_copy=False)).strip() == PAST  # without the guard: the past text, whole
    guarded = card(settings)
    past_ids = tokenizer(PAST, add_special_tokens=False)["input_ids"]
    out_ids = tokenizer(guarded, add_special_tokens=False)["input_ids"]
    limit = settings.copy_run_floor  # one past text: nothing reused, so the floor
    runs = {tuple(past_ids[i: i + limit + 1]) for i in range(len(past_ids) - limit)}
    assert guarded.strip() != PAST and not any(tuple(out_ids[i: i + limit + 1]) in runs for i in range(len(out_ids)))
    assert guarded.split()[:2] == PAST.split()[:2]  # the person's words still lead: the memory is not switched off
    row = DecodeRow(PROMPT, BUDGET, s, BASE_ADAPTER, CardSteer(head, style, settings, 2, tokenizer.eos_token_id))
    assert decode_rows(tiny_model, tokenizer, [row])[0].text == guarded  # the studio's rows decode the same
    plain = card_generate(tiny_model, tokenizer, [PROMPT], BUDGET, replace(s, alpha=0.0), head=head, styles=[style],
                          style=settings, n_layers=2)[0].text
    unguarded_plain = card_generate(tiny_model, tokenizer, [PROMPT], BUDGET, replace(s, alpha=0.0), head=head,
                                    styles=[style], style=replace(settings, no_copy=False), n_layers=2)[0].text
    assert plain == unguarded_plain  # α = 0 is the cluster model exactly, guard or not
