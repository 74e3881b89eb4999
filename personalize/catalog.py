"""Every method's name, defined once, with what the rest of the code needs to know about it (METHOD §2-§5).

Importable without the model code (the CLI's light commands, such as `campaign status`, check names without
loading torch). The classes are found by name in methods.registry; everything else (the Compare columns,
the studio's background first uses, eval's and bench's lists, CARD's variants) is read from here.
Imports nothing of personalize.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CardRows:
    """What one of CARD's own methods decodes with."""

    cluster_lora: bool  # the person's cluster LoRA (else the frozen LM)
    steered: bool  # the person's style re-ranks the LoRA's tokens


_FROZEN, _CLUSTER, _STEERED = CardRows(False, False), CardRows(True, False), CardRows(True, True)
_LAMBDA_ALONE = dict(bias=False, memory=False, retrieval=False, fallback=False, form=False, far_knn_weight=0.0)


@dataclass(frozen=True)
class MethodInfo:
    """One method and its metadata."""

    name: str
    family: str  # "card": CARD's own three (base, cluster, card); "variant": a CARD variant (eval, tune); "compared"
    summary: str
    column: int | None = None  # its place among the Compare tab's columns (None: not served by the studio)
    default: bool = False  # ticked in Compare and Quick pair at the start (needs no per-user training)
    slow_first_use: bool = False  # per-user work of minutes on first use: a background job with progress
    needs: str | None = None  # the part of a build it needs beyond the cluster adapters and heads
    bench: int | None = None  # its place in `bench`'s efficiency table (paper Table 5)
    serving_bench: bool = False  # one of the rows of bench's "serving" figures (a Compare's mixed batch)
    style: dict = field(default_factory=dict)  # a CARD variant: its StyleSettings changes from the build's style
    # CARD's own rows (CardRows): the frozen LM, the person's cluster LoRA, or that LoRA with the person's style
    # re-ranking its tokens; None for the compared methods
    rows: CardRows | None = None
    # its config's CPU budget wherever the studio and eval run it (EXACT: 4 history pairs, where its config's
    # default is the paper's 32: its first use scores 42 attributes × 3 steps a pair, ~15-40 s a pair on 2 cores)
    budget: dict = field(default_factory=dict)


CATALOG: tuple[MethodInfo, ...] = (
    MethodInfo("base", "card", "the frozen LM", column=0, default=True, serving_bench=True, rows=_FROZEN),
    MethodInfo("cluster", "card", "the person's cluster LoRA", column=1, default=True, serving_bench=True,
               rows=_CLUSTER),
    MethodInfo("card", "card", "the cluster LoRA with the person's style re-ranking its tokens", column=2,
               default=True, bench=3, serving_bench=True, rows=_STEERED),
    MethodInfo("rag", "compared", "BM25 top-4 of the history before the prompt", column=4, default=True, bench=0),
    MethodInfo("pag", "compared", "RAG plus a stored profile summary", column=5),
    MethodInfo("exact", "compared", "42 attributes, greedy k = 3, memory in the store", column=3,
               slow_first_use=True, bench=4, budget=dict(max_pairs=4)),  # not ticked: its first use is minutes on a CPU (a background job)
    MethodInfo("cope", "compared", "contrastive decoding against the base model", column=6, default=True,
               serving_bench=True),
    MethodInfo("oppu", "compared", "a per-user LoRA trained on first use", column=7, slow_first_use=True, bench=1),
    MethodInfo("p2p", "compared", "a hypernetwork's LoRA from the person's profile", column=8, needs="p2p",
               bench=2, serving_bench=True),
    # CARD's variants compared on dev (METHOD §1.10): the paper's CARD is λ alone; `card` is CardConfig.style
    MethodInfo("card_paper", "variant", "λ alone (the paper's CARD)", rows=_STEERED, style=_LAMBDA_ALONE),
    MethodInfo("card_bias", "variant", "λ and the token bias", rows=_STEERED, style=_LAMBDA_ALONE | dict(bias=True)),
    MethodInfo("card_knn", "variant", "λ and the kNN memory", rows=_STEERED, style=_LAMBDA_ALONE | dict(memory=True)),
    MethodInfo("card_rag", "variant", "λ with the person's nearest items in the prompt", rows=_STEERED,
               style=_LAMBDA_ALONE | dict(retrieval=True)),
    # `card` without the person's form (their openings' bias): what the form adds at decoding
    MethodInfo("card_no_form", "variant", "the build's style without the bias on the person's openings", rows=_STEERED,
               style=dict(form=False)),
)
BY_NAME: dict[str, MethodInfo] = {m.name: m for m in CATALOG}

# Columns of the Compare tab, in order: every method the studio serves.
ALL_METHODS = tuple(m.name for m in sorted((m for m in CATALOG if m.column is not None), key=lambda m: m.column))
# What Compare and Rate start with: the methods that need no per-user training.
DEFAULT_METHODS = tuple(m for m in ALL_METHODS if BY_NAME[m].default)
CORE_METHODS = tuple(m.name for m in CATALOG if m.family == "card")  # base, cluster, card
COMPARED = tuple(m.name for m in CATALOG if m.family == "compared")  # the methods CARD is compared with
VARIANTS: dict[str, dict] = {m.name: m.style for m in CATALOG if m.family == "variant"}
CARD_ROWS: dict[str, CardRows] = {m.name: m.rows for m in CATALOG if m.rows}  # CARD's own methods and variants
STEERED: dict[str, dict] = {m.name: m.style for m in CATALOG if m.rows and m.rows.steered}  # card and its variants
CARD_METHODS = tuple(STEERED)  # the default CARD and its variants
SLOW_FIRST_USE = tuple(m.name for m in CATALOG if m.slow_first_use)
BENCH_METHODS = tuple(m.name for m in sorted((m for m in CATALOG if m.bench is not None), key=lambda m: m.bench))
SERVING_METHODS = tuple(m.name for m in CATALOG if m.serving_bench)
