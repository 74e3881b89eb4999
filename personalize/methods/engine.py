"""The online stage: one loaded LM with every cluster adapter, the encoder and the heads (what the methods decode
with; CARD's own decoding is methods/card/decoding.py and card_decode.py).

Loaded once (CLI command, app, eval, bench); a user is then a cluster id and a
λ vector, so switching users costs a dictionary look-up and, across clusters,
one `set_adapter` call. Onboarding = embed → assign → features → λ fit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors.torch import load_file

from personalize.methods.artifacts import ArtifactsError, artifacts_meta
from personalize.methods.card.adapters import adapter_name, add_adapters, load_adapters
from personalize.serving.rows import DecodeRow
from personalize.serving.runner import decode_rows
from personalize.methods.card.cluster import assign, closeness, user_embeddings
from personalize.methods.card.config import FORMAT_VERSION, CardConfig
from personalize.data import Item, Task, TASKS
from personalize.serving.generation import Generation
from personalize.lm.features import generate_with_states, teacher_forced
from personalize.methods.card.head import PairData, PersonalizationHead, TokenData, diagnostics, fit_user
from personalize.methods.card.config import PAIR_OBJECTIVES
from personalize.lm.cpu_threads import hands_back_team, release_team
from personalize.methods.card.style import UserStyle, fit_form, fit_lambda_bias, memory_from_features, style_diagnostics
from personalize.lm.models import LM, load_encoder, load_lm
from personalize.lm.model_config import EncoderConfig, ModelConfig
from personalize.methods.card.neutral import neutral, raw_rewrites
from personalize.methods.card.own import OwnAdapters

@dataclass
class Clusters:
    """The population's embeddings and k-means centroids for every built K."""

    users: list[str]
    embeddings: np.ndarray  # [N, E]
    centroids: dict[int, np.ndarray]  # K -> [K, E]
    labels: dict[int, np.ndarray]  # K -> [N]


@dataclass
class UserFit:
    """What a fit produced for one user, and what it cost."""

    cluster: int
    distances: list[float]
    k: int
    lam: np.ndarray
    objective: str
    n_items: int
    stages_s: dict[str, float] = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    loss_curve: list[float] = field(default_factory=list)
    cold_start: bool = False
    style: UserStyle | None = None  # λ with the person's token bias and memory (None: λ alone)
    # the tokens head's held-out items and the style fitted without them (eval's teacher-forced specificity)
    held: TokenData | None = field(default=None, repr=False)
    held_style: UserStyle | None = field(default=None, repr=False)
    # the tokens head's one teacher-forced pass over every item (votes refit λ without redoing it) and n held out
    features: list | None = field(default=None, repr=False)
    n_hold: int = 0
    far: bool = False  # further from every cluster than the build's people (StyleSettings.far_share)

    @property
    def total_s(self) -> float:
        return sum(self.stages_s.values())

    def stats(self) -> dict:
        return {"cluster": self.cluster, "k": self.k, "objective": self.objective, "n_items": self.n_items,
                "stages_s": self.stages_s, "diagnostics": self.diagnostics, "loss_curve": self.loss_curve,
                "cold_start": self.cold_start, "far": self.far,
                "own_adapter": bool(self.style is not None and self.style.own)}


