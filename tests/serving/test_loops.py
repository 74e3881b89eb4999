"""Loops and echoes (issue 36): the checks that measure them (metrics.looping, metrics.echoes) and the decoding rule
that stops a loop in every method's rows (decoding.NoThirdRepeat, in repetition_processors)."""

from __future__ import annotations

import pytest
import torch

from personalize.methods.card import onboard
from personalize.serving.generation import NoThirdRepeat, digit_tokens, generate, repetition_processors
from personalize.serving.settings import DecodingSettings
from personalize.lm.tokens import TokenBudget
from personalize.metrics import echoes, looping

BUDGET = TokenBudget(max_prompt_tokens=24, max_target_tokens=8)
PROMPTS = ["Paraphrase: the train was late again", "Paraphrase: coffee is ready", "Paraphrase: we won the match",
           "Write the commit message subject line for this change."]


@pytest.mark.parametrize("text", [
    "dev-dev-dev-dev-dev-",  # one word, a period of two units
    "The 2023-02-24 2023-02-24 2023-02-",  # a phrase over half the units
    "Fix Windows 3.1-4-4-4-4-4-4-4",
    "Synthesizer. " * 20,
    "The previous response was: fix\nThe previous response was: docs\nThe previous response was: tests",
    "I am pleased to report that I am pleased to report that I am pleased to report that",
])
def test_the_loops_the_issue_saw_are_loops(text):
    assert looping(text)


@pytest.mark.parametrize("text", [
    "* Non-maintainer upload.\n* CVE-2025-0938: urlparse accepted hostname containing [ or ]\n"
    "* CVE-2025-1795: Don't encode list separators in email headers",  # a list repeats its own forms
    "I am very very happy", "Wait... what... no...", "Fix the bug", "", "Bump version to 1.0.0 (Closes: #1000000)",
])
def test_ordinary_texts_do_not_loop(text):
    assert not looping(text)


def test_an_echo_is_a_scaffold_line_repeated_whole_or_cut_short():
    scaffold = ["Write the commit message subject line for this change.",
                "Texts this user wrote before (input → output):"]
    assert echoes("Write the commit message subject line for this change.\nFiles changed: a.py", scaffold)
    assert echoes("fix: x\ntexts this user wrote  before (input → output):", scaffold)  # case and spaces aside
    assert echoes("Write the commit message", scaffold)  # the budget ended inside the echo
    assert not echoes("Write tests for the parser", scaffold)
    assert not echoes("Fix the commit message subject", scaffold)
    assert not echoes("Write the commit message subject line", [])


def test_the_third_back_to_back_copy_is_masked_and_two_copies_stay_allowed():
    """Prompt [9, 9, 9] is not looked at; generated [5, 6, 5, 6, 5]: 6 would finish a third (5, 6), so it is masked;
    after [5, 6, 5, 6] the 5 stays open (a third copy is not finished by it) and after [7, 7] the 7 is masked."""
    proc = NoThirdRepeat(4, prompt_length=3)
    scores = torch.zeros(3, 12)
    ids = torch.tensor([[9, 9, 9, 1, 5, 6, 5, 6, 5], [9, 9, 9, 0, 1, 5, 6, 5, 6], [9, 9, 9, 1, 2, 3, 4, 7, 7]])
    out = proc(ids, scores)
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [6]
    assert torch.isfinite(out[1]).all()
    assert torch.isinf(out[2]).nonzero().flatten().tolist() == [7]
    assert torch.isfinite(proc(torch.tensor([[9, 9, 9]]), torch.zeros(1, 12))).all()  # the prompt's own repeats
    period3 = proc(torch.tensor([[0, 0, 0, 1, 2, 3, 1, 2, 3, 1, 2]]), torch.zeros(1, 12))  # (1, 2, 3) a third time
    assert torch.isinf(period3[0]).nonzero().flatten().tolist() == [3]
    digits = torch.zeros(12, dtype=torch.bool)
    digits[7] = True  # a digit token: "#1000" spells 0 three times
    assert torch.isfinite(NoThirdRepeat(4, 3, digits)(ids[2:], torch.zeros(1, 12))).all()


