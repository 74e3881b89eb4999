"""The methods that train weights, on tiny random models: OPPU (a LoRA per user) and P2P (a hypernetwork)."""

from __future__ import annotations

import copy
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from personalize.methods.card import onboard
from personalize.methods.card.adapters import new_peft_model, sft_loss
from personalize.methods.card.config import LoraSettings
from personalize.methods.card.config import CardConfig
from personalize.data import TASKS, Item
from personalize.serving.settings import DecodingSettings
from personalize.methods.engine import Engine
from personalize.methods.base import UserContext
from personalize.methods import p2p
from personalize.methods.oppu import OppuConfig, OppuMethod, adapter_id
from personalize.methods.p2p import P2PConfig, P2PMethod, applied, model_shapes, profile_loss, train_p2p
from personalize.lm.tokens import TokenBudget
from personalize.methods.card import card_decode

BUDGET = TokenBudget(max_prompt_tokens=24, max_target_tokens=8)
TOPICS = ["the train was late", "coffee is ready", "we won the match", "rain all day", "new phone today",
          "cat on the sofa", "lunch with friends", "exam next week"]
STYLES = {  # four users whose outputs share a style the base model cannot know
    "shouty": lambda t: t.upper() + " !!!",
    "calm": lambda t: "quietly , " + t,
    "emoji": lambda t: t + " :) :)",
    "terse": lambda t: t.split()[-1] + " .",
}
SETTINGS = DecodingSettings(max_new_tokens=4)


class HashEncoder:
    """Hashed bag of words in 16 dimensions: a deterministic stand-in for the sentence encoder."""

    def encode(self, texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True):
        out = np.zeros((len(texts), 16), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % 16] += 1.0
        return out / (np.linalg.norm(out, axis=1, keepdims=True) + 1e-12)


def history(style: str, n: int = len(TOPICS)) -> list[Item]:
    return [Item(y=STYLES[style](t), x=TASKS["tweets"].prompt(t), id=str(i)) for i, t in enumerate(TOPICS[:n])]


def user(style: str, n: int = len(TOPICS)) -> UserContext:
    return UserContext(style, history(style, n))


def examples(style: str) -> list[tuple[str, str]]:
    return [(it.x, it.y) for it in history(style)]


def make_engine(tiny_model, tokenizer, lora: LoraSettings | None = None) -> Engine:
    """A real Engine around a copy of the tiny model, with a random (non-trivial) K = 1 adapter;
    two calls give two independent engines with equal weights (like two processes)."""
    lora = lora or LoraSettings(r=4, alpha=8, dropout=0.0, targets=("q_proj", "v_proj"), lr=5e-2, batch_size=4)
    torch.manual_seed(0)
    model = new_peft_model(copy.deepcopy(tiny_model), lora)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    cfg = CardConfig(budget=BUDGET, lora=lora)
    return Engine(cfg, SimpleNamespace(tokenizer=tokenizer), model, HashEncoder(), None, {}, TASKS["tweets"],
                  {"id": "test"})


# ---------------------------------------------------------------- OPPU

def test_oppu_adapter_lowers_its_users_loss_and_reports_bytes(tiny_model, tokenizer, tmp_path):
    eng = make_engine(tiny_model, tokenizer)
    oppu = OppuMethod(eng, cfg=OppuConfig(epochs=8, max_steps=16, folder=str(tmp_path)))
    u = user("shouty")
    eng.use_adapter("k1c0")
    k1 = sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET)
    info = oppu.prepare(u)
    assert not info["cold_start"] and info["steps"] == 16 and info["tokens"] > 0
    assert info["loss_before"] == pytest.approx(k1, rel=1e-5)
    assert info["loss_after"] < 0.8 * info["loss_before"], info
    # bytes: 4 layers x (q: A 4x32 + B 32x4, v: A 4x32 + B 16x4) float32
    assert info["lora_bytes"] == 4 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4) * 4
    assert info["disk_bytes"] > info["lora_bytes"]
    assert (tmp_path / adapter_id("shouty") / "adapter_model.safetensors").exists()
    assert oppu.activate(u) == adapter_id("shouty")
    assert sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET) == pytest.approx(info["loss_after"], rel=1e-5)
    # the K = 1 adapter is untouched by the user's training
    eng.use_adapter("k1c0")
    assert sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET) == pytest.approx(k1, rel=1e-5)
    outs = oppu.generate(u, ["Paraphrase: hello there", "Paraphrase: bye"], SETTINGS)
    assert len(outs) == 2 and outs[0].trace == [{"adapter": adapter_id("shouty")}]