class Engine:
    def __init__(self, cfg: CardConfig, lm: LM, model, encoder, clusters: Clusters,
                 heads: dict[str, PersonalizationHead], task: Task, meta: dict, population_lams: dict | None = None):
        self.cfg, self.lm, self.model = cfg, lm, model
        self._encoder = encoder  # the model, or its EncoderConfig: loaded on first use (Engine.load)
        self._encoder_lock = threading.Lock()
        self.tok = lm.tokenizer
        self.clusters, self.heads, self.task, self.meta = clusters, heads, task, meta
        self.population_lams = population_lams or {}
        self._active: str | None = None
        self.folder: Path | None = None  # the artifacts folder, set by load (methods find their files there)
        self._pending_adapters: list[str] = []  # cluster adapters load(adapters_later=True) left for later
        self._adapters_lock = threading.Lock()
        # the people's own adapters (a cluster of one); the studio keeps them beside its database
        self.own = OwnAdapters(self, Path("data") / "oppu" / str(self.artifacts_id))

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, folder: str | Path, model: ModelConfig | None = None, adapters_later: bool = False) -> "Engine":
        """The build in `folder`. adapters_later: only the first cluster adapter now, the others on first
        need or by load_pending_adapters (the app calls it once its page answers: ~1 s of its start)."""
        folder = Path(folder)
        meta = artifacts_meta(folder)
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise ArtifactsError(f"artifacts at {folder} have format {meta['format_version']}, newer than this code "
                                 f"reads ({FORMAT_VERSION}): upgrade personalize or rebuild them")
        cfg = CardConfig.from_dict(meta["settings"])
        if model is not None:
            cfg = replace(cfg, model=model)
        lm = load_lm(cfg.model)
        names = [adapter_name(k, c) for k in cfg.ks for c in range(k)]
        peft_model = load_adapters(lm.model, folder / "adapters", names[:1] if adapters_later else names)
        z = np.load(folder / "clusters.npz")
        clusters = Clusters(users=meta["users"], embeddings=z["embeddings"],
                            centroids={k: z[f"centroids_k{k}"] for k in cfg.ks},
                            labels={k: z[f"labels_k{k}"] for k in cfg.ks})
        heads, lams = {}, {}
        for obj in cfg.objectives:
            t = load_file(str(folder / f"head_{obj}.safetensors"))
            head = PersonalizationHead(t["P"].shape[1], t["U"].shape[0], t["U"].shape[1])
            head.load_state_dict({"P.weight": t["P"], "U": t["U"], "h_mean": t["h_mean"], "h_std": t["h_std"],
                                  "gamma": t.get("gamma", torch.zeros(()))})  # no gamma: built before hard_pairs
            heads[obj] = head.eval().requires_grad_(False)
            lams[obj] = dict(zip(meta["head_users"][obj], t["lambdas"].numpy()))
        task = TASKS[meta["task"]]
        engine = cls(cfg, replace(lm, model=peft_model), peft_model, cfg.encoder, clusters,
                     heads, task, meta, lams)
        engine.folder = folder
        engine._pending_adapters = names[1:] if adapters_later else []
        release_team()  # the loading thread (often the main one) keeps no OpenMP team: see lm/cpu_threads.py
        return engine

    @property
    def encoder(self):
        """The sentence encoder, loaded when first needed (a saved history, a build): a start of the app
        that serves no new person yet does not pay for it."""
        with self._encoder_lock:
            if isinstance(self._encoder, EncoderConfig):
                self._encoder = load_encoder(self._encoder)
        return self._encoder

    @encoder.setter
    def encoder(self, value) -> None:
        self._encoder = value

    @property
    def artifacts_id(self) -> str:
        return self.meta.get("id", "unbuilt")

    # ------------------------------------------------------------ adapters
    @hands_back_team
    def load_pending_adapters(self) -> None:
        """The cluster adapters a start left for later, in one pass; callers hold the model (no decode or
        training runs on it meanwhile: the studio's model lock, or the one thread that uses the engine)."""
        with self._adapters_lock:
            if self._pending_adapters:
                add_adapters(self.model, self.folder / "adapters", self._pending_adapters)
                self._pending_adapters = []

    def loaded_adapters(self) -> set[str]:
        if self._pending_adapters:
            self.load_pending_adapters()
        return set(self.model.peft_config)

    @property
    def active_adapter(self) -> str | None:
        return self._active

    def use_adapter(self, name: str | None) -> None:
        """Switch the active cluster adapter in memory; None = the base model."""
        if self._pending_adapters:
            self.load_pending_adapters()
        if name == self._active:
            return
        if name is None:
            self.model.base_model.disable_adapter_layers()
        else:
            if self._active is None:
                self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(name, inference_mode=True)
        self._active = name

    # ------------------------------------------------------------ users
    def neutral_rewrites(self, texts: Sequence[str]) -> list[str]:
        """The base model's plain rewrite of each text (§1.8); a rule-based plain version where the model's
        rewrite echoes the instruction or loses the content (neutral.py)."""
        return [neutral(t, r) for t, r in zip(texts, raw_rewrites(self, texts))]

    def prepare_items(self, items: Sequence[Item], neutral: dict[int, str] | None = None) -> list[Item]:
        """Every item with a prompt: free-form items get the task template of a neutral rewrite."""
        rewrites = dict(neutral or {})
        todo = [i for i, it in enumerate(items) if not it.x and i not in rewrites]
        rewrites |= dict(zip(todo, self.neutral_rewrites([items[i].y for i in todo])))
        return [it if it.x else replace(it, x=self.task.prompt(rewrites[i])) for i, it in enumerate(items)]

    @hands_back_team  # asked for on a request's thread too (a K whose assignment is not stored yet)
    def embed(self, items: Sequence[Item]) -> np.ndarray:
        return user_embeddings(self.encoder, [[it.y for it in items]])[0]

    def assign(self, embedding: np.ndarray, k: int) -> tuple[int, list[float]]:
        if k not in self.clusters.centroids:
            raise ValueError(f"K={k} was not built; built: {sorted(self.clusters.centroids)}")
        return assign(embedding, self.clusters.centroids[k])

    def negatives(self, items: Sequence[Item], objective: str) -> list[tuple[int, object]]:
        """(item index, y− features) under the active cluster model: its greedy output for every item and,
        for "hard_pairs", `n_samples` sampled outputs per item too (seeded, so a refit gives the same λ)."""
        hs, prompts = self.cfg.head, [it.x for it in items]

        def draw(**sampling):
            return generate_with_states(self.model, self.tok, prompts, hs.n_layers, self.cfg.budget,
                                        max_new_tokens=self.cfg.budget.max_target_tokens, **sampling)

        negs = list(enumerate(draw()))
        if objective == "hard_pairs" and hs.n_samples:
            torch.manual_seed(hs.seed)
            for _ in range(hs.n_samples):
                negs += list(enumerate(draw(sample=True, top_k=hs.top_k, temperature=hs.temperature)))
        return negs

    def user_data(self, items: Sequence[Item], objective: str, negatives=None):
        """The head's training signal for these items under the active cluster model."""
        ex = [(it.x, it.y) for it in items]
        hs = self.cfg.head
        if objective == "tokens":
            feats = teacher_forced(self.model, self.tok, ex, hs.n_layers, self.cfg.budget, top_k=hs.top_k)
            return TokenData.from_features(feats)
        chosen = teacher_forced(self.model, self.tok, ex, hs.n_layers, self.cfg.budget)
        if negatives is None:
            negatives = self.negatives(items, objective)
        return PairData([chosen[i] for i, _ in negatives], [f for _, f in negatives], [i for i, _ in negatives],
                        covariate=objective == "hard_pairs")

    def fit(self, items: Sequence[Item], k: int | None = None, objective: str | None = None,
            progress=None, kept_pass: Callable[[int, int, Sequence[Item]], list | None] | None = None,
            own: str | None = None) -> UserFit:
        """Onboard a user from their items: cluster, then λ (with held-out diagnostics). `kept_pass(k, cluster,
        items)`: the teacher-forced pass over these items under that cluster's model when one was made already
        (the studio reads ahead after Save), else None; the pass is most of a fit's time. `own`: the key of the
        person's own adapter (a cluster of one, own.py): the style is fitted over it instead of the cluster's."""
        k = k or self.cfg.default_k
        objective = objective or self.cfg.objectives[0]
        if objective not in self.heads:
            raise ValueError(f"no {objective!r} head in these artifacts; built: {sorted(self.heads)}")
        head, stages = self.heads[objective], {}

        def stage(name, fn):
            if progress:
                progress(name)
            t0 = time.perf_counter()
            out = fn()
            stages[name] = round(time.perf_counter() - t0, 4)
            return out

        items = list(items)
        cluster, distances = stage("assign", lambda: self.assign(self.embed(items), k))
        if any(not it.x for it in items):
            items = stage("neutral rewrites", lambda: self.prepare_items(items))
        ones = np.ones(head.d, dtype=np.float32)
        if len(items) < self.cfg.min_fit_items:
            return UserFit(cluster, distances, k, ones, objective, len(items), stages, cold_start=True)
        base = self.own.activate(own) if own else None
        self.use_adapter(base or adapter_name(k, cluster))
        n_hold = self.n_held_out(len(items))
        if objective == "tokens":
            kept = kept_pass(k, cluster, items) if kept_pass is not None and base is None else None
            fit = self._fit_tokens(items, head, cluster, distances, k, n_hold, stage, stages, kept)
            fit.style.own = own if base else None
            return fit
        if objective in PAIR_OBJECTIVES:
            negs = stage("negatives", lambda: self.negatives(items, objective))
            data = stage("features", lambda: self.user_data(items, objective, negatives=negs))
        else:
            data = stage("features", lambda: self.user_data(items, objective))
        diag = {}
        if n_hold:
            fit_part, held = split_held_out(data, n_hold, len(items))
            lam_fit, _ = fit_user(head, fit_part, self.cfg.head)
            others = list(self.population_lams.get(objective, {}).values())[:16]
            diag = diagnostics(head, held, lam_fit, [torch.as_tensor(o) for o in others], self.cfg.head)
        lam, curve = stage("fit", lambda: fit_user(head, data, self.cfg.head))
        lam = lam.numpy().astype(np.float32)
        return UserFit(cluster, distances, k, lam, objective, len(items), stages, diag, curve, style=UserStyle.of(lam))

    def n_held_out(self, n_items: int) -> int:
        """Items held out of a fit to judge it (the first ones: the newest, in LaMP order)."""
        return int(round(self.cfg.holdout * n_items)) if n_items >= 5 else 0

    def features(self, items: Sequence[Item]):
        """One teacher-forced pass over the person's texts under the active model (states, top-k, ids)."""
        hs = self.cfg.head
        return teacher_forced(self.model, self.tok, [(it.x, it.y) for it in items], hs.n_layers, self.cfg.budget,
                              top_k=hs.top_k)

    def is_far(self, k: int, distances: Sequence[float]) -> bool:
        """Whether a person this far from the nearest of K centres is further out than all but
        StyleSettings.far_share of the build's own people (cluster.closeness)."""
        c = self.clusters
        if k not in c.centroids or not len(distances):
            return False
        return closeness(c.embeddings, c.centroids[k], c.labels[k], min(distances))[1] < self.cfg.style.far_share

    def fit_style(self, feats, head: PersonalizationHead, votes: TokenData | None = None,
                  far: bool = False) -> tuple[UserStyle, list[float]]:
        """λ (with the token bias when the style uses one) and the kNN memory from one pass's features; `far`: the
        person is beyond the build's clusters, so their memory is kept at StyleSettings.far_knn_weight.
        `votes`: rows of the texts the person preferred (or rejected), weighted (fitting/feedback.py); they join the
        fit of λ and the bias, not the memory (the memory keeps the person's own text)."""
        st, hs = self.cfg.style, self.cfg.head
        data = TokenData.from_features(feats)
        if votes is not None and len(votes):
            data = TokenData.cat([data, votes])
        if st.bias:
            lam, ids, vals, curve = fit_lambda_bias(head, data, hs.rho, st.rho_bias, st.max_bias_tokens, hs.fit_iters,
                                                    center=st.lambda_prior)
        else:
            lam, curve = fit_user(head, data, hs)
            ids, vals = torch.zeros(0, dtype=torch.long), torch.zeros(0)
        own_weight = st.far_knn_weight if far and st.far_knn_weight > 0 else None
        keys, values = (memory_from_features(feats, self.lm.hidden_size, st.max_memory, st.key, head)
                        if st.memory or own_weight else (None, None))
        style = UserStyle(lam.numpy().astype(np.float32), ids.numpy(), vals.numpy().astype(np.float32),
                          knn_weight=own_weight)
        if keys is not None:
            style.keys, style.values = keys, values
        if st.form:
            style.form_keys, style.form_ids, style.form_bias = fit_form(feats, st.form_positions, st.form_prior,
                                                                       st.form_cap)
        return style, curve

    def _fit_tokens(self, items, head, cluster, distances, k, n_hold, stage, stages, feats=None) -> UserFit:
        """The tokens head: one pass (or the one kept), then λ + bias + memory; held-out diagnostics under the
        decoding rule."""
        if feats is None:
            feats = stage("features", lambda: self.features(items))
        else:
            stages["features (made already)"] = 0.0
        far = self.is_far(k, distances)
        diag, own, held = self.held_out_style(feats, n_hold, head, far=far)
        style, curve = stage("fit", lambda: self.fit_style(feats, head, far=far))
        style.helps = diag.get("helps")
        return UserFit(cluster, distances, k, style.lam, "tokens", len(items), stages, diag, curve, style=style,
                       held=held, held_style=own, features=feats, n_hold=n_hold, far=far)

    def held_out_style(self, feats, n_hold: int, head: PersonalizationHead, votes: TokenData | None = None,
                       far: bool = False):
        """(diagnostics, style fitted without them, held-out rows) on the first n_hold items (the newest, in LaMP
        order), judged at α = 1, the rule the head was trained with: whether the style helps is the person's,
        not the slider's. Votes join the fit, never the held-out items."""
        if not n_hold:
            return {}, None, None
        own, _ = self.fit_style(feats[n_hold:], head, votes, far=far)
        held = TokenData.from_features(feats[:n_hold])
        others = [UserStyle.of(o) for o in list(self.population_lams.get("tokens", {}).values())[:16]]
        diag = style_diagnostics(head, held, own, others, self.cfg.style, 1.0)
        lam_only = diagnostics(head, held, torch.as_tensor(own.lam), [torch.as_tensor(o.lam) for o in others],
                               self.cfg.head)
        diag |= {"lambda_only": {k_: v for k_, v in lam_only.items() if isinstance(v, (int, float))}}
        return diag, own, held

    def decode_rows(self, rows: Sequence[DecodeRow], on_step=None) -> list[Generation]:
        """A method's own batch (rewrites, EXACT, tune, eval), every adapter loaded; the studio's use the scheduler."""
        if self._pending_adapters:
            self.load_pending_adapters()
        return decode_rows(self.model, self.tok, rows, on_step)


def split_held_out(data, n_hold: int, n_items: int):
    """Held-out = the first n_hold items (the newest, in LaMP order)."""
    if isinstance(data, PairData):
        return data.select(lambda i: i >= n_hold), data.select(lambda i: i < n_hold)
    # TokenData rows are in item order; split by the share of items (rows are token positions)
    cut = int(len(data) * n_hold / n_items)
    w, opening = data.weight, data.opening
    sl = lambda a, b: TokenData(data.h[a:b], data.cand[a:b], data.base[a:b], data.target[a:b],  # noqa: E731
                                None if w is None else w[a:b], None if opening is None else opening[a:b])
    return sl(cut, len(data)), sl(0, cut)