def test_every_repetition_chain_holds_the_loop_rule_with_the_tokenizers_digits(tokenizer):
    chain = repetition_processors(DecodingSettings(), 5, tokenizer.eos_token_id, tok=tokenizer)
    (rule,) = [p for p in chain if isinstance(p, NoThirdRepeat)]
    assert rule.max_n == DecodingSettings().loop_period and rule.digits is digit_tokens(tokenizer)
    zero = tokenizer("0", add_special_tokens=False)["input_ids"]
    word = tokenizer("dev", add_special_tokens=False)["input_ids"]
    assert len(zero) == 1 and rule.digits[zero[0]] and len(word) == 1 and not rule.digits[word[0]]
    assert not any(isinstance(p, NoThirdRepeat) for p in repetition_processors(DecodingSettings(loop_period=0), 5))
    with pytest.raises(ValueError):
        DecodingSettings(loop_period=-1)


def _third_copy(ids: list[int], max_n: int, digits: torch.Tensor) -> bool:
    """Some n-gram (n <= max_n) of these tokens, not of digits alone, three times back to back."""
    return any(ids[i: i + n] == ids[i + n: i + 2 * n] == ids[i + 2 * n: i + 3 * n]
               and not all(digits[t] for t in ids[i: i + n])
               for n in range(1, max_n + 1) for i in range(len(ids) - 3 * n + 1))


