"""The page's text: the Markdown the tabs show for what the studio did (the title line, Save's status, the cluster
summary and distance table, Fit's report, the harm guard's note), from the studio's facts. Text from
people and models enters it escaped by the caller (display.md)."""

from __future__ import annotations

from personalize.methods.card.head import opening_key
from personalize.display import md
from personalize.methods.card.onboard import UserFit
from personalize.studio.fits import base_name, fit_verdict, kept_reason
from personalize.studio.histories import Saved, UserState


def header(studio) -> str:
    """What the app's title line says about the build being served."""
    return (f"# Personalization studio\nCARD (cluster LoRA + user vector) next to the base model, EXACT, RAG, PAG, "
            f"COPE, OPPU and Profile-to-PEFT. Artifacts `{studio.served.artifacts_id}` (task {studio.served.task.name}, "
            f"model {studio.served.lm.model_id}, K ∈ {studio.served_builds.ks}); choose another task in *My writing* to switch."
            + coming_line(studio))


def coming_line(studio) -> str:
    """The header's line while the first start's build finishes what the studio does not serve yet."""
    c = studio.coming
    if c.failed:
        return (f"\n\n**The demo build failed** ({md(c.failed)}): the studio serves what it had made; start it again to "
                "build the rest.")
    if not c.pending:
        return ""
    if c.head:
        return (f"\n\n**The demo build is still finishing:** card comes with its head ({c.head_in()}), then card's "
                "check and P2P. Save, My cluster and every Compare column but card's and P2P's serve meanwhile. This line goes "
                "when it is all done.")
    return (f"\n\n**The demo build is still finishing** (card's check on its validation people and "
            f"{', '.join(sorted(c.methods)) or 'nothing else'}, {c.eta_line()}); every tab serves meanwhile, card with "
            "the planned settings. This line goes when it is done.")


def save_message(studio, res: Saved, shown_name: str | None = None) -> str:
    """The My writing status line after a save; `shown_name`: the name as the page shows it."""
    k = studio.served.cfg.default_k
    n, dup = res.n_items, res.duplicates
    dropped = f" ({dup} duplicate item{'' if dup == 1 else 's'} dropped)" if dup else ""
    task = res.task
    note = "" if task == studio.served.task.name else (
        f" No build for **{task}** is loaded: these artifacts were built for **{studio.served.task.name}**, so prompts "
        "use that task's template.")
    near = f", {res.closeness}" if res.closeness else ""
    nearer = f"\n\n{res.nearer}" if res.nearer else ""
    return (f"Saved **{n}** item{'' if n == 1 else 's'} for **{shown_name or res.name}**{dropped}; cluster at K = "
            f"{k}: **{res.clusters[k]}**{near}. Next: *Fit my style*.{note}{nearer}")


def distance_table(state: UserState) -> str:
    """The distance to every centroid as a Markdown table, the user's own cluster marked in a column."""
    rows = [f"| {c} | {d:.4f} | {'◀ you' if c == state.cluster else ''} |" for c, d in enumerate(state.distances)]
    return "\n".join(["| cluster | distance | yours |", "|---|---|---|", *rows])


def cluster_summary(studio, state: UserState) -> str:
    return (f"**{state.name}** is in cluster **{state.cluster}** of K = {state.k}, "
            f"{studio.histories.closeness(state.k, state.distances)}.\n\n{distance_table(state)}")


def fit_message(studio, name: str, fit: UserFit, total_s: float, shown_name: str | None = None) -> str:
    """Fit my style's report as Markdown: the verdict in plain words, seconds per stage (and the wait for a
    busy model), held-out accuracies, bytes stored. `shown_name`: the name as the page shows it (the caller
    escapes it); default `name`."""
    lines = [f"Fitted **{shown_name or name}** in **{total_s:.2f} s** ({fit.n_items} items, cluster "
             f"{fit.cluster} of K = {fit.k}, objective {fit.objective}).", "", "| stage | seconds |", "|---|---|"]
    waited = total_s - fit.total_s
    if waited > 0.5:  # the model was busy: the rewrites started at Save (or another person's request)
        lines.append(f"| waiting for the model (the rewrites and the pass started at Save) | {waited:.3f} |")
    lines += [f"| {s} | {v:.3f} |" for s, v in fit.stages_s.items()]
    d = fit.diagnostics
    if fit.cold_start:
        lines.append(f"\n**Cold start**: fewer than {studio.served.cfg.min_fit_items} items, so λ = 1 "
                     "(your cluster's shared head). Add more writing and refit.")
    else:  # the answer first, in plain words: does the vector beat the cluster model?
        verdict = fit_verdict(d, fallback=studio.served.cfg.style.fallback, why_kept=kept_reason(studio.served.meta),
                              base_name=base_name(fit.style))
        lines.insert(1, f"\nTeacher-forced, on your held-out words: **{verdict}**\n")
        if d.get("n"):  # the own style's accuracy, then the others the diagnostics measured
            others = (("acc_ones", "λ = 1"), ("acc_other", "other users' λ"), ("acc_no_head", "no head"),
                      ("acc_logprob_rule", "likelihood rule"), ("acc_covariate_only", "γ·Δlogp alone"))
            lines.append(f"\nHeld-out accuracy ({d.get('unit', 'tokens')}, n = {d['n']}): own style "
                         f"**{d.get('acc_own', float('nan')):.3f}**"
                         + "".join(f", {label} {d[key]:.3f}" for key, label in others if key in d)
                         + (f"; your held-out words are {d['specificity_gap']:+.2f} nats a token likelier under "
                            "your style than under other people's (the user-specificity gap)" if "specificity_gap" in d
                            else ""))
    if not fit.cold_start and (note := guard_note(studio)):
        lines.insert(2, note)
    if not fit.cold_start and fit.style is not None:
        lines.append("\n" + form_note(studio, fit))
        lines.append("\n" + studio.first_use_jobs.base_words(name, bool(fit.style.own)))
    lines.append(f"\nStored: {studio.store.vector_bytes(name, studio.served.artifacts_id)} bytes.")
    return "\n".join(lines)