def test_oppu_save_load_round_trip_and_eviction(tiny_model, tokenizer, tmp_path):
    eng = make_engine(tiny_model, tokenizer)
    cfg = OppuConfig(epochs=4, max_steps=6, folder=str(tmp_path), max_in_memory=1)
    oppu = OppuMethod(eng, cfg=cfg)
    a, b = user("shouty"), user("calm")
    loss_a = oppu.prepare(a)["loss_after"]
    oppu.prepare(b)  # max_in_memory=1: a's adapter leaves the model
    assert adapter_id("shouty") not in eng.model.peft_config and adapter_id("calm") in eng.model.peft_config
    oppu.activate(a)  # loaded back from disk, b evicted
    assert adapter_id("calm") not in eng.model.peft_config
    assert sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET) == pytest.approx(loss_a, rel=1e-5)
    # a fresh process: same base weights, new method object, adapter only on disk
    eng2 = make_engine(tiny_model, tokenizer)
    OppuMethod(eng2, cfg=cfg).activate(a)
    assert sft_loss(eng2.model, tokenizer, examples("shouty"), BUDGET) == pytest.approx(loss_a, rel=1e-5)
    with pytest.raises(ValueError, match="run prepare"):
        OppuMethod(eng2, cfg=cfg).activate(user("emoji"))
    eng3 = make_engine(tiny_model, tokenizer)
    with pytest.warns(UserWarning, match="history changed"):
        OppuMethod(eng3, cfg=cfg).activate(user("shouty", 5))


def test_oppu_report_goes_to_the_store(tiny_model, tokenizer, tmp_path):
    from personalize.store import Store

    store = Store(tmp_path / "studio.db")
    store.add_user("shouty", history("shouty"), "tweets")
    oppu = OppuMethod(make_engine(tiny_model, tokenizer), store, OppuConfig(max_steps=1, folder=str(tmp_path / "o")))
    info = oppu.prepare(user("shouty"))
    assert store.blob("shouty", "oppu", "test")["lora_bytes"] == info["lora_bytes"]
    assert oppu.prepare(user("calm", 1))["cold_start"]  # not in the store: no record, no error
    assert store.blob("calm", "oppu", "test") is None


@pytest.mark.parametrize("n", [0, 1])
def test_oppu_short_history_falls_back_to_k1(tiny_model, tokenizer, tmp_path, n):
    eng = make_engine(tiny_model, tokenizer)
    oppu = OppuMethod(eng, cfg=OppuConfig(folder=str(tmp_path)))
    u = user("terse", n)
    info = oppu.prepare(u)
    assert info["cold_start"] and info["adapter"] == "k1c0" and "min_items" in info["reason"]
    assert list(eng.model.peft_config) == ["k1c0"] and not any(tmp_path.iterdir())
    outs = oppu.generate(u, ["Paraphrase: hi"], SETTINGS)
    eng.use_adapter("k1c0")
    assert outs[0].text == card_decode.generate(eng, ["Paraphrase: hi"], "cluster", k=1, settings=SETTINGS)[0].text


def test_oppu_config_validation():
    with pytest.raises(ValueError):
        OppuConfig(max_in_memory=0)
    with pytest.raises(ValueError):
        OppuConfig(epochs=0)


# ---------------------------------------------------------------- P2P

def _p2p_cfg(**kw) -> P2PConfig:
    base = dict(rank=4, alpha=8.0, hidden=32, mod_dim=8, dep_dim=8, base_adapter=None, steps=0, budget=BUDGET,
                users_per_step=4, items_per_user=2, lr=3e-3)
    return P2PConfig(**(base | kw))