def test_decoding_never_writes_a_third_back_to_back_copy(tiny_model, tokenizer):
    """The tiny random model loops without the rule (no n-gram blocking either); with it, no output's tokens hold
    an n-gram of up to loop_period tokens three times back to back, and fewer of its texts loop."""
    from transformers import LogitsProcessorList

    from personalize.lm.tokens import left_pad, prompt_ids

    ids, mask = left_pad([prompt_ids(tokenizer, p, BUDGET) for p in PROMPTS], tokenizer.pad_token_id)
    digits = digit_tokens(tokenizer)

    def run(s: DecodingSettings) -> list[list[int]]:
        chain = repetition_processors(s, ids.shape[1], tokenizer.eos_token_id, tok=tokenizer)
        out = tiny_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                                  do_sample=False, temperature=None, top_k=None, top_p=None,
                                  pad_token_id=tokenizer.pad_token_id, logits_processor=LogitsProcessorList(chain))
        rows = [r[ids.shape[1]:].tolist() for r in out]
        return [r[: r.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in r else r for r in rows]

    loose = run(DecodingSettings(max_new_tokens=48, no_repeat_ngram=0, loop_period=0))
    tight = run(DecodingSettings(max_new_tokens=48, no_repeat_ngram=0))
    assert any(_third_copy(r, 12, digits) for r in loose)
    assert not any(_third_copy(r, 12, digits) for r in tight) and all(tight)
    text = [generate(tiny_model, tokenizer, PROMPTS, BUDGET, DecodingSettings(max_new_tokens=48, no_repeat_ngram=0,
                                                                               loop_period=n)) for n in (0, 12)]
    assert sum(looping(g.text) for g in text[1]) < sum(looping(g.text) for g in text[0])


def test_an_echo_is_found_whole_words_apart_from_case_and_cut():
    from personalize.serving.generation import echo_at, trim_echo

    scaffold = ["Write the Debian changelog entry for this upload.", "About this author:"]
    text = "* New upstream release.\nwrite  the Debian changelog entry"
    assert echo_at(text, scaffold) == text.index("write") and trim_echo(text, scaffold) == "* New upstream release."
    assert trim_echo("* Rewrite the Debian rules", scaffold) == "* Rewrite the Debian rules"  # whole words only
    assert trim_echo("About this author: nothing", scaffold) == ""
    assert trim_echo("anything", []) == "anything"


def test_a_row_that_starts_repeating_its_scaffold_ends_there_in_the_mixed_batch_and_alone(tiny_model, tokenizer):
    """The scaffold planted as the words the tiny model writes anyway (its 2nd to 4th): with it, the row ends as
    those words begin and the output is what came before them, the same in a mixed batch (runner) and alone
    (generate); a row without a scaffold in the same batch is unchanged."""
    from personalize.serving.generation import EchoStop
    from personalize.serving.rows import DecodeRow
    from personalize.serving.runner import decode_rows

    s = DecodingSettings(max_new_tokens=24)
    free = generate(tiny_model, tokenizer, PROMPTS[:2], BUDGET, s)
    words = free[0].text.split()
    assert len(words) >= 5, free[0].text
    scaffold = (" ".join(words[1:4]) + " and more words",)
    before = free[0].text[: free[0].text.index(words[1], len(words[0]))].rstrip()
    alone = generate(tiny_model, tokenizer, PROMPTS[:1], BUDGET, s, scaffold=scaffold)[0]
    assert alone.text == before and alone.n_tokens < free[0].n_tokens
    mixed = decode_rows(tiny_model, tokenizer, [DecodeRow(PROMPTS[0], BUDGET, s, scaffold=scaffold),
                                                DecodeRow(PROMPTS[1], BUDGET, s)])
    assert [g.text for g in mixed] == [before, free[1].text]
    assert EchoStop(tokenizer, ["two words"], 0).starts == set()  # a line shorter than the check is no scaffold


def test_shares_count_each_methods_loops_and_echoes_and_their_sum():
    from personalize.eval.loops import format_loops, shares

    texts = {"rag": ["fix it", "Write the Debian changelog entry for this upload.", "a-a-a-a"],
             "card": ["* New upstream release.", "x"]}
    t = shares(texts, ["Write the Debian changelog entry for this upload."])
    assert t["rag"]["looping"] == pytest.approx(1 / 3, abs=1e-4) and t["rag"]["echoes"] == pytest.approx(1 / 3, abs=1e-4)
    assert t["rag"]["loop_examples"] == ["a-a-a-a"] and t["card"]["looping"] == 0
    assert t["all"] == {"n": 5, "looping": 0.2, "echoes": 0.2}
    table = format_loops({"32 tokens": t})
    assert "| rag | 33.3% of 3 | 33.3% |" in table and table.splitlines()[-1].startswith("| all | 20.0% of 5")


def test_loop_shares_decode_every_studio_method_of_every_person(tiny_artifacts, tmp_path):
    """Each person's methods in one mixed batch, at the build's settings and at a longer budget; P2P is left out
    of a build without its hypernetwork, with a line saying why."""
    from personalize.catalog import ALL_METHODS
    from personalize.data import read_lamp
    from personalize.eval.loops import Person, loop_shares
    from personalize.methods.engine import Engine
    from personalize.store import Store

    engine = Engine.load(tiny_artifacts["artifacts"])
    _, qs = read_lamp(tiny_artifacts["demo"], "dev")
    people = []
    for q in qs[:2]:
        items = engine.prepare_items(list(q.profile[:6]))
        people.append(Person(q.user, q.input, tuple(items), onboard.fit(engine, items)))
    said = []
    table = loop_shares(engine, Store(tmp_path / "s.db"), people, tmp_path, configs={
        "exact": {"max_pairs": 1}, "oppu": {"max_steps": 1, "report_loss": False}}, tokens=(None, 12),
        progress=said.append)
    default = f"{engine.cfg.decoding.max_new_tokens} tokens"
    assert list(table) == [default, "12 tokens"]
    ran = [m for m in ALL_METHODS if m != "p2p"]
    assert any("p2p left out" in s for s in said)
    for t in table.values():
        assert [m for m in t if m != "all"] == ran and all(t[m]["n"] == 2 for m in ran)
        assert t["all"]["n"] == 2 * len(ran) and 0 <= t["all"]["looping"] <= 1