def form_note(studio, fit: UserFit) -> str:
    """In plain words: how near the person is to the build's writers, what their style does about the cluster
    model's form (the words they open with), and what α does."""
    near = studio.histories.closeness(fit.k, fit.distances)
    st = fit.style
    start = opening_key(())
    first = sorted(((float(b), int(t)) for o, t, b in zip(st.form_keys, st.form_ids, st.form_bias) if o == start),
                   reverse=True)[:4]
    words = ", ".join(f"“{md(studio.served.tok.decode([t]).strip() or studio.served.tok.decode([t]))}”"
                      for _, t in first)
    far = near.startswith(("far", "at its edge"))
    own = bool(st.own)
    base = "your own adapter" if own else "your cluster's model"
    lines = [f"**How you write against this build's writers.** Against your cluster ({fit.cluster} of K = {fit.k}), "
             f"you are {near}."]
    if own:
        lines.append("You are a cluster of one: what you get is your own adapter (trained "
                     "on your history from your nearest cluster's), with your style re-ranking its next words "
                     "towards the words you use")
    elif far:
        lines.append("Its model writes the way that population writes (how a line opens, its prefixes and "
                     "words), which is not yours. What you get here: the cluster model, with your style re-ranking "
                     "its next words towards the words you use")
    else:
        lines.append("What you get: your cluster's model, with your style re-ranking its next words towards the "
                     "words you use")
    if words and studio.served.cfg.style.form:
        lines[-1] += f", and your openings lifted at a text's first words (yours: {words})."
    else:
        lines[-1] += "."
    if far and not own:  # a cluster of one is the person's choice here (OwnSettings.far: measured, docs/RESULTS.md)
        lines.append("*Train my own adapter* makes you a cluster of one: an adapter trained on your history (about a "
                     "minute, after any first use already training); Fit's check and Explore then show, on your own "
                     "held-out texts, whether it writes more like you. Over 83 people this far out from a study build "
                     "(docs/RESULTS.md) it scored as card over their cluster did, on average, and repeated a past text "
                     "word for word less often (30 % of outputs against 45 %).")
    w = st.memory_weight(studio.served.cfg.style)
    if st.knn_weight is not None and w:
        lines.append(f"Because you are this far out, your own past texts are mixed in as it writes: where a "
                     f"context like one of yours comes up, the word you wrote next gets a share ({w:g} at α = 1) "
                     "of the choice, so your words come back rather than the population's.")
    if studio.served.cfg.style.retrieval:
        lines.append("Your past texts nearest the prompt are also placed before it, as RAG places them (Compare "
                     "lists which under card's output); the model may repeat one of them.")
    alpha = studio.served.cfg.decoding.alpha
    if alpha == 0:  # the build's guard kept card at the cluster model (guard_note): all of the above waits for α > 0
        lines[1] = lines[1].replace("What you get", "What α above 0 gives you", 1)
        lines.append(f"At this build's α = 0, card writes as {base}.")
    lines.append(f"The **α** slider in *Compare* scales all of your style: 0 is "
                 f"{'your own adapter' if own else 'the cluster model'} exactly, 1 your "
                 "style as fitted, above 1 pushes it harder (and can overshoot into words out of place)"
                 + (f"; it starts at this build's α = {alpha:g}" + (", the strength its validation people were "
                    "decoded best with." if tuned_alpha(studio.served.meta) == alpha else ".")
                    if alpha not in (0, 1) else "."))
    return " ".join(lines)


def tuned_alpha(meta: dict) -> float | None:
    """The α the build's decoding choice (tune) kept on its validation people, if it chose one."""
    chosen = meta.get("report", {}).get("tune", {}).get("alpha", {}).get("chosen")
    return float(chosen) if chosen is not None else None


def guard_note(studio) -> str | None:
    """In plain words, when the build's harm guard (tune.harm_guard) kept `card` at the cluster model: on this
    build's task no setting of the style moved the text above noise for its validation people (people who
    differ in topic more than in form), so Compare's default α is 0 and nothing only looks personal."""
    if line := studio.coming.check_line():  # the first start serves card before its check has decided
        return f"**{md(line[0].upper() + line[1:])}.**"
    guard = studio.served.meta.get("report", {}).get("tune", {}).get("guard")
    if not guard or guard.get("kept", True) or studio.served.cfg.decoding.alpha > 0:
        return None
    return (f"On this build's task (**{studio.served.task.name}**) CARD writes as your cluster's model: on its "
            f"{guard.get('people', 'validation')} validation people no setting of the style moved the text "
            "above noise, so α starts at 0 here. Your style is fitted all the same: Why and Explore show it, "
            "and the α slider in Compare applies it.")