def _logits(model, tokenizer, text="Paraphrase: the cat sat"):
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_p2p_generated_lora_shapes_change_outputs_and_depend_on_profile(tiny_model, tokenizer):
    users = {s: history(s) for s in STYLES}
    hyper, report = train_p2p((tiny_model, tokenizer), HashEncoder(), users, _p2p_cfg())
    n_layers, shapes = model_shapes(tiny_model, ("q_proj", "v_proj"))
    assert n_layers == 4 and shapes == {"q_proj": (32, 32), "v_proj": (32, 16)}  # GQA: v is smaller
    enc = HashEncoder()
    pa = enc.encode([it.y for it in users["shouty"]]).mean(0)
    pb = enc.encode([it.y for it in users["calm"]]).mean(0)
    la, lb = hyper.generate_lora(pa / np.linalg.norm(pa)), hyper.generate_lora(pb / np.linalg.norm(pb))
    for m, (d_in, d_out) in shapes.items():
        A, B = la[m]
        assert A.shape == (1, 4, 4, d_in) and B.shape == (1, 4, d_out, 4)  # per layer: A [r, in], B [out, r]
        assert B.abs().max() > 0 and A.abs().max() > 0  # B ≠ 0 at init, or the LoRA would do nothing
        assert not torch.allclose(la[m][0], lb[m][0]) and not torch.allclose(la[m][1], lb[m][1])
    plain = _logits(tiny_model, tokenizer)
    with applied(tiny_model, la, hyper.cfg.scale):
        with_a = _logits(tiny_model, tokenizer)
    with applied(tiny_model, lb, hyper.cfg.scale):
        with_b = _logits(tiny_model, tokenizer)
    assert (with_a - plain).abs().max() > 1e-4 and (with_a - with_b).abs().max() > 1e-5
    assert torch.equal(_logits(tiny_model, tokenizer), plain)  # hooks removed on exit
    # the hook is exactly W x + scale · B A x on one module
    q = tiny_model.model.layers[2].self_attn.q_proj
    x = torch.randn(3, 5, 32)
    A, B = la["q_proj"][0][:, 2], la["q_proj"][1][:, 2]
    with applied(tiny_model, la, hyper.cfg.scale), torch.no_grad():
        torch.testing.assert_close(q(x), x @ q.weight.T + 2.0 * x @ A[0].T @ B[0].T)


def test_p2p_training_lowers_sft_loss_on_training_users(tiny_model, tokenizer):
    users = {s: history(s) for s in STYLES}
    losses = []
    hyper, report = train_p2p((tiny_model, tokenizer), HashEncoder(), users, _p2p_cfg(steps=40),
                              progress=lambda step, steps, loss: losses.append(loss),
                              held_out_users={"shouty2": history("shouty")[::-1]})
    before, after = report["train_users_loss"]["before"], report["train_users_loss"]["after"]
    assert len(losses) == 40 and report["tokens"] > 0 and report["users"] == 4
    assert after < before - 1.0, report["train_users_loss"]  # measured: 11.74 -> 9.99 nats
    assert report["held_out_loss"][-1][1] < report["held_out_loss"][0][1]
    assert all(not p.requires_grad for p in tiny_model.parameters())  # the LM stayed frozen
    # own profile beats another style's profile on a user's items: the LoRA is personal
    enc = HashEncoder()
    prof = {s: (lambda v: v / np.linalg.norm(v))(enc.encode([it.y for it in users[s]]).mean(0)) for s in STYLES}
    own = profile_loss(tiny_model, tokenizer, hyper, prof["shouty"], examples("shouty"), BUDGET)
    other = profile_loss(tiny_model, tokenizer, hyper, prof["terse"], examples("shouty"), BUDGET)
    assert own < other


