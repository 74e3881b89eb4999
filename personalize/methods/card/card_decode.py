"""CARD's own three methods' decoding (base, cluster, card and its variants, METHOD §1.5, §1.10) over the engine:
alone (`generate`, eval and bench) or as rows of a mixed batch (`rows`, the studio's scheduler), with the person's
nearest items before the prompt when the style retrieves them, and the fallback to the cluster model's output for a
person whose style lost to it on their held-out items. method.py's classes are the methods the registry serves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from personalize.methods.card.decoding import card_generate
from personalize.methods.card.adapters import cluster_adapter
from personalize.serving import generation
from personalize.serving.generation import Generation
from personalize.serving.settings import DecodingSettings
from personalize.catalog import CARD_ROWS, CardRows
from personalize.data import Item
from personalize.methods.card.steer import CardSteer, card_parts
from personalize.methods.card.no_copy import line_breaks
from personalize.methods.scaffold import scaffold_lines
from personalize.serving.rows import DecodeRow

FALLBACK_NOTE = ("your style did not beat your cluster's model on your own held-out items, "
                 "so this is the cluster model's output")
OWN_NOTE = "over your own adapter (a cluster of one), with your style fitted on top of it"
OWN_FALLBACK_NOTE = ("your style did not beat your own adapter on your held-out items, so this is your own "
                     "adapter's output")


def rows_kind(method: str) -> CardRows:
    """What a CARD method decodes with (catalog.CARD_ROWS): the frozen LM, the cluster LoRA, or it steered."""
    if method not in CARD_ROWS:
        raise ValueError(f"unknown method {method!r}; choose from {list(CARD_ROWS)}")
    return CARD_ROWS[method]


def _defaults(engine, method: str, k, settings, budget):
    """(what the method decodes with, K, settings, budget): the build's where the caller gives none."""
    return rows_kind(method), k or engine.cfg.default_k, settings or engine.cfg.decoding, budget or engine.cfg.budget


def _adapter(kind: CardRows, k: int, cluster: int | None) -> str | None:
    """The adapter the rows run: None for the frozen LM, else the person's cluster LoRA (K = 1's for k = 1)."""
    return cluster_adapter(k, cluster or 0) if kind.cluster_lora else None


def base_adapter(engine, kind: CardRows, k: int, cluster: int | None, style) -> str | None:
    """What a steered row decodes over: the style's person's own adapter where they have one (a cluster of one,
    own.py; their whole style, so card_shuffled takes their partner's), else the cluster's. Call under the
    model lock: it may load the adapter."""
    own = getattr(style, "own", None) if kind.steered else None
    if own:
        ada = engine.own.activate(own)
        if ada is not None:
            return ada
    return _adapter(kind, k, cluster)


def generate(engine, prompts: Sequence[str], method: str, cluster: int | None = None, lam=None,
             k: int | None = None, settings: DecodingSettings | None = None, objective: str | None = None,
             trace: bool = False, budget=None, items: Sequence[Item] | None = None) -> list[Generation]:
    """Decode with one of the core methods: base, cluster (the user's cluster LoRA), card and its variants.

    `items`: the person's history (prompts filled), for a style with retrieval: their BM25-nearest items
    go before each prompt, as the RAG baseline places them.

    `lam` is the person's style: a UserStyle, a λ array ([D], or [B, D] for one per prompt), a list of
    either, or None (λ = 1). With the style's fallback on, a person whose style lost to the cluster model
    on their held-out items gets the cluster model's output, with a note saying so."""
    kind, k, s, budget = _defaults(engine, method, k, settings, budget)
    if not kind.steered:
        engine.use_adapter(_adapter(kind, k, cluster))
        return generation.generate(engine.model, engine.tok, list(prompts), budget, s)
    head, style, styles, s = card_parts(engine, method, lam, len(prompts), s, objective)
    bases = {base_adapter(engine, kind, k, cluster, st) for st in styles}
    if len(bases) > 1:
        raise ValueError("one call decodes over one adapter: people with adapters of their own decode alone")
    engine.use_adapter(bases.pop())
    back = [i for i, st in enumerate(styles) if style.fallback and st.helps is False]
    out: list[Generation | None] = [None] * len(prompts)
    if back:  # the cluster model's own output: its prompt, no retrieved items
        for i, g in zip(back, generation.generate(engine.model, engine.tok, [prompts[i] for i in back], budget, s)):
            g.note, out[i] = FALLBACK_NOTE, g
    rest = [i for i in range(len(prompts)) if out[i] is None]
    if rest:
        card_prompts, card_budget, scaffold, chosen = [prompts[i] for i in rest], budget, (), [None] * len(rest)
        if style.retrieval and items and s.alpha > 0:  # α scales the style's every part: at 0, no items either
            card_prompts, card_budget, chosen = retrieval_prompts(engine, items, card_prompts, budget)
            scaffold = scaffold_lines(engine.task)
        gens = card_generate(engine.model, engine.tok, card_prompts, card_budget, s, head,
                             styles=[styles[i] for i in rest], style=style, n_layers=engine.cfg.head.n_layers,
                             trace=trace, scaffold=scaffold)
        for i, g, c in zip(rest, gens, chosen):
            out[i] = g if trace or c is None else replace(g, trace=c)
    return out


def rows(engine, prompts: Sequence[str], method: str, cluster: int | None = None, lam=None, k: int | None = None,
         settings: DecodingSettings | None = None, objective: str | None = None, trace: bool = False,
         budget=None, items: Sequence[Item] | None = None) -> list[DecodeRow]:
    """`generate`'s work as mixed-batch rows (serving/runner.py): the same prompts, adapters and CARD rule per row."""
    kind, k, s, budget = _defaults(engine, method, k, settings, budget)
    if not kind.steered:
        return [DecodeRow(p, budget, s, _adapter(kind, k, cluster)) for p in prompts]
    head, style, styles, s = card_parts(engine, method, lam, len(prompts), s, objective)
    out: list[DecodeRow] = []
    for p, st in zip(prompts, styles):
        ada = base_adapter(engine, kind, k, cluster, st)
        own = ada != _adapter(kind, k, cluster)
        if style.fallback and st.helps is False:
            out.append(DecodeRow(p, budget, s, ada, note=OWN_FALLBACK_NOTE if own else FALLBACK_NOTE))
            continue
        card_prompt, card_budget, scaffold, chosen = p, budget, (), None
        if style.retrieval and items and s.alpha > 0:
            (card_prompt,), card_budget, (chosen,) = retrieval_prompts(engine, items, [p], budget)
            scaffold = scaffold_lines(engine.task)  # the items' header: never the answer
        steer = CardSteer(head, st, style, engine.cfg.head.n_layers, engine.tok.eos_token_id, line_breaks(engine.tok))
        out.append(DecodeRow(card_prompt, card_budget, s, ada, steer, trace=chosen, want_trace=trace,
                             scaffold=scaffold, note=OWN_NOTE if own else None))
    return out


def retrieval_prompts(engine, items: Sequence[Item], prompts: Sequence[str], budget):
    """Each prompt with the person's BM25-nearest history items before it, the budget widened to fit, and each
    prompt's trace (which items: Compare shows them, as it does RAG's)."""
    from personalize.methods.base import UserContext, widened
    from personalize.methods.rag import RagMethod, retrieved_trace

    rag = RagMethod(engine)
    user = UserContext("_", list(items), templated=frozenset(i for i, it in enumerate(items) if not it.x))
    built = [rag.build_prompt(user, p) for p in prompts]
    return ([b for b, _ in built], widened(budget, rag.extra_tokens),
            [retrieved_trace(user, hits) for _, hits in built])
