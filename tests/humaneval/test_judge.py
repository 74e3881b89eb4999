"""The LLM judge: verdict shape, order symmetry, rubric range, config checks; the bundled model when cached."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from personalize.humaneval.judge import Judge, JudgeConfig
from personalize.lm.models import LM
from personalize.lm.model_config import ModelConfig

HISTORY = ["lol this is SO good!!! cant stop laughing", "omg best day ever!!!", "who even does that lmao"]
PROMPT = "Paraphrase the following tweet without any explanation before or after it: the game was great"
CASUAL = "omg the game was sooo good!!! lol"
FORMAL = "The match was, by all accounts, an excellent contest."


@pytest.fixture()
def judge(tokenizer, tiny_model):
    lm = LM(model=tiny_model, tokenizer=tokenizer, model_id="tiny-random-llama", device=torch.device("cpu"))
    return Judge(JudgeConfig(max_history=2, max_chars=80), lm=lm)


def test_pairwise_verdict_and_probability(judge):
    r = judge.pairwise(HISTORY, PROMPT, CASUAL, FORMAL)
    assert set(r) == {"verdict", "p_a"}
    assert r["verdict"] in {"a", "b", "tie"}
    assert 0.0 <= r["p_a"] <= 1.0
    assert judge.label == "tiny-random-llama"
    assert judge.ab_ids == [49, 50]  # "A" and "B" with no leading space, as emitted after "assistant\n"


def test_swapping_outputs_gives_complement(judge):
    for a, b in [(CASUAL, FORMAL), ("short", "a much longer answer " * 20), ("same", "same")]:
        p = judge.pairwise(HISTORY, PROMPT, a, b)["p_a"]
        q = judge.pairwise(HISTORY, PROMPT, b, a)["p_a"]
        assert p + q == pytest.approx(1.0, abs=1e-5)
    assert judge.pairwise(HISTORY, PROMPT, "same", "same") == {"verdict": "tie", "p_a": pytest.approx(0.5, abs=1e-5)}


def test_verdict_follows_tie_margin(tokenizer, tiny_model):
    lm = LM(model=tiny_model, tokenizer=tokenizer, model_id="tiny", device=torch.device("cpu"))
    p = Judge(JudgeConfig(tie_margin=0.0), lm=lm).pairwise(HISTORY, PROMPT, CASUAL, FORMAL)
    assert p["verdict"] == ("a" if p["p_a"] > 0.5 else "b")
    assert Judge(JudgeConfig(tie_margin=0.4999), lm=lm).pairwise(HISTORY, PROMPT, CASUAL, FORMAL)["verdict"] == "tie"


def test_rubric_in_range(judge):
    for history in (HISTORY, []):
        r = judge.rubric(history, PROMPT, CASUAL)
        assert set(r) == {"style", "content", "fluency"}
        assert all(1.0 <= v <= 5.0 for v in r.values())


def test_truncation_and_history_limit(judge):
    ctx = judge._context(["x" * 500, "second", "third"], "p")
    assert "second" in ctx and "third" not in ctx  # max_history=2
    assert "x" * 80 + "…" in ctx and "x" * 81 not in ctx  # max_chars=80


@pytest.mark.parametrize("kwargs", [dict(max_history=-1), dict(max_chars=0), dict(tie_margin=0.5),
                                    dict(tie_margin=-0.1), dict(device="tpu"), dict(model="  ")])
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        JudgeConfig(**kwargs)


BUNDLED_FOLDER = Path(ModelConfig().cache_dir) / "smollm2-135m-instruct"


@pytest.mark.skipif(not (BUNDLED_FOLDER / "model.safetensors").exists(),
                    reason="the bundled model is not converted/cached locally (run the demo once)")
def test_bundled_judge_on_a_real_example():
    j = Judge(JudgeConfig(device="cpu"))
    assert "weak judge" in j.label
    r = j.pairwise(HISTORY, PROMPT, CASUAL, FORMAL)
    assert r["verdict"] in {"a", "b", "tie"} and 0.0 <= r["p_a"] <= 1.0
    s = j.pairwise(HISTORY, PROMPT, FORMAL, CASUAL)
    assert r["p_a"] + s["p_a"] == pytest.approx(1.0, abs=1e-4)
    assert all(1.0 <= v <= 5.0 for v in j.rubric(HISTORY, PROMPT, CASUAL).values())