def test_p2p_save_load_and_method_on_engine(tiny_model, tokenizer, tmp_path):
    eng = make_engine(tiny_model, tokenizer)
    users = {s: history(s) for s in STYLES}
    cfg = _p2p_cfg(steps=3, base_adapter="k1c0", folder=str(tmp_path / "p2p"))
    hyper, report = train_p2p(eng, eng.encoder, users, cfg)
    p2p.save(hyper, tmp_path / "p2p", {"report": report})
    loaded = p2p.load(tmp_path / "p2p")
    for k, v in hyper.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert loaded.cfg == hyper.cfg and loaded.shapes == hyper.shapes
    method = P2PMethod(eng, cfg=cfg)  # reads the saved hypernetwork
    u = user("shouty")
    info = method.prepare(u)
    assert not info["cold_start"] and info["lora_bytes"] == 4 * 4 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4)
    assert info["profile_bytes"] == 16 * 4
    loss = method.loss(u, examples("shouty"))
    assert loss == pytest.approx(P2PMethod(eng, cfg=cfg, hypernet=hyper).loss(u, examples("shouty")), rel=1e-5)
    eng.use_adapter("k1c0")
    k1 = sft_loss(eng.model, tokenizer, examples("shouty"), BUDGET)
    assert loss != pytest.approx(k1, rel=1e-6)  # the generated LoRA sits on top of k1c0 and changes it
    outs = method.generate(u, ["Paraphrase: hello there", "Paraphrase: bye"], SETTINGS)
    assert len(outs) == 2 and outs[0].trace[0]["base_adapter"] == "k1c0"
    with pytest.raises(ValueError, match="no P2P hypernetwork"):
        P2PMethod(eng, cfg=_p2p_cfg(folder=str(tmp_path / "missing")))


@pytest.mark.parametrize("n", [0, 1])
def test_p2p_short_histories(tiny_model, tokenizer, n):
    users = {s: history(s) for s in STYLES} | {"solo": history("calm", 1)}
    hyper, report = train_p2p((tiny_model, tokenizer), HashEncoder(), users, _p2p_cfg(steps=1))
    assert report["skipped_users"] == ["solo"] and report["users"] == 4
    eng = make_engine(tiny_model, tokenizer)
    method = P2PMethod(eng, cfg=_p2p_cfg(), hypernet=hyper)
    info = method.prepare(user("terse", n))
    assert info["cold_start"] == (n == 0)  # no history: the training users' mean profile
    assert len(method.generate(user("terse", n), ["Paraphrase: hi"], SETTINGS)) == 1
    with pytest.raises(ValueError, match="at least 2 history items"):
        train_p2p((tiny_model, tokenizer), HashEncoder(), {"solo": history("calm", 1)}, _p2p_cfg())


def test_p2p_config_validation_and_round_trip():
    with pytest.raises(ValueError):
        P2PConfig(rank=0)
    with pytest.raises(ValueError):
        P2PConfig(init_b_std=0)
    cfg = _p2p_cfg(modules=("q_proj",))
    assert P2PConfig.from_dict(cfg.to_dict()) == cfg


# ---------------------------------------------------------------- P2P in the artifacts, build and bench

def _tiny_build(monkeypatch, tiny_model, tokenizer, data, out, p2p_cfg, objectives=("pairs",)):
    """The real build() on the tiny model and the hashed encoder (seconds, not the bundled model's minutes)."""
    from personalize.methods.card import build as build_mod
    from personalize.methods import engine as engine_mod
    from personalize.demo import write_demo
    from personalize.methods.card.config import HeadSettings
    from personalize.lm.models import LM

    fresh = copy.deepcopy(tiny_model)  # build wraps its model in peft; Engine.load gets an unwrapped copy
    monkeypatch.setattr(build_mod, "load_lm", lambda cfg: LM(tiny_model, tokenizer, "tiny", torch.device("cpu")))
    monkeypatch.setattr(build_mod, "load_encoder", lambda cfg: HashEncoder())
    monkeypatch.setattr(engine_mod, "load_lm", lambda cfg: LM(copy.deepcopy(fresh), tokenizer, "tiny", torch.device("cpu")))
    monkeypatch.setattr(engine_mod, "load_encoder", lambda cfg: HashEncoder())
    if not (data / "dev_questions.json").exists():
        write_demo(data, n_users_per_style=2, n_items=6)
    lora = LoraSettings(r=4, alpha=8, dropout=0.0, lr=5e-2, batch_size=4, base_steps=2, cluster_steps=1)
    cfg = CardConfig(ks=(1, 2), default_k=2, items_per_user=5, n_val_users=2, budget=BUDGET, lora=lora,
                     objectives=objectives,  # a random model ranks no gold token in its top-k: no token rows
                     head=HeadSettings(epochs=1, d=8, n_layers=2), alphas=(0.0, 1.0))
    return build_mod.build(data, "dev", out, cfg, limit_users=8, p2p=p2p_cfg)


