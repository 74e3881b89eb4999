"""Fit my style and its versions: the fit (with the verdict in plain words), the refit on the history plus every vote
(methods/card/votes.py's), the versions of a style and restoring one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from personalize.methods.card import onboard
from personalize.methods.card.adapters import adapter_name
from personalize.methods.card.config import PAIR_OBJECTIVES
from personalize.data import Item
from personalize.methods.card.person import fit_person, prepared_items
from personalize.lm.cpu_threads import trim_memory
from personalize.methods.card.votes import Refinement, Vote, VoteFeatures, refine_pairs, refine_tokens
from personalize.methods.base import fingerprint
from personalize.methods.card.onboard import UserFit
from personalize.methods.card.style import UserStyle
from personalize.studio.histories import Histories, number_ranges
from personalize.studio.service import Service


def fit_verdict(diagnostics: dict | None, cold_start: bool = False, fallback: bool = True, n_votes: int = 0,
                why_kept: str | None = None, base_name: str = "your cluster's model") -> str:
    """In plain words: does the user's vector beat their cluster's model on their held-out items, how sure that is
    (`own_minus_cluster`, held_out_interval's, when the fit measured it), and what CARD then decodes. Reads
    `helps` (own vector vs no head, set by the fit) with `acc_own` and `acc_no_head`; `fallback`: whether this
    build's CARD then shows the cluster model's output (StyleSettings.fallback, chosen by tune); `why_kept`:
    why a build without the fallback keeps a losing style (kept_reason), said beside it, never left out; `base_name`:
    what the style was judged against (a cluster of one's own adapter, where they have one)."""
    d = diagnostics or {}
    if cold_start:
        return "Your history is too short to fit your own vector yet, so CARD uses your cluster's shared head."
    helps, own, base = d.get("helps"), d.get("acc_own"), d.get("acc_no_head")
    if helps is None or own is None or base is None:
        return ("Too few items to tell whether your vector helps (too few held out to compare it with your "
                "cluster's model); add more writing and refit.")
    a, b = _percents(float(own), float(base))
    sure = _uncertainty(d.get("own_minus_cluster"))
    if helps:
        return f"Your vector helps: it predicts {a} of your held-out words vs {b} for {base_name}{sure}."
    if n_votes:
        return (f"Your style does not beat {base_name} on your held-out writing ({a} vs {b}), but your "
                f"{n_votes} vote{'s' * (n_votes != 1)} ask for it, so CARD decodes with your style.")
    if fallback:
        return (f"Your vector does not beat {base_name} on your held-out items ({a} vs {b}{sure}). What CARD "
                f"decodes for you follows the decoded check where it ran; without one, CARD will show {base_name}'s "
                "output for you; a 👍 on a CARD output asks for your style instead.")
    return (f"Your vector does not beat {base_name} on your held-out items ({a} vs {b}{sure}); this build "
            f"still decodes CARD with it: {why_kept or 'it was built to keep every style'}. For {base_name}'s "
            "output, set α = 0 in Compare.")


def interval_word(lo: float, hi: float) -> str:
    """The page's one reading of a 95 % interval of a difference: above 0 "better", below 0 "worse", across 0
    "not sure", whatever the figure and however many items (the count stands beside it)."""
    return "better" if lo > 0 else "worse" if hi < 0 else "not sure"


def _uncertainty(interval: dict | None) -> str:
    """", a difference of −6 points, 95 % interval −15 to +3 over your 5 held-out items: not sure"."""
    if not interval:
        return ""
    lo, hi = (100 * v for v in interval["ci95"])
    return (f"; a difference of {100 * interval['mean']:+.0f} points, 95 % interval {lo:+.0f} to {hi:+.0f} over "
            f"your {interval['items']} held-out items: {interval_word(lo, hi)}")


def base_name(style) -> str:
    """What a style decodes over at α = 0, in the page's words: the person's own adapter, else their cluster's."""
    return "your own adapter" if style is not None and getattr(style, "own", None) else "your cluster's model"


def decoded_verdict(check, fallback: bool) -> str:
    """Fit's verdict by decoding (explorer.HeldOutCheck), in plain words with its count and interval: the figure
    Explore's rows at α = 0 and the build's α show for the same held-out items, and what Compare then decodes."""
    d, n, base = check.difference, check.difference["n"], "your own adapter" if check.own else "your cluster's model"
    lo, hi = d["ci95"]
    which = f" ({number_ranges(check.numbers)} in My writing)" if check.numbers else ""
    return (f"Decoded on your newest {n} items{which}, held out (Explore with {n} held out shows these two rows): "
            f"card at α = {check.alpha:g} scores {check.card:.3f} against {check.base:.3f} for your base at α = 0 "
            f"({base}), in ROUGE-L against each held-out text where an output that repeats one of your other "
            f"texts scores 0 (card repeated one in {check.card_repeats} of {n}, your base in {check.base_repeats}); "
            f"a difference of {d['mean']:+.3f}, 95 % interval {lo:+.3f} to {hi:+.3f} over {n} items: "
            f"{interval_word(lo, hi)}. " + (
                f"So Compare shows {base}'s output for card (the fallback): your style decoded worse here. A 👍 on a "
                "card output asks for your style; α = 0 gives your base too." if fallback and hi < 0 else
                f"So Compare decodes card with your style at this build's α = {check.alpha:g}, the strength that "
                "measured best over its validation people (an α chosen per person from a few decoded items "
                "measured no better there, docs/RESULTS.md); α = 0 in Compare gives your base."))


def kept_reason(meta: dict) -> str:
    """Why this build decodes a style that lost on its person's held-out items, from what its tune measured on the
    validation people (the fallback step): a tie is said as a tie, never as a loss."""
    sweep = meta.get("report", {}).get("tune", {}).get("fallback", {}).get("sweep", {})
    off, on = (sweep.get(v, {}).get("rougeL_copy_aware", sweep.get(v, {}).get("rougeL")) for v in ("off", "on"))
    if off is None or on is None:
        return "its tuning did not try showing the cluster model instead"
    if off > on:
        return (f"on its validation people, showing the cluster model instead for such people lowered ROUGE-L "
                f"({on:.3f} vs {off:.3f} keeping their styles)")
    return (f"on its validation people, showing the cluster model instead changed nothing measurable (ROUGE-L "
            f"{off:.3f} either way), and the build keeps styles when it makes no difference")


def held_out_interval(engine, fit: UserFit, n_boot: int = 2000, seed: int = 0) -> dict | None:
    """Own style minus the cluster model in held-out next-word accuracy (the verdict's difference), with its
    bootstrap 95 % interval over the held-out items (each resampled with all its words): a verdict on five
    items is a guess, and the page says how much of one. None without a tokens fit with 2+ held-out items."""
    from personalize.methods.card.head import TokenData
    from personalize.methods.card.style import style_diagnostics

    if fit.features is None or fit.held_style is None or fit.n_hold < 2 or "tokens" not in engine.heads:
        return None
    per = [style_diagnostics(engine.heads["tokens"], TokenData.from_features([f]), fit.held_style, [],
                             engine.cfg.style, 1.0) for f in fit.features[: fit.n_hold]]
    per = [d for d in per if d.get("n")]
    if len(per) < 2:
        return None
    n = np.array([d["n"] for d in per], float)
    gain = np.array([d["acc_own"] - d["acc_no_head"] for d in per]) * n
    idx = np.random.default_rng(seed).integers(0, len(n), size=(n_boot, len(n)))
    lo, hi = np.percentile(gain[idx].sum(1) / n[idx].sum(1), [2.5, 97.5])
    return {"mean": float(gain.sum() / n.sum()), "ci95": [float(lo), float(hi)], "items": len(n)}


def decodes_losing_style(engine, style, alpha: float) -> bool:
    """Whether CARD at `alpha` decodes with a style that lost to the cluster model on its person's held-out items
    (no fallback in this build, no vote asking for it): Compare says so beside the output."""
    return style is not None and style.helps is False and not engine.cfg.style.fallback and alpha > 0


LOSING_STYLE_NOTE = ("your style lost to your cluster's model on your held-out items (Fit my style says by how "
                     "much); this build's CARD still decodes with it, α = 0 gives the cluster model")


def _percents(a: float, b: float) -> tuple[str, str]:
    """Two rates as percentages with the fewest decimals (0-2) that keep different values apart."""
    for digits in (0, 1, 2):
        fa, fb = f"{a:.{digits}%}", f"{b:.{digits}%}"
        if fa != fb or a == b:
            break
    return fa, fb


@dataclass(frozen=True)
class Refit:
    """A style refitted on the history and the person's votes, stored as a new version."""
    version: int
    n_votes: int
    seconds: float
    diagnostics: dict
    verdict: str  # the Fit page's words on it


class Fits(Service):
    def __init__(self, rt, histories: Histories):
        super().__init__(rt)
        self.histories = histories
        # the person's one teacher-forced pass: read ahead after Save, kept from the fit, so that a Fit costs the λ
        # fit only and a vote a pass over its own text only
        self._history: dict[tuple, tuple] = {}
        self._vote_features: VoteFeatures | None = None
        histories.after_rewrites.append(self.read_ahead)

    def read_ahead(self, name: str) -> None:
        """After Save's neutral rewrites (in the background): the pass Fit my style will make, under the cluster
        the person was placed in. Why: the pass is most of a fit (4-7 s for 24 Debian changelog entries on 2
        cores), and a person looks at their cluster before they press Fit. The person is read again under the
        lock: replaced or forgotten meanwhile, nothing of the old history is kept."""
        objective = self.engine.cfg.objectives[0]
        if objective != "tokens":
            return
        with self.model_lock.background:
            items = prepared_items(self.engine, self.store, name)  # stored already: no model work
            k = self.rt.snap_k(None)
            placed = self.store.assignment(name, self.engine.artifacts_id, k)
            if placed is not None and len(items) >= self.engine.cfg.min_fit_items:
                self._history_data(name, adapter_name(k, int(placed["cluster"])), objective, items)
                self._trim_history()

    def _kept_pass(self, name: str):
        """onboard.fit's kept_pass: the pass read ahead (or kept from an earlier fit) for these items, if any."""
        def kept(k: int, cluster: int, items: Sequence[Item]):
            got = self._history.get(self._history_key(name, adapter_name(k, cluster), "tokens", items))
            return got[0] if got is not None else None
        return kept

    def fit(self, name: str, k: int | None = None, progress: Callable[[str], None] | None = None) -> UserFit:
        """Fits the user's style (§1.6); the stored vector is replaced only if the whole fit succeeds. The person is
        read once: the fit's items serve the memory of its features and the refit on the votes already cast."""
        self.rt.need_head("Fit")
        if self.histories.rewrites is not None and not self.histories.rewrites.done() and progress:
            progress("neutral rewrites and the first pass (started when the history was saved)")
        try:
            with self.model_lock:
                fit, items = fit_person(self.engine, self.store, name, k=self.rt.snap_k(k), progress=progress,
                                        kept_pass=self._kept_pass(name))
                if fit.features is not None:
                    key = self._history_key(name, self._fitted_over(fit), "tokens", items)
                    self._history[key] = fit.features, fit.n_hold
                    self._trim_history()
                if not fit.cold_start and self.store.feedback(name):  # the votes already cast count from the first fit
                    if progress:
                        progress("your votes")
                    self.refine(name, items)
                if fit.diagnostics and (gain := held_out_interval(self.engine, fit)) is not None:
                    fit.diagnostics["own_minus_cluster"] = gain  # the page's verdict, with how sure it is
                return fit
        finally:
            trim_memory()  # a fit's freed activations back to the system: the soak's rise came with the fits

    def _history_key(self, name: str, adapter: str, objective: str, items: Sequence[Item]) -> tuple:
        """A pass is the adapter's it was made under: a cluster of one's own adapter is not their cluster's."""
        return (self.engine.artifacts_id, name, adapter, objective, fingerprint([f"{s.x}\n{s.y}" for s in items]))

    def _fitted_over(self, fit) -> str:
        """The adapter a fit's style was fitted over: the person's own (a cluster of one), else their cluster's."""
        own = fit.style.own if fit.style is not None else None
        return self.engine.own.peft_name(own) if own else adapter_name(fit.k, fit.cluster)

    def refit_over_own(self, name: str) -> None:
        """The person's own adapter is ready: a style fitted over their cluster's is fitted again over it (a new
        version); a person who has not fitted yet gets it at their first Fit."""
        if self.store.vector(name, self.engine.artifacts_id) is not None:
            self.fit(name)

    def forget_user(self, name: str) -> None:
        """Drops what this process keeps of the person's fits (forget me), their own adapter included."""
        self.engine.own.forget(name)
        self._history = {k: v for k, v in self._history.items() if k[1] != name}
        if self._vote_features is not None:
            self._vote_features.clear()

    def _trim_history(self) -> None:
        while len(self._history) > 32:
            self._history.pop(next(iter(self._history)))

    def _history_data(self, name: str, adapter: str, objective: str, items: Sequence[Item]):
        """(history data of the head, n items, n held out) under `adapter`: kept from the fit, else one pass (after a
        restart)."""
        key = self._history_key(name, adapter, objective, items)
        if key not in self._history:
            self.engine.use_adapter(adapter)
            data = onboard.features(self.engine, items) if objective == "tokens" else onboard.user_data(self.engine, items, objective)
            self._history[key] = (data, onboard.n_held_out(self.engine, items))
        data, n_hold = self._history[key]
        return data, len(items), n_hold

    def refine(self, name: str, items: Sequence[Item] | None = None) -> Refit:
        """Refits the user's style on their history and every vote they cast (methods/card/votes.py) and stores it as a
        new version; `items`: the history as the fit just prepared it (else read here)."""
        got = self.store.vector(name, self.engine.artifacts_id)
        if got is None:
            raise ValueError(f"fit {name!r}'s style first (Fit my style); their votes are kept and count from then on")
        stats = got[1]["stats"]
        if stats.get("cold_start"):
            raise ValueError(f"{name!r} has too few history items for a style of their own; votes count once it fits")
        votes = [Vote.from_row(r) for r in self.store.feedback(name)]
        if not votes:
            raise ValueError(f"{name!r} has not voted yet")
        k, cluster = int(stats["k"]), int(stats["cluster"])
        objective = stats.get("objective", self.engine.cfg.objectives[0])
        with self.model_lock:
            if self._vote_features is None or self._vote_features.engine is not self.engine:
                self._vote_features = VoteFeatures(self.engine)
            items = items if items is not None else prepared_items(self.engine, self.store, name)
            # the votes refit the style over what it was fitted over: a cluster of one's own adapter stays theirs
            own = getattr(UserStyle.from_stored(self.store.style(name, self.engine.artifacts_id)), "own", None)
            over_own = self.engine.own.activate(own) if own else None
            adapter = over_own or adapter_name(k, cluster)
            data, n_items, n_hold = self._history_data(name, adapter, objective, items)
            fs = self.cfg.feedback
            if objective in PAIR_OBJECTIVES:
                r: Refinement = refine_pairs(self.engine, objective, data, n_items, n_hold, votes, k, cluster,
                                             self._vote_features, fs, adapter=adapter)
            else:
                r = refine_tokens(self.engine, data, n_hold, votes, adapter, self._vote_features, fs,
                                  far=bool(stats.get("far")))
            r.style.own = own if over_own else None
        trim_memory()  # as after a fit
        keep = dict(stats, diagnostics=r.diagnostics, loss_curve=r.curve, n_votes=r.n_votes,
                    stages_s={"refit on votes": round(r.seconds, 4)})
        extras = r.style.extras_bytes() if objective not in PAIR_OBJECTIVES else None
        vid = self.store.save_vector(name, self.engine.artifacts_id, r.style.lam, self.engine.lm.model_id, keep,
                                     extras, source="vote", note=f"history + {r.n_votes} vote{'s' * (r.n_votes != 1)}")
        return Refit(vid, r.n_votes, round(r.seconds, 3), r.diagnostics,
                     fit_verdict(r.diagnostics, fallback=self.engine.cfg.style.fallback, n_votes=r.n_votes,
                                 why_kept=kept_reason(self.engine.meta), base_name=base_name(r.style)))

    def versions(self, name: str) -> list[dict]:
        """The user's styles under this build, newest first: id, time, source, note, votes, helps, current."""
        rows = self.store.versions(name, self.engine.artifacts_id)
        return [{"version": r["id"], "created": r["created"][:19].replace("T", " "), "source": r["source"],
                 "note": r["note"], "votes": r["stats"].get("n_votes", 0),
                 "helps": r["stats"].get("diagnostics", {}).get("helps"), "current": r["current"]}
                for r in reversed(rows)]

    def restore(self, name: str | None, version: float | None) -> str:
        """Makes an earlier version of the person's style the current one (the page gives its number)."""
        name = self.rt.need_user(name)  # another login's person: taken, whatever the version box holds
        if version is None:
            raise ValueError("enter the number of the version to restore (first column of the table)")
        self.store.restore_version(name, self.engine.artifacts_id, int(version))
        return f"Version {int(version)} is {name}'s style again; CARD decodes with it from now on."