def test_build_trains_p2p_into_the_artifacts_and_the_method_finds_it(monkeypatch, tiny_model, tokenizer, tmp_path,
                                                                     capsys):
    import json

    from personalize.methods.p2p import CONFIG, WEIGHTS

    out = _tiny_build(monkeypatch, tiny_model, tokenizer, tmp_path / "demo", tmp_path / "art",
                      _p2p_cfg(steps=3, base_adapter=None, hidden=16))
    assert (out / "p2p" / WEIGHTS).exists() and (out / "p2p" / CONFIG).exists()
    assert not (tmp_path / "art.partial").exists()
    report = json.loads((out / "config.json").read_text())["report"]
    # the validation people come from the 4 writers outside the 8 of the population: all 8 train
    assert report["p2p"]["steps"] == 3 and report["p2p"]["tokens"] > 0 and report["p2p"]["users"] == 8
    assert report["p2p"]["folder"] == "p2p" and len(report["p2p"]["train_loss"]) == 3
    assert report["stages_s"]["p2p hypernetwork"] >= report["p2p"]["seconds"] > 0
    log = capsys.readouterr().out
    assert "p2p hypernetwork done in" in log and "p2p: 8 users, 3 steps" in log
    saved = json.loads((out / "p2p" / CONFIG).read_text())
    assert saved["config"]["base_adapter"] == "k1c0" and saved["config"]["hidden"] == 16  # the build's adapter

    eng = Engine.load(out)
    assert eng.folder == out
    method = P2PMethod(eng)  # no folder given: the engine's artifacts
    assert method.folder == out / "p2p" and method.hyper.cfg.hidden == 16
    for k, v in p2p.load(out / "p2p").state_dict().items():
        assert torch.equal(v, method.hyper.state_dict()[k].cpu()), k
    u = user("shouty")
    assert not method.prepare(u)["cold_start"]
    outs = method.generate(u, ["Paraphrase: hello there"], SETTINGS)
    assert len(outs) == 1 and outs[0].trace[0]["base_adapter"] == "k1c0"
    assert method.loss(u, examples("shouty")) > 0


def test_build_trains_the_hard_pairs_head_and_a_new_user_fits_with_it(monkeypatch, tiny_model, tokenizer, tmp_path):
    """Variant (c) end to end on the real build: γ fitted and saved, the paper's head left without it, and a new
    user's pairs are the greedy and the sampled cluster outputs, drawn the same way on every refit."""
    import json

    out = _tiny_build(monkeypatch, tiny_model, tokenizer, tmp_path / "demo", tmp_path / "art", None,
                      objectives=("hard_pairs", "pairs"))
    report = json.loads((out / "config.json").read_text())["report"]
    head_report = report["head"]
    by_objective = report["alpha_by_objective"]  # the steering head's α: tune's choice on the validation users,
    assert set(by_objective) == {"hard_pairs"} and report["alpha_sweep"] == by_objective["hard_pairs"]["sweep"]
    assert set(report["alpha_sweep"]) == {"1.0"} and by_objective["hard_pairs"]["alpha"] in (0.0, 1.0)
    guard = report["tune"]["guard"]  # ...then the harm guard's (0 unless card beat the cluster model)
    assert guard["alpha"] == by_objective["hard_pairs"]["alpha"] and guard["people"] >= 1 and guard["why"]
    assert "gamma" in head_report["hard_pairs"] and "gamma" not in head_report["pairs"]
    held = head_report["hard_pairs"]["held_out"]
    assert {"acc_own", "acc_ones", "acc_logprob_rule", "acc_covariate_only", "specificity_gap"} <= set(held)
    eng = Engine.load(out)
    assert float(eng.heads["hard_pairs"].gamma) == pytest.approx(head_report["hard_pairs"]["gamma"], abs=1e-4)
    assert float(eng.heads["pairs"].gamma) == 0.0
    items = history("shouty")
    fit = onboard.fit(eng, items, objective="hard_pairs")
    assert "negatives" in fit.stages_s and fit.diagnostics["unit"] == "pairs"
    assert "acc_covariate_only" in fit.diagnostics and np.isfinite(fit.lam).all()
    data = onboard.user_data(eng, items, "hard_pairs")
    assert data.covariate and len(data) == 2 * len(items)  # greedy + n_samples = 1 sampled per item
    assert sorted(data.items) == sorted(list(range(len(items))) * 2)
    again = onboard.user_data(eng, items, "hard_pairs")
    assert [r.text for r in again.rejected] == [r.text for r in data.rejected]
    assert not onboard.user_data(eng, items, "pairs").covariate and len(onboard.user_data(eng, items, "pairs")) == len(items)


def test_build_without_p2p_makes_the_method_say_build(monkeypatch, tiny_model, tokenizer, tmp_path):
    import json

    bare = make_engine(tiny_model, tokenizer)  # before build wraps tiny_model in peft
    out = _tiny_build(monkeypatch, tiny_model, tokenizer, tmp_path / "demo", tmp_path / "art", None)
    assert not (out / "p2p").exists()
    meta = json.loads((out / "config.json").read_text())
    assert meta["report"]["p2p"] == {"skipped": "--skip-p2p"} and "p2p hypernetwork" not in meta["report"]["stages_s"]
    eng = Engine.load(out)
    with pytest.raises(ValueError, match=r"no P2P hypernetwork in the artifacts .*--skip-p2p.*personalize build"):
        P2PMethod(eng)
    # an engine that was never loaded from artifacts has no folder to look in
    with pytest.raises(ValueError, match="not loaded from an artifacts folder"):
        P2PMethod(bare)


def test_bench_methods_side_by_side(tiny_model, tokenizer, tmp_path):
    import pickle

    from personalize.eval.bench import bench_methods, format_methods
    from personalize.methods.rag import RagIndex

    eng = make_engine(tiny_model, tokenizer)
    users = {s: user(s, 4) for s in ("shouty", "calm")}
    hyper, _ = train_p2p(eng, eng.encoder, {s: history(s) for s in STYLES}, _p2p_cfg(steps=1, base_adapter="k1c0"))
    p2p.save(hyper, tmp_path / "art" / "p2p")
    eng.folder = tmp_path / "art"
    settings = DecodingSettings(max_new_tokens=3, min_new_tokens=3)
    table = bench_methods(eng, users, "Paraphrase: hello there", settings, 3, ["rag", "oppu", "p2p", "exact"],
                          folder=tmp_path / "bench", configs={"oppu": {"max_steps": 2}, "exact": {"max_pairs": 2}})
    assert list(table) == ["rag", "oppu", "p2p", "exact"]
    for m, row in table.items():
        assert row["onboarding_s"] > 0 and row["latency_s_per_query"] > 0 and row["bytes_per_user"] > 0, (m, row)
    rag_bytes = sorted(len(pickle.dumps(RagIndex(u.items, eng.task))) for u in users.values())
    assert table["rag"]["bytes_per_user"] == int(sum(rag_bytes) / 2)  # the median of two users
    assert table["oppu"]["bytes_per_user"] > 4 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4) * 4  # the adapter file, on disk
    assert table["p2p"]["bytes_per_user"] == 4 * 4 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4)
    assert 0 < table["exact"]["indexing_s"] <= table["exact"]["onboarding_s"]
    assert list(eng.model.peft_config) == ["k1c0"]  # OPPU's users' adapters left the model afterwards
    text = format_methods(table)
    assert all(f"| {m} |" in text for m in table) and "(indexing " in text

    eng.folder = tmp_path / "no_p2p"  # artifacts without a hypernetwork: a skipped row, not a crash
    table = bench_methods(eng, users, "Paraphrase: hi", settings, 1, ["p2p", "rag"])
    assert "personalize build" in table["p2p"]["skipped"] and table["rag"]["latency_s_per_query"] > 0
    assert "skipped: no P2P hypernetwork" in format_methods(table)
    with pytest.raises(ValueError, match="unknown"):
        bench_methods(eng, users, "x", settings, 1, ["rag", "nope"])
    with pytest.raises(ValueError, match="max_steps"):  # bad settings are errors, not skipped rows
        bench_methods(eng, users, "x", settings, 1, ["oppu"], folder=tmp_path, configs={"oppu": {"max_steps": 0}})
