"""The studio: every operation of the web app on one loaded engine and one store, with no UI code.

app.py only lays out widgets and calls these methods, so the behaviour (what is
stored, what an error says, what a sweep measures) is tested without a browser.
Every decode goes through one scheduler (scheduler.py): the requests of all
sessions that arrive within a few tens of ms decode as one mixed batch. The model
lock is held per batch and by fits and trainings (per step, for the background
first-use work of EXACT and OPPU); store reads and votes do not take it.
"""

from __future__ import annotations

import gc
import json
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from personalize.humaneval.arena import Arena, BlindPair
from personalize.data import TASKS, HistoryError, Item, parse_history, read_history_file, read_lamp
from personalize.card.decoding import DecodingSettings, Generation
from personalize.methods.engine import ArtifactsError, Engine, UserFit
from personalize.humaneval.leaderboard import LeaderboardConfig, leaderboard
from personalize.card.adapters import adapter_name
from personalize.methods.registry import METHODS, get_method
from personalize.methods.base import UserContext, fingerprint
from personalize.metrics import rouge_scores
from personalize.card.cluster import closeness
from personalize.fitting.person import onboard, prepared_items, store_assignments
from personalize.lm.tokens import decode as decode_text
from personalize.fitting.votes import FeedbackSettings, Refinement, Vote, VoteFeatures, refine_pairs, refine_tokens
from personalize.card.head import PAIR_OBJECTIVES
from personalize.serving.scheduler import DecodeScheduler, SchedulerConfig
from personalize.store import Store, StoreError
from personalize.lm.cpu_threads import ReleasingExecutor, release_team, trim_memory
from personalize.card.style import UserStyle
from personalize.humaneval import campaign as campaign_mod
from personalize.studio import own_data as owner
from personalize.catalog import ALL_METHODS, CORE_METHODS, SLOW_FIRST_USE





@dataclass(frozen=True)
class StudioConfig:
    artifacts: str = "data/artifacts/demo"  # the build served first
    # every sub-folder with a build's config.json is offered, one task at a time; None: the parent of `artifacts`
    artifacts_root: str | None = None
    db: str = "data/studio.db"
    demo_data: str = "data/demo"  # LaMP folder whose users the "demo user" picker offers
    export_dir: str = "data/exports"
    max_history_chars: int = 2_000_000  # a paste or upload larger than this is refused, not truncated
    max_items: int = 500
    max_prompt_chars: int = 20_000
    # EXACT's first use scores 42 attributes × 3 steps per history pair (~15-40 s a pair for the 135M model on
    # 2 CPU cores); the app indexes the newest few pairs, ratings add more. `eval` uses the method's default.
    exact_pairs: int = 4
    scheduler: SchedulerConfig = SchedulerConfig()  # the cross-request batching window
    # the app's Save starts EXACT's attribute search and OPPU's training for the person in the background
    first_use_in_background: bool = True
    feedback: FeedbackSettings = FeedbackSettings()  # how much a vote counts against the history when λ is refitted

    def __post_init__(self):
        if min(self.max_history_chars, self.max_items, self.max_prompt_chars, self.exact_pairs) < 1:
            raise ValueError("history, item, prompt and EXACT pair limits must be >= 1")


@dataclass(frozen=True)
class Build:
    """One artifacts folder the studio can serve."""

    folder: str
    id: str
    task: str
    created: str = ""


def find_builds(root: str | Path) -> list[Build]:
    """The builds directly under `root`: folders whose config.json names a known task and an id (a model
    folder's config.json names neither; an unfinished `<name>.partial` is skipped), newest first."""
    root, out = Path(root), []
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.endswith(".partial"):
            continue
        try:
            meta = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("task") in TASKS and isinstance(meta.get("id"), str):
            out.append(Build(str(folder), meta["id"], meta["task"], str(meta.get("created", ""))))
    return sorted(out, key=lambda b: b.created, reverse=True)


def build_command(task: str, root: str | Path) -> str:
    """The command that builds `task`'s artifacts under `root`: the task's LaMP folder where one is on this
    machine (../shared/data/<task> or data/<task>), else a placeholder for it."""
    data = next((str(d) for d in (Path("../shared/data") / task, Path("data") / task)
                 if (d / "dev_questions.json").exists()), f"<a LaMP folder of {task}>")
    return f".venv/bin/python -m personalize build --data {data} --split dev --out {Path(root) / task}"


def fit_verdict(diagnostics: dict | None, cold_start: bool = False, fallback: bool = True, n_votes: int = 0) -> str:
    """In plain words: does the user's vector beat their cluster's model on their held-out items?
    Reads `helps` (own vector vs no head, set by the fit) with `acc_own` and `acc_no_head`; `fallback`: whether
    this build's CARD then shows the cluster model's output (StyleSettings.fallback, chosen by tune)."""
    d = diagnostics or {}
    if cold_start:
        return "Your history is too short to fit your own vector yet, so CARD uses your cluster's shared head."
    helps, own, base = d.get("helps"), d.get("acc_own"), d.get("acc_no_head")
    if helps is None or own is None or base is None:
        return ("Too few items to tell whether your vector helps (too few held out to compare it with your "
                "cluster's model); add more writing and refit.")
    a, b = _percents(float(own), float(base))
    if helps:
        return f"Your vector helps: it predicts {a} of your held-out words vs {b} for your cluster's model."
    if n_votes:
        return (f"Your style does not beat your cluster's model on your held-out writing ({a} vs {b}), but your "
                f"{n_votes} vote{'s' * (n_votes != 1)} ask for it, so CARD decodes with your style.")
    if fallback:
        return (f"Your vector does not beat your cluster's model on your held-out items ({a} vs {b}), so CARD will "
                "show the cluster model's output for you.")
    return (f"Your vector does not beat your cluster's model on your held-out items ({a} vs {b}); this build still "
            "decodes CARD with it (on its validation people, falling back to the cluster model lowered ROUGE-L).")


def _percents(a: float, b: float) -> tuple[str, str]:
    """Two rates as percentages with the fewest decimals (0-2) that keep different values apart."""
    for digits in (0, 1, 2):
        fa, fb = f"{a:.{digits}%}", f"{b:.{digits}%}"
        if fa != fb or a == b:
            break
    return fa, fb


@dataclass
class UserState:
    """Where a user stands under the loaded artifacts: cluster at K, and λ if fitted (else λ = 1)."""

    name: str
    k: int
    cluster: int
    distances: list[float]
    lam: "UserStyle | None"  # the fitted style (λ, token bias, kNN memory); None: not fitted, λ = 1
    fit_stats: dict = field(default_factory=dict)

    @property
    def fitted(self) -> bool:
        return self.lam is not None


@dataclass
class MethodOutput:
    method: str
    text: str = ""
    latency_s: float = 0.0
    n_tokens: int = 0
    gen_id: int | None = None
    info: dict = field(default_factory=dict)  # what the method chose (EXACT's attributes, RAG's items)
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.latency_s if self.latency_s > 0 else 0.0


def _jsonable(trace) -> dict:
    """A method's trace, kept in the store only when it is plain JSON (CARD's tensors are not)."""
    if not trace:
        return {}
    try:
        json.dumps(trace)
    except TypeError:
        return {}
    return {"trace": trace}


class Studio:
    def __init__(self, engine: Engine, store: Store, cfg: StudioConfig = StudioConfig(),
                 demo_users: dict[str, list[Item]] | None = None, population: dict[str, list[str]] | None = None):
        self.engine, self.store, self.cfg = engine, store, cfg
        self.arena = Arena(store)
        self.campaigns = campaign_mod.Campaigns(store)
        self._judges: dict[str | None, object] = {}  # LLM judges by model id, loaded on first use
        self.demo_users = demo_users or {}
        self.population = population or {}
        self.model_lock = threading.RLock()
        self.scheduler = DecodeScheduler(engine, self.model_lock, cfg.scheduler)
        self._methods: dict[str, object] = {}
        # first-use work (EXACT's attribute search, OPPU's training): one at a time, beside the decodes
        self._first_use = ReleasingExecutor(max_workers=1, thread_name_prefix="studio-first-use")
        self.jobs: dict[tuple[str, str], dict] = {}  # (user, method) -> {"state", "done", "total", "error", ...}
        # one background worker for model work nobody waits on: EXACT feedback, the rewrites of a saved history
        self._feedback = ReleasingExecutor(max_workers=1, thread_name_prefix="studio-background")
        self._rewrites = None
        self.feedback_log: list[dict] = []
        # the person's one teacher-forced pass, kept from the fit so a vote costs a pass over its own text only
        self._history: dict[tuple, tuple] = {}
        self._vote_features: VoteFeatures | None = None
        release_team()  # the thread that loaded the engine and made the studio (the main one) keeps no team

    @classmethod
    def load(cls, cfg: StudioConfig = StudioConfig(), engine: Engine | None = None,
             adapters_later: bool = False) -> "Studio":
        """adapters_later: the app's start, which answers first and then calls load_pending."""
        engine = engine or Engine.load(cfg.artifacts, adapters_later=adapters_later)
        store = Store(cfg.db)
        population = _population_texts(engine)
        demo = Path(cfg.demo_data)
        demo_users = _lamp_users(demo) if (demo / "dev_questions.json").exists() else {}
        return cls(engine, store, cfg, demo_users, population)

    def load_pending(self) -> None:
        """What the start left for after the page answers: the other cluster adapters (~1 s). A request
        that needs them first loads them itself (Engine.use_adapter, decode_rows)."""
        with self.model_lock:
            self.engine.load_pending_adapters()

    # ------------------------------------------------------------ builds: one task's artifacts at a time
    @property
    def artifacts_root(self) -> Path:
        return Path(self.cfg.artifacts_root or Path(self.cfg.artifacts).parent)

    @property
    def build(self) -> Build:
        """The build being served."""
        folder = self.engine.folder or Path(self.cfg.artifacts)
        return Build(str(folder), self.engine.artifacts_id, self.task.name, str(self.engine.meta.get("created", "")))

    def header(self) -> str:
        """What the app's title line says about the build being served."""
        return (f"# Personalization studio\nCARD (cluster LoRA + user vector) next to the base model, EXACT, RAG, PAG, "
                f"COPE, OPPU and Profile-to-PEFT. Artifacts `{self.engine.artifacts_id}` (task {self.task.name}, "
                f"model {self.engine.lm.model_id}, K ∈ {self.ks}); choose another task in *My writing* to switch.")

    def builds(self) -> dict[str, list[Build]]:
        """Every known task -> its builds under the artifacts root (the one served first, then newest first);
        [] for a task with no build."""
        current = self.build
        found = [b for b in find_builds(self.artifacts_root) if Path(b.folder).resolve() != Path(current.folder).resolve()]
        return {t: ([current] if t == current.task else []) + [b for b in found if b.task == t] for t in TASKS}

    def build_hint(self, task: str) -> str:
        return (f"No build for **{task}** under `{self.artifacts_root}` yet, so the studio stays on "
                f"`{self.engine.artifacts_id}` ({self.task.name}). Build one (minutes to hours on a CPU, "
                f"see the README for the flags), then choose the task again:\n\n"
                f"```\n{build_command(task, self.artifacts_root)}\n```")

    def switch_task(self, task: str) -> dict:
        """Serves `task`'s build (loading it in place of the current one), or says how to build it.
        Returns {"switched": bool, "build": Build | None (the build now serving the task), "message": str}."""
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
        if task == self.task.name:
            return {"switched": False, "build": self.build,
                    "message": f"Serving `{self.engine.artifacts_id}` ({task})."}
        candidates = self.builds()[task]
        if not candidates:
            return {"switched": False, "build": None, "message": self.build_hint(task)}
        b = candidates[0]
        t0 = time.perf_counter()
        self.use_build(b.folder)
        return {"switched": True, "build": self.build,
                "message": f"Switched to `{self.engine.artifacts_id}` ({task}, K ∈ {self.ks}) in "
                           f"{time.perf_counter() - t0:.1f} s. Save your history again to place it in this build."}

    def use_build(self, folder: str | Path) -> None:
        """Loads the build in `folder` and serves it from now on, for every session of the app.
        Only one build stays loaded: each Engine holds its own copy of the language model and all its cluster
        adapters (~0.6 GB for the bundled 135M model in float32, many GB for larger ones) while reloading a
        build from local files takes seconds, and the app decodes one request at a time anyway. The new build
        is loaded before the old one is let go, so a build that fails to load leaves the current one serving."""
        with self.model_lock:
            try:
                engine = Engine.load(folder)
            except (KeyError, TypeError) as e:  # a config.json from another version of this code
                raise ArtifactsError(f"the build at {folder} cannot be read ({e!r}): rebuild it") from None
            old, self.engine = self.engine, engine
            self.scheduler.engine = engine  # the next batch decodes with the new build
            self._methods = {}  # methods hold the engine they were made with
            self.jobs = {}
            self.population = _population_texts(engine)
            data, split = engine.meta.get("data"), engine.meta.get("split", "dev")
            # the demo users on offer are the build's own population, when its data is on this machine
            ok = data and (Path(data) / f"{split}_questions.json").exists()
            self.demo_users = _lamp_users(Path(data), split) if ok else {}
            del old
            gc.collect()

    # ------------------------------------------------------------ facts about the loaded artifacts
    @property
    def ks(self) -> list[int]:
        return sorted(self.engine.clusters.centroids)

    @property
    def task(self):
        return self.engine.task

    def snap_k(self, k: float | int | None, previous: int | None = None) -> int:
        """The built K nearest to a slider value (ties: the smaller). Given the K the slider came from, a value
        between built Ks moves on to the next built K in that direction, so that one arrow-key step (2 -> 3)
        reaches the next build (4) instead of snapping back (to 2)."""
        if k is None:
            return self.engine.cfg.default_k
        k = float(k)
        if previous is not None and k not in self.ks:
            if k > previous and any(b > previous for b in self.ks):
                return min((b for b in self.ks if b >= k), default=max(self.ks))
            if k < previous and any(b < previous for b in self.ks):
                return max((b for b in self.ks if b <= k), default=min(self.ks))
        return min(self.ks, key=lambda b: (abs(b - k), b))

    # ------------------------------------------------------------ My writing
    def parse(self, text: str | None = None, file: str | None = None) -> list[Item]:
        """Items from a paste or an uploaded file; HistoryError says what is wrong with either."""
        if file:
            return read_history_file(file, task=self.task, max_bytes=self.cfg.max_history_chars)
        if not text or not text.strip():
            raise HistoryError("the history is empty: paste some texts you wrote (one per line), or upload a file")
        return parse_history(text, max_items=self.cfg.max_items, max_chars=self.cfg.max_history_chars)

    def save_history(self, name: str, items: Sequence[Item], task: str, replace_existing: bool = True) -> dict:
        """Stores the history under `name` (replacing theirs: vector and clusters go with it) and assigns
        clusters at once (embedding only: seconds); the fit is a separate, explicit step. "duplicates" counts
        the exact repeats that parsing dropped (`parse` returns a data.History that knows it)."""
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
        self.store.add_user(name, items, task, replace=replace_existing)
        name = self.store.user(name)["name"]
        embedding = self.embed_history(name)
        clusters = self.assign_all(name, embedding)
        self._rewrites = self._feedback.submit(self._prepare, name)  # Fit then waits only for what is left
        k = self.engine.cfg.default_k
        a = self.store.assignment(name, self.engine.artifacts_id, k)
        return {"name": name, "n_items": len(items), "clusters": clusters,
                "duplicates": int(getattr(items, "duplicates", 0)), "task": task,
                "closeness": self.closeness(k, a["distances"]) if a else "", "embedding": embedding}

    def save_message(self, res: dict) -> str:
        """The My writing status line after a save."""
        k = self.engine.cfg.default_k
        n, dup = res["n_items"], res.get("duplicates", 0)
        dropped = f" ({dup} duplicate item{'' if dup == 1 else 's'} dropped)" if dup else ""
        task = res.get("task", self.task.name)
        note = "" if task == self.task.name else (
            f" No build for **{task}** is loaded: these artifacts were built for **{self.task.name}**, so prompts "
            "use that task's template.")
        near = f", {res['closeness']}" if res.get("closeness") else ""
        nearer = f"\n\n{res['nearer']}" if res.get("nearer") else ""
        return (f"Saved **{n}** item{'' if n == 1 else 's'} for **{res['name']}**{dropped}; cluster at K = {k}: "
                f"**{res['clusters'][k]}**{near}. Next: *Fit my style*.{note}{nearer}")

    def item_rows(self, name: str | None) -> list[list]:
        """The stored items table: [number, text, neutral rewrite]; the number is the item's place in the person's
        own history (1, 2, …; kept when others are deleted), the one Update, Delete and Compare's picker take."""
        try:
            return [[s.position + 1, s.y, s.neutral or ""] for s in self.store.items(name)] if name else []
        except StoreError:  # not stored (yet), or not a valid name
            return []

    def _own_item(self, name: str | None, number: float | None):
        """The person's item with this number (item_rows), or None: another person's items are never reached."""
        if number is None or not name or not name.strip():
            return None
        return next((s for s in self.store.items(name.strip()) if s.position + 1 == int(number)), None)

    def switch_user(self, name: str | None, shown_for: str | None) -> dict:
        """My writing when the user name is edited. `shown_for` is the user whose saved (or opened) history the
        text box still holds (None: the box holds a fresh paste, or nothing). Another name empties the box, so a
        new user starts from an empty history, never from the previous user's text; a fresh paste is kept (it
        is the new user's). Returns {"clear": bool, "shown_for": str | None, "rows": table rows, "message"}."""
        name = (name or "").strip()
        clear = shown_for is not None and name != shown_for
        rows = self.item_rows(name) if name else []
        if not name:
            msg = ""
        elif rows:
            msg = f"**{name}** has {len(rows)} stored items (table below); paste new writing to replace them."
        else:
            msg = f"New user **{name}**: paste your writing (or upload a file) and save it."
        return {"clear": clear, "shown_for": None if clear else shown_for, "rows": rows, "message": msg}

    def demo_history(self, user: str) -> str:
        """The demo person's texts as a paste: one a line, or blocks separated by a blank line when a text has
        several lines (a changelog entry), which is how parse_history reads them back."""
        if user not in self.demo_users:
            raise ValueError(f"unknown demo user {user!r}")
        texts = [it.y for it in self.demo_users[user]]
        return ("\n\n" if any("\n" in t for t in texts) else "\n").join(texts)

    def demo_choices(self) -> list[tuple[str, str]]:
        """The demo picker: people the build never saw first, marked "new" (they are how a newcomer is placed),
        then those outside its training who chose its decoding settings, then the build's own population."""
        built = set(self.engine.meta.get("users", []))
        chose = set(self.engine.meta.get("report", {}).get("validation_people", [])) - built
        new = sorted(u for u in self.demo_users if u not in built and u not in chose)
        return ([(f"{u} · new, not in the build", u) for u in new]
                + [(f"{u} · not trained on (chose the build's settings)", u) for u in sorted(chose & set(self.demo_users))]
                + [(u, u) for u in sorted(set(self.demo_users) & built)])

    def demo_items(self, user: str) -> list[Item]:
        if user not in self.demo_users:
            raise ValueError(f"unknown demo user {user!r}")
        return list(self.demo_users[user])

    def embed_history(self, name: str) -> np.ndarray:
        """The person's mean text embedding (their place among the clusters of every build with this encoder)."""
        return self.engine.embed([Item(y=s.y) for s in self.store.items(name)])

    def assign_all(self, name: str, embedding: np.ndarray | None = None) -> dict[int, int]:
        emb = self.embed_history(name) if embedding is None else embedding
        return store_assignments(self.engine, self.store, name, emb)

    # ------------------------------------------------------------ My cluster
    def user_state(self, name: str, k: int | None = None) -> UserState:
        k = self.snap_k(k)
        a = self.store.assignment(name, self.engine.artifacts_id, k)
        if a is None:  # stored before these artifacts were loaded
            self.assign_all(name)
            a = self.store.assignment(name, self.engine.artifacts_id, k)
        got = self.store.vector(name, self.engine.artifacts_id)
        stats = got[1]["stats"] if got else {}
        style = UserStyle.from_stored(self.store.style(name, self.engine.artifacts_id)) if got else None  # λ + token bias + memory
        return UserState(self.store.user(name)["name"], k, a["cluster"], a["distances"], style, stats)

    @staticmethod
    def distance_table(state: UserState) -> str:
        """The distance to every centroid as a Markdown table, the user's own cluster marked in a column."""
        rows = [f"| {c} | {d:.4f} | {'◀ you' if c == state.cluster else ''} |" for c, d in enumerate(state.distances)]
        return "\n".join(["| cluster | distance | yours |", "|---|---|---|", *rows])

    def closeness(self, k: int, distances: Sequence[float]) -> str:
        """The nearest cluster's distance in plain words (cluster.closeness), against the build's own people."""
        c = self.engine.clusters
        words, _ = closeness(c.embeddings, c.centroids[k], c.labels[k], min(distances))
        return words

    def cluster_summary(self, state: UserState) -> str:
        return (f"**{state.name}** is in cluster **{state.cluster}** of K = {state.k}, "
                f"{self.closeness(state.k, state.distances)}.\n\n{self.distance_table(state)}")

    def cluster_examples(self, k: int, cluster: int, n: int = 4) -> list[tuple[str, str]]:
        """(population user, one of their texts) for up to n users of the cluster."""
        users, labels = self.engine.clusters.users, self.engine.clusters.labels[k]
        out = []
        for u, c in zip(users, labels):
            if int(c) == cluster and self.population.get(u):
                out.append((u, self.population[u][0]))
            if len(out) >= n:
                break
        return out

    def population_map(self, name: str | None, k: int) -> dict:
        """2-D PCA of the population's user embeddings (and the user's), with cluster labels at K."""
        from sklearn.decomposition import PCA

        emb = self.engine.clusters.embeddings
        pca = PCA(n_components=min(2, *emb.shape)).fit(emb)
        xy = pca.transform(emb)
        out = {"users": list(self.engine.clusters.users), "xy": xy.tolist(),
               "labels": [int(c) for c in self.engine.clusters.labels[k]],
               "centroids": pca.transform(self.engine.clusters.centroids[k]).tolist(), "k": k}
        if name:
            mine = self.embed_history(name)
            out["user"] = {"name": name, "xy": pca.transform(mine[None])[0].tolist()}
        return out

    # ------------------------------------------------------------ Fit my style
    def _prepare(self, name: str) -> None:
        """The neutral rewrites of a saved history (§1.8), in the background: the slow part of a first fit."""
        try:
            with self.model_lock:
                prepared_items(self.engine, self.store, name)
        except (ValueError, StoreError):
            pass  # the user was deleted or replaced meanwhile; Fit redoes what is missing and reports errors

    def fit(self, name: str, k: int | None = None, progress: Callable[[str], None] | None = None) -> UserFit:
        """Onboards the user (§1.6); the stored vector is replaced only if the whole fit succeeds."""
        if self._rewrites is not None and not self._rewrites.done() and progress:
            progress("neutral rewrites (started when the history was saved)")
        with self.model_lock:
            fit = onboard(self.engine, self.store, name, k=self.snap_k(k), progress=progress)
            if fit.features is not None:
                self._remember_history(name, fit.k, fit.cluster, fit.features, fit.n_hold)
            if not fit.cold_start and self.store.feedback(name):  # the votes already cast count from the first fit
                if progress:
                    progress("your votes")
                self.refine(name)
            return fit

    # ------------------------------------------------------------ Compare
    def method(self, name: str):
        if name not in self._methods:
            cfg = {"max_pairs": self.cfg.exact_pairs} if name == "exact" else {}
            if name == "oppu":  # user adapters live beside the database they belong to
                cfg = {"folder": str(Path(self.cfg.db).parent / "oppu" / str(self.engine.artifacts_id))}
            self._methods[name] = m = get_method(name, self.engine, self.store, **cfg)
            if hasattr(m, "lock"):  # background first-use work takes the model lock per step, not for minutes
                m.lock = self.model_lock
        return self._methods[name]

    def needs_indexing(self, name: str, method: str) -> bool:
        """True when a method's first use for this user will do minutes of per-user work (SLOW_FIRST_USE:
        EXACT's attribute search, OPPU's adapter training), which runs as a background job."""
        if method not in SLOW_FIRST_USE:
            return False
        try:
            return not self.method(method).is_prepared(UserContext.from_store(self.store, name, self.task))
        except (ValueError, StoreError):  # no rewrites yet, or no such user: the first use will tell
            return True

    def start_first_use(self, name: str, method: str) -> dict:
        """The method's per-user work (EXACT's attribute search, OPPU's training) as a background job, started
        once per user and history; the job dict shows its progress ("done" of "total") while it runs."""
        key = (name, method)
        job = self.jobs.get(key)
        if job is not None and job["state"] in ("queued", "running"):
            return job
        job = self.jobs[key] = {"user": name, "method": method, "state": "queued", "done": 0, "total": 0,
                                "error": None, "started": time.time()}

        def progress(done: int, total: int) -> None:
            job["done"], job["total"] = done, total

        def work() -> None:
            job["state"] = "running"
            try:
                with self.model_lock:  # the rewrites: a few short decodes, once per history
                    prepared_items(self.engine, self.store, name)
                user = UserContext.from_store(self.store, name, self.task)
                m = self.method(method)
                if not m.is_prepared(user):
                    m.prepare(user, progress=progress)
                job["state"] = "done"
            except Exception as e:  # a deleted user or a failed pass: the column says so when it runs
                job["state"], job["error"] = "error", str(e)
            finally:
                trim_memory()  # the training's freed activations back to the system, not kept by the heap
            job["seconds"] = round(time.time() - job["started"], 1)

        self._first_use.submit(work)
        return job

    def after_fit(self, name: str) -> None:
        """The app's Fit: the methods' first use starts in the background as after a save."""
        if self.cfg.first_use_in_background:
            self.prepare_first_use(name)

    def prepare_first_use(self, name: str) -> list[dict]:
        """Background first use of every method that needs per-user work (after a save or a fit)."""
        return [self.start_first_use(name, m) for m in SLOW_FIRST_USE if self.needs_indexing(name, m)]

    def check_prompt(self, prompt: str | None) -> str:
        if not prompt or not prompt.strip():
            raise ValueError("the prompt is empty: type a prompt or pick a history item")
        if len(prompt) > self.cfg.max_prompt_chars:
            raise ValueError(f"the prompt has {len(prompt):,} characters; the limit is {self.cfg.max_prompt_chars:,}")
        return prompt.strip()

    def settings(self, alpha: float | None = None, top_k: int | None = None,
                 max_new_tokens: int | None = None) -> DecodingSettings:
        s = self.engine.cfg.decoding
        changes = {k: v for k, v in {"alpha": alpha, "top_k": None if top_k is None else int(top_k),
                                     "max_new_tokens": None if max_new_tokens is None else int(max_new_tokens)}.items()
                   if v is not None}
        return replace(s, **changes)

    def _rows(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
              trace: bool = False) -> list:
        """The method's rows for one prompt (batch.DecodeRow); built in the scheduler's worker."""
        if method in CORE_METHODS:
            return self.engine.rows([prompt], method, state.cluster, state.lam, k=state.k, settings=s, trace=trace,
                                    items=self._card_items(method, state))
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {ALL_METHODS}")
        prepared_items(self.engine, self.store, state.name)  # fills missing neutral rewrites, once
        user = UserContext.from_store(self.store, state.name, self.task, state.cluster, state.k, state.lam)
        m = self.method(method)
        if not m.is_prepared(user):  # normally done by the background job; here the caller waits for it
            m.prepare(user)
        return m.rows(user, [prompt], s, trace=trace)

    def _decode(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
                on_step: Callable[[int, int], None] | None = None, trace: bool = False) -> Generation:
        if self.needs_indexing(state.name, method):
            self.wait_first_use(state.name, method)  # in this thread: the scheduler's worker stays free
        return self.scheduler.run(lambda: self._rows(method, state, prompt, s, trace), on_step)[0]

    def wait_first_use(self, name: str, method: str, poll_s: float = 0.2) -> dict:
        """Starts (or joins) the method's first-use job for the person and waits for it."""
        job = self.start_first_use(name, method)
        while job["state"] in ("queued", "running"):
            time.sleep(poll_s)
        return job

    def _card_items(self, method: str, state: UserState):
        """The person's history for a CARD whose style retrieves their nearest items into the prompt."""
        if method != "card" or not self.engine.cfg.style.retrieval:
            return None
        prepared_items(self.engine, self.store, state.name)  # fills missing neutral rewrites, once
        return UserContext.from_store(self.store, state.name, self.task).items

    def run_method(self, method: str, state: UserState, prompt: str, s: DecodingSettings,
                   on_step: Callable[[int, int], None] | None = None) -> MethodOutput:
        """One method's output, stored as a generation; a method that cannot run says why instead."""
        try:
            g = self._decode(method, state, prompt, s, on_step)
        except (ValueError, StoreError, FileNotFoundError, RuntimeError) as e:
            return MethodOutput(method, error=str(e))
        return self._stored(method, state, prompt, s, g)

    def _stored(self, method: str, state: UserState, prompt: str, s: DecodingSettings, g: Generation) -> MethodOutput:
        info = _jsonable(g.trace)
        note = getattr(g, "note", None)  # why the method did what it did (CARD falling back to the cluster model)
        if note:
            info["note"] = str(note)
        settings = {"alpha": s.alpha, "top_k": s.top_k, "max_new_tokens": s.max_new_tokens, "k": state.k,
                    "cluster": state.cluster, "fitted": state.fitted}
        gid = self.store.add_generation(state.name, self.engine.artifacts_id, method, prompt, g.text, settings,
                                        g.latency_s, g.n_tokens, info)
        return MethodOutput(method, g.text, g.latency_s, g.n_tokens, gid, info)

    def compare(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                k: int | None = None) -> Iterator[MethodOutput]:
        """Each chosen method's output as soon as it is ready."""
        for kind, _, value in self.compare_stream(name, prompt, methods, s, k):
            if kind == "done":
                yield value

    def compare_stream(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                       k: int | None = None, poll_s: float = 0.5) -> Iterator[tuple[str, str, object]]:
        """(kind, method, value) events while a Compare runs: ("text", m, the text so far) as tokens are decoded,
        ("progress", m, a line) while a method's first use prepares in the background, ("done", m,
        MethodOutput). Every ready method joins one request to the scheduler (one mixed batch, shared with
        other sessions' requests); a method whose first use needs work waits for its background job, and the
        other columns do not wait for it."""
        prompt = self.check_prompt(prompt)
        unknown = [m for m in methods if m not in ALL_METHODS]
        if unknown or not methods:
            raise ValueError(f"choose methods among {', '.join(ALL_METHODS)}" + (f" (unknown: {unknown})" if unknown else ""))
        state = self.user_state(name, k)
        events: queue.Queue = queue.Queue()
        tok, eos = self.engine.tok, self.engine.tok.eos_token_id
        tokens: dict[str, list[int]] = {m: [] for m in methods}
        pressed = time.perf_counter()
        last_token: dict[str, float] = {}  # a column's latency is its own: from the press to its last token

        def start(m: str) -> None:
            def on_step(_row: int, t: int, m=m) -> None:
                got = tokens[m]
                if got and got[-1] == eos or len(got) >= s.max_new_tokens:
                    return
                got.append(t)
                last_token[m] = time.perf_counter()
                events.put(("token", m, None))

            fut = self.scheduler.submit(lambda m=m: self._rows(m, state, prompt, s), on_step)
            fut.add_done_callback(lambda f, m=m: events.put(("finished", m, f)))

        waiting = {}
        for m in methods:
            if self.needs_indexing(state.name, m):
                waiting[m] = self.start_first_use(state.name, m)
            else:
                start(m)
        left = set(methods)
        while left:
            try:
                kind, m, value = events.get(timeout=poll_s)
            except queue.Empty:
                kind = None
            if kind == "token" and m in left:
                yield "text", m, decode_text(tok, tokens[m])
            elif kind == "finished":
                left.discard(m)
                try:
                    g = value.result()[0]
                    g = replace(g, latency_s=last_token.get(m, time.perf_counter()) - pressed)
                    out = self._stored(m, state, prompt, s, g)
                except (ValueError, StoreError, FileNotFoundError, RuntimeError) as e:
                    out = MethodOutput(m, error=str(e))
                yield "done", m, out
            for m, job in list(waiting.items()):
                if job["state"] in ("done", "error"):
                    del waiting[m]
                    start(m)  # an error shows when the method runs (it retries the first use in the decode)
                elif kind is None or kind == "finished":
                    yield "progress", m, job_line(job)

    # ------------------------------------------------------------ Why
    def why(self, name: str, prompt: str, s: DecodingSettings, k: int | None = None) -> dict:
        """CARD's decoding step by step: the token chosen, the cluster model's choice, and for the chosen token and
        its top rivals the log-probability among the step's candidates before (the cluster model), the
        correction and after (CARD), on one scale."""
        prompt = self.check_prompt(prompt)
        state = self.user_state(name, k)
        g = self._decode("card", state, prompt, s, trace=True)
        tok, steps = self.engine.tok, []
        for st in (g.trace or [])[: g.n_tokens]:
            used = st["cand"][0] >= 0  # the top-k candidates and the memory's extra tokens
            cand, before, after = st["cand"][0][used], st["before"][0][used], st["after"][0][used]
            order = after.argsort(descending=True)
            chosen = int(st["chosen"][0]) if st.get("chosen") is not None else int(cand[order[0]])
            cluster_choice = int(cand[before.argmax()])
            shown = order[:10].tolist()  # the chosen token and the cluster model's are always among those shown
            shown += [j for j in range(len(cand)) if int(cand[j]) in (chosen, cluster_choice) and j not in shown]
            steps.append({"token": tok.decode([chosen]), "token_id": chosen, "changed": chosen != cluster_choice,
                          "cluster_token": tok.decode([cluster_choice]),
                          "candidates": [{"token": tok.decode([int(cand[j])]), "chosen": int(cand[j]) == chosen,
                                          "before": float(before[j]), "correction": float(after[j] - before[j]),
                                          "after": float(after[j])} for j in shown]})
        return {"text": g.text, "steps": steps, "pieces": text_pieces(tok, steps), "alpha": s.alpha,
                "fitted": state.fitted, "cluster": state.cluster, "k": state.k}

    # ------------------------------------------------------------ Rate
    def new_pair(self, name: str, prompt: str, methods: Sequence[str], s: DecodingSettings,
                 k: int | None = None) -> BlindPair:
        """Two methods at random, each output generated now (or reused when this prompt and these settings
        were already generated for the user), shown in random order."""
        prompt = self.check_prompt(prompt)
        state = self.user_state(name, k)
        a, b = self.arena.draw(methods)
        outs = [self._reuse(state, m, prompt, s) or self.run_method(m, state, prompt, s) for m in (a, b)]
        failed = [o for o in outs if o.error]
        if failed:
            raise ValueError(f"{failed[0].method} could not run: {failed[0].error}")
        settings = {"alpha": s.alpha, "top_k": s.top_k, "max_new_tokens": s.max_new_tokens, "k": state.k,
                    "cluster": state.cluster, "fitted": state.fitted, "artifacts": self.engine.artifacts_id}
        return self.arena.open(state.name, prompt, (a, b), (outs[0].text, outs[1].text),
                               (outs[0].gen_id, outs[1].gen_id), settings)

    def _reuse(self, state: UserState, method: str, prompt: str, s: DecodingSettings) -> MethodOutput | None:
        want = {"alpha": s.alpha, "top_k": s.top_k, "max_new_tokens": s.max_new_tokens, "k": state.k,
                "cluster": state.cluster, "fitted": state.fitted}
        for g in self.store.generations(user=state.name, method=method, limit=50):
            if g["prompt"] == prompt and g["settings"] == want and g["artifacts"] == self.engine.artifacts_id:
                return MethodOutput(method, g["output"], g["latency_s"], g["n_tokens"], g["id"], g["extra"])
        return None

    def vote(self, pair_id: str | None, winner: str, rater: str) -> tuple[BlindPair, int]:
        """Stores the vote; a decided vote also becomes an EXACT preference pair, in the background."""
        pair, rid = self.arena.vote(pair_id, winner, rater)
        if winner in ("a", "b") and pair.user and pair.outputs[0].strip() != pair.outputs[1].strip():
            win, lose = pair.outputs if winner == "a" else pair.outputs[::-1]
            try:
                self.store.add_feedback(pair.user, "rate", pair.prompt, win, lose, rating=rid)
            except StoreError:
                pass  # the user was forgotten meanwhile: the vote counts for the leaderboard only
            else:
                self._feedback.submit(self._refine_quietly, pair.user)
            self._feedback.submit(self._exact_feedback, pair.user, pair.prompt, win, lose)
        return pair, rid

    def _refine_quietly(self, name: str) -> None:
        try:
            self.refine(name)
        except (ValueError, StoreError) as e:  # not fitted yet, or deleted: the vote is kept for the next fit
            self.feedback_log.append({"user": name, "refine": str(e)})

    def _exact_feedback(self, name: str, prompt: str, preferred: str, other: str) -> None:
        try:
            with self.model_lock:
                prepared_items(self.engine, self.store, name)
                user = UserContext.from_store(self.store, name, self.task)
                entry = self.method("exact").add_feedback(user, prompt, preferred, other)
            self.feedback_log.append({"user": name, "prompt": prompt, "attributes": entry["attributes"]})
        except Exception as e:  # a deleted user or a failed scoring pass must not break voting
            self.feedback_log.append({"user": name, "prompt": prompt, "error": str(e)})

    def wait_feedback(self) -> None:
        """Blocks until queued EXACT updates are done (tests, shutdown)."""
        self._feedback.submit(lambda: None).result()

    def leaderboard(self, cfg: LeaderboardConfig = LeaderboardConfig()) -> dict:
        return leaderboard(self.store.ratings(), cfg)

    # ------------------------------------------------------------ human-eval campaigns (personalize.campaign)
    def create_campaign(self, name: str, data: str | Path, split: str = "dev", limit: int = 10,
                        methods: Sequence[str] = ("base", "cluster", "card"), reference: bool = False,
                        mode: str = "pairwise", raters_per_item: int = 3, attention_every: int = 0,
                        alpha: float | None = None, top_k: int | None = None,
                        max_new_tokens: int | None = None, sources: Sequence[str] | str = (),
                        min_raters_per_unit: int | None = None) -> dict:
        """A campaign over the first `limit` queries of a LaMP split, for this build (campaign.create_from_lamp);
        `sources` (a list, or comma-separated) keeps people from those sources only."""
        if isinstance(sources, str):
            sources = [x.strip() for x in sources.split(",") if x.strip()]
        return campaign_mod.create_from_lamp(
            self.store, name, data, split, limit, self.cfg.artifacts, self.engine.artifacts_id, self.task.name,
            sources=tuple(sources), methods=tuple(methods),
            reference=bool(reference), mode=mode, raters_per_item=int(raters_per_item),
            attention_every=int(attention_every), alpha=alpha, top_k=top_k, max_new_tokens=max_new_tokens,
            min_raters_per_unit=min_raters_per_unit)

    def generate_campaign(self, name: str, progress: Callable[[int, int, str], None] | None = None) -> dict:
        return campaign_mod.generate(self, name, progress)

    def next_judgment(self, name: str, rater: str) -> "campaign_mod.Assignment | None":
        return self.campaigns.next(name, rater)

    def submit_judgment(self, assignment: int, rater: str, verdict: str | None = None,
                        scores: dict | None = None) -> int:
        return self.campaigns.submit(assignment, rater, verdict, scores)

    def skip_judgment(self, assignment: int, rater: str) -> None:
        self.campaigns.skip(assignment, rater)

    def set_campaign_status(self, name: str, status: str) -> None:
        self.campaigns.set_status(name, status)

    def export_campaign(self, name: str, fmt: str = "jsonl") -> tuple[Path, Path, int]:
        """The campaign's judgments (JSONL or CSV) and summary JSON in the export folder."""
        if fmt not in ("jsonl", "csv"):
            raise ValueError("export format is jsonl or csv")
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name.strip()) or "campaign"
        return self.campaigns.export(name, Path(self.cfg.export_dir) / f"campaign-{safe}.{fmt}")

    def campaign_results(self, name: str) -> dict:
        return self.campaigns.results(name)

    def judge_campaign(self, name: str, model: str | None = None,
                       progress: Callable[[int, int, str], None] | None = None) -> dict:
        """The LLM judge (campaign.run_judge) on every unit; the judge model is loaded once and kept."""
        from personalize.humaneval.judge import Judge, JudgeConfig

        if model not in self._judges:
            self._judges[model] = Judge(JudgeConfig(model=model))
        campaign_mod.run_judge(self.campaigns, name, self._judges[model], progress, self.model_lock)
        return self.campaigns.results(name)

    # ------------------------------------------------------------ votes refine the style
    def _history_key(self, name: str, k: int, cluster: int, objective: str) -> tuple:
        stored = self.store.items(name)
        return (self.engine.artifacts_id, name, k, cluster, objective, fingerprint([f"{s.x}\n{s.y}" for s in stored]))

    def _remember_history(self, name: str, k: int, cluster: int, feats, n_hold: int) -> None:
        self._history[self._history_key(name, k, cluster, "tokens")] = (feats, n_hold)
        while len(self._history) > 32:
            self._history.pop(next(iter(self._history)))

    def _history_data(self, name: str, k: int, cluster: int, objective: str):
        """(history data of the head, n items, n held out): kept from the fit, else one pass (after a restart)."""
        items = prepared_items(self.engine, self.store, name)
        key = self._history_key(name, k, cluster, objective)
        if key not in self._history:
            self.engine.use_adapter(adapter_name(k, cluster))
            data = self.engine.features(items) if objective == "tokens" else self.engine.user_data(items, objective)
            self._history[key] = (data, self.engine.n_held_out(len(items)))
        data, n_hold = self._history[key]
        return data, len(items), n_hold

    def refine(self, name: str) -> dict:
        """Refits the user's style on their history and every vote they cast (feedback.py) and stores it as a
        new version. Returns {"version", "n_votes", "seconds", "diagnostics", "verdict"}."""
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
            data, n_items, n_hold = self._history_data(name, k, cluster, objective)
            fs = self.cfg.feedback
            if objective in PAIR_OBJECTIVES:
                r: Refinement = refine_pairs(self.engine, objective, data, n_items, n_hold, votes, k, cluster,
                                             self._vote_features, fs)
            else:
                r = refine_tokens(self.engine, data, n_hold, votes, k, cluster, self._vote_features, fs)
        keep = dict(stats, diagnostics=r.diagnostics, loss_curve=r.curve, n_votes=r.n_votes,
                    stages_s={"refit on votes": round(r.seconds, 4)})
        extras = r.style.extras_bytes() if objective not in PAIR_OBJECTIVES else None
        vid = self.store.save_vector(name, self.engine.artifacts_id, r.style.lam, self.engine.lm.model_id, keep,
                                     extras, source="vote", note=f"history + {r.n_votes} vote{'s' * (r.n_votes != 1)}")
        return {"version": vid, "n_votes": r.n_votes, "seconds": round(r.seconds, 3), "diagnostics": r.diagnostics,
                "verdict": fit_verdict(r.diagnostics, fallback=self.engine.cfg.style.fallback, n_votes=r.n_votes)}

    def thumb(self, name: str, prompt: str, text: str, up: bool, s: DecodingSettings, k: int | None = None,
              before: str | None = None) -> dict:
        """A thumbs up (this is like me) or down (this is not) on a Compare column: stored, λ refitted at once,
        and CARD's output for the same prompt before and after. `before`: CARD's output already shown."""
        prompt = self.check_prompt(prompt)
        if not (text or "").strip():
            raise ValueError("this column has no output to vote on")
        state = self.user_state(name, k)
        if before is None and state.fitted:
            before = self._card_text(state, prompt, s)
        self.store.add_feedback(state.name, "up" if up else "down", prompt, text if up else None, None if up else text)
        try:
            r = self.refine(state.name)
        except ValueError as e:  # not fitted: the vote waits for the fit
            return {"version": None, "before": before, "after": None, "message": f"Vote kept. {e}."}
        out = self.run_method("card", self.user_state(state.name, k), prompt, s)  # stored: the next vote's "before"
        if out.error:
            raise ValueError(f"card could not run after the refit: {out.error}")
        after = out.text
        return r | {"before": before, "after": after,
                    "message": f"λ refitted on your history and {r['n_votes']} vote{'s' * (r['n_votes'] != 1)} in "
                               f"{r['seconds']:.2f} s (version {r['version']}). {r['verdict']}"}

    def thumb_column(self, name: str, method: str, up: bool, s: DecodingSettings, k: int | None = None) -> dict:
        """A thumb on a Compare column: the vote is on that method's newest output for the user (the one shown),
        and "before" is CARD's output for the same prompt when Compare showed one."""
        gens = self.store.generations(user=self.store.user(name)["name"], method=method, limit=1)
        if not gens:
            raise ValueError(f"no {method} output for {name!r} yet: generate in Compare first")
        g = gens[0]
        same = lambda c: c["prompt"] == g["prompt"] and all(  # noqa: E731
            c["settings"].get(key) == v for key, v in (("alpha", s.alpha), ("top_k", s.top_k),
                                                       ("max_new_tokens", s.max_new_tokens)))
        card = [c for c in self.store.generations(user=g["user"], method="card", limit=20) if same(c)]
        return self.thumb(g["user"], g["prompt"], g["output"], up, s, k, before=card[0]["output"] if card else None)

    def _card_text(self, state: UserState, prompt: str, s: DecodingSettings) -> str:
        return self._decode("card", state, prompt, s).text

    def versions(self, name: str) -> list[dict]:
        """The user's styles under this build, newest first: id, time, source, note, votes, helps, current."""
        rows = self.store.versions(name, self.engine.artifacts_id)
        return [{"version": r["id"], "created": r["created"][:19].replace("T", " "), "source": r["source"],
                 "note": r["note"], "votes": r["stats"].get("n_votes", 0),
                 "helps": r["stats"].get("diagnostics", {}).get("helps"), "current": r["current"]}
                for r in reversed(rows)]

    def restore_version(self, name: str, version: int) -> str:
        self.store.restore_version(name, self.engine.artifacts_id, int(version))
        return f"Version {int(version)} is {name}'s style again; CARD decodes with it from now on."

    # ------------------------------------------------------------ the user's own: style key, forget me
    def style_key(self, name: str, all_versions: bool = False) -> str:
        """The user's current style (or every version, one key per line) as text they can take elsewhere."""
        return owner.export_keys(self.store, owner.BuildInfo.of_engine(self.engine), name, all_versions)

    def import_style_key(self, text: str, name: str | None = None) -> dict:
        return owner.import_keys(self.store, owner.BuildInfo.of_engine(self.engine), text, name)

    def forget(self, name: str) -> dict:
        """"Forget me" (owner.forget_user), and the copies this process holds: methods' caches, fit features."""
        name = self.store.user(name)["name"]
        with self.model_lock:
            for m in self._methods.values():
                if hasattr(m, "forget_user"):
                    m.forget_user(name)
            self.arena.forget_user(name)
            self._history = {k: v for k, v in self._history.items() if k[1] != name}
            if self._vote_features is not None:
                self._vote_features.clear()
            return owner.forget_user(self.store, name, Path(self.cfg.db).parent / "oppu", Path(self.cfg.export_dir))

    # ------------------------------------------------------------ Explore
    def explore(self, name: str, alphas: Sequence[float], n_holdout: int = 4, s: DecodingSettings | None = None,
                progress: Callable[[float, str], None] | None = None) -> dict:
        """α and K sweeps against the user's own held-out items: λ is refitted without them (not stored), then
        CARD (and the cluster model, for K) generates for their prompts; ROUGE-L and output length per point."""
        s = s or self.engine.cfg.decoding
        if not alphas or any(a < 0 for a in alphas):
            raise ValueError("give one or more α values >= 0")
        with self.model_lock:
            items = prepared_items(self.engine, self.store, name)
            if len(items) < n_holdout + self.engine.cfg.min_fit_items:
                raise ValueError(f"explore needs at least {n_holdout + self.engine.cfg.min_fit_items} history items "
                                 f"({n_holdout} held out, the rest to fit λ); {name!r} has {len(items)}")
            held, rest = items[:n_holdout], items[n_holdout:]
            prompts, golds = [it.x for it in held], [it.y for it in held]
            total, done = len(alphas) + 2 * len(self.ks) + 1, 0

            def tick(what):
                nonlocal done
                done += 1
                if progress:
                    progress(done / total, what)

            fit = self.engine.fit(rest)
            tick("fit the style on the other items")
            emb = self.engine.embed(rest)

            def score(method, k, cluster, alpha):
                outs = self.engine.generate(prompts, method, cluster, fit.style, k=k, settings=replace(s, alpha=alpha),
                                            items=rest)
                texts = [g.text for g in outs]
                return {"rougeL": round(rouge_scores(texts, golds)["rougeL"], 4),
                        "length": round(float(np.mean([len(t.split()) for t in texts])), 2), "outputs": texts}

            alpha_rows = []
            for a in alphas:
                alpha_rows.append({"alpha": float(a), **score("card", fit.k, fit.cluster, float(a))})
                tick(f"α = {a}")
            k_rows = []
            for k in self.ks:
                c, _ = self.engine.assign(emb, k)
                for m in ("cluster", "card"):
                    k_rows.append({"k": k, "method": m, "cluster": c, **score(m, k, c, s.alpha)})
                    tick(f"K = {k} ({m})")
        return {"alpha": alpha_rows, "k": k_rows, "golds": golds, "prompts": prompts, "n_fit": len(rest),
                "default_alpha": s.alpha}

    # ---- rules the UI calls (moved from app.py)
    def need_user(self, name: str | None) -> str:
        """The user name typed at the top of the page, stripped; every tab that acts for a person needs one."""
        if not name or not name.strip():
            raise ValueError("enter a user name first (top of the page)")
        return name.strip()

    def user_names(self) -> list[str]:
        """The stored users' names (the page's "open a stored user" list)."""
        return [u["name"] for u in self.store.users()]

    def open_user(self, name: str) -> dict:
        """A stored user picked from the list: {"name", "task", "n_items", ...}; StoreError when unknown."""
        return self.store.user(name)

    def demo_pick(self, demo: str | None, name: str | None) -> tuple[str, str]:
        """A demo user's history as the text to save, and the name to save it under (the typed one, else the
        demo user's)."""
        if not demo:
            raise ValueError("pick a demo user first")
        return self.demo_history(demo), (name or demo)

    def history_from(self, text: str | None, file: str | None = None, demo: str | None = None) -> list[Item]:
        """Which history Save stores: an uploaded file first; else the demo user's items (their prompts come with
        their texts) while the box still holds that demo user's history; else the pasted text."""
        if file:
            return self.parse(file=file)
        if demo and text and text.strip() == self.demo_history(demo).strip():
            return self.demo_items(demo)
        return self.parse(text=text)

    def save_from(self, name: str | None, text: str | None, file: str | None, task: str,
                  demo: str | None = None) -> dict:
        """My writing's Save: the name checked, the history chosen (history_from), stored (save_history) under
        the task served (a history is placed, fitted and decoded in the served build's task)."""
        name = self.need_user(name)
        if task and task != self.task.name:
            raise ValueError(f"the studio serves {self.task.name} ({self.engine.artifacts_id}), not {task}: choose "
                             f"{task} in the Task list to switch to its build, or save under {self.task.name}")
        res = self.save_history(name, self.history_from(text, file, demo), task)
        if len(self.build_choices()) > 1:  # another build here may be nearer the person's writing (nearest_build)
            res["nearer"] = self.nearest_build(res["name"], res["embedding"])["message"]
        if self.cfg.first_use_in_background:
            self.prepare_first_use(res["name"])
        return res

    def item_choices(self, name: str | None) -> list[tuple[str, int]]:
        """The user's items as Compare's prompt choices: ("id: the first 80 characters", id)."""
        return [(f"{r[0]}: {r[1][:80]}", r[0]) for r in self.item_rows(name)]

    def update_item(self, name: str | None, item_id: float | None, text: str) -> str:
        """Edits one of the user's own items, by its number in their history; returns the status line."""
        name = self.need_user(name)
        if item_id is None:
            raise ValueError("enter the number of the item to change (first column of the table)")
        st = self._own_item(name, item_id)
        if st is None:
            raise ValueError(f"{name} has no item {int(item_id)}")
        self.store.update_item(st.id, text)
        return f"Item {int(item_id)} updated. Refit to use it."

    def delete_item(self, name: str | None, item_id: float | None) -> str:
        """Deletes one of the user's own items (by number), never their last one; returns the status line."""
        name = self.need_user(name)
        st = self._own_item(name, item_id)
        if st is None:
            raise ValueError("enter the number of one of this user's items (first column of the table)")
        if len(self.store.items(name)) <= 1:
            raise ValueError("this is the user's last item: a user needs at least one")
        self.store.delete_item(st.id)
        return f"Item {int(item_id)} deleted. Refit to forget it."

    def item_reference(self, name: str | None, item_id: float | None) -> str | None:
        """The text of the person's history item picked as Compare's prompt (what its outputs are read against)."""
        try:
            st = self._own_item(name, item_id)
        except StoreError:  # a name not stored (yet)
            return None
        return None if st is None else st.y

    def resolve_prompt(self, text: str | None, templated: bool, item_id: float | None = None,
                       name: str | None = None) -> tuple[str, str | None]:
        """(prompt, reference) for Compare and Why: a picked history item, when no text is typed, gives its own
        prompt (its task prompt, else the task template around its neutral rewrite) and its text as the
        reference; else the typed text, in the task template when `templated`, and no reference."""
        if item_id is not None and (not text or not text.strip()):
            st = self._own_item(name, item_id)
            if st is None:
                raise ValueError("that history item no longer exists")
            return st.x or self.task.prompt(st.neutral or st.y), st.y
        text = self.check_prompt(text)
        return (self.task.prompt(text) if templated else text), None

    def pair_prompt(self, text: str | None, fallback: str | None, templated: bool) -> str:
        """Quick pair's prompt: its own box, else Compare's; in the task template when `templated`, unless the
        text is already in it."""
        full = self.check_prompt(text if text and text.strip() else fallback)
        return self.task.prompt(full) if templated and not full.startswith(self.task.prefix) else full

    def parse_alphas(self, text: str | None, most: int = 12) -> list[float]:
        """Explore's α values: numbers separated by commas (or semicolons), at most `most` of them."""
        try:
            values = [float(v) for v in (text or "").replace(";", ",").split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"α values must be numbers separated by commas, got {text!r}") from None
        if len(values) > most:
            raise ValueError(f"at most {most} α values per sweep")
        return values

    def cluster_view(self, name: str | None, k: float | None, previous: int | None = None) -> dict:
        """My cluster: K snapped to a built one (onwards in the slider's direction from `previous`), the
        population map (with the user's star), and for a named user their state at K and texts from their
        cluster. Returns {"k", "map", "state": UserState | None (no name), "examples"}."""
        k = self.snap_k(k, previous)
        name = (name or "").strip() or None
        m = self.population_map(name, k)
        if name is None:
            return {"k": k, "map": m, "state": None, "examples": []}
        st = self.user_state(name, k)
        return {"k": k, "map": m, "state": st, "examples": self.cluster_examples(k, st.cluster)}

    def fit_message(self, name: str, fit: UserFit, total_s: float, shown_name: str | None = None) -> str:
        """Fit my style's report as Markdown: the verdict in plain words, seconds per stage (and the wait for a
        busy model), held-out accuracies, bytes stored. `shown_name`: the name as the page shows it (the caller
        escapes it); default `name`."""
        lines = [f"Fitted **{shown_name or name}** in **{total_s:.2f} s** ({fit.n_items} items, cluster "
                 f"{fit.cluster} of K = {fit.k}, objective {fit.objective}).", "", "| stage | seconds |", "|---|---|"]
        waited = total_s - fit.total_s
        if waited > 0.5:  # the model was busy: the rewrites started at Save (or another person's request)
            lines.append(f"| waiting for the model (neutral rewrites started at Save) | {waited:.3f} |")
        lines += [f"| {s} | {v:.3f} |" for s, v in fit.stages_s.items()]
        d = fit.diagnostics
        if fit.cold_start:
            lines.append(f"\n**Cold start**: fewer than {self.engine.cfg.min_fit_items} items, so λ = 1 "
                         "(your cluster's shared head). Add more writing and refit.")
        else:  # the answer first, in plain words: does the vector beat the cluster model?
            lines.insert(1, f"\n**{fit_verdict(d, fallback=self.engine.cfg.style.fallback)}**\n")
            if d.get("n"):
                lines.append(f"\nHeld-out accuracy ({d.get('unit', 'tokens')}, n = {d['n']}): own style "
                             f"**{d.get('acc_own', float('nan')):.3f}**"
                             + (f", λ = 1 {d['acc_ones']:.3f}" if "acc_ones" in d else "")
                             + (f", other users' λ {d['acc_other']:.3f}" if "acc_other" in d else "")
                             + (f", no head {d['acc_no_head']:.3f}" if "acc_no_head" in d else "")
                             + (f", likelihood rule {d['acc_logprob_rule']:.3f}" if "acc_logprob_rule" in d else "")
                             + (f", γ·Δlogp alone {d['acc_covariate_only']:.3f}" if "acc_covariate_only" in d
                                else "")
                             + (f"; user-specificity gap {d['specificity_gap']:+.4f}" if "specificity_gap" in d
                                else ""))
        if not fit.cold_start and (note := self.guard_note()):
            lines.insert(2, note)
        lines.append(f"\nStored: {self.store.vector_bytes(name, self.engine.artifacts_id)} bytes.")
        return "\n".join(lines)

    def guard_note(self) -> str | None:
        """In plain words, when the build's harm guard (tune.harm_guard) kept `card` at the cluster model: on this
        build's task no setting of the style moved the text above noise for its validation people (people who
        differ in topic more than in form), so Compare's default α is 0 and nothing only looks personal."""
        guard = self.engine.meta.get("report", {}).get("tune", {}).get("guard")
        if not guard or guard.get("kept", True) or self.engine.cfg.decoding.alpha > 0:
            return None
        return (f"On this build's task (**{self.task.name}**) CARD writes as your cluster's model: on its "
                f"{guard.get('people', 'validation')} validation people no setting of the style moved the text "
                "above noise, so α starts at 0 here. Your style is fitted all the same: Why and Explore show it, "
                "and the α slider in Compare applies it.")

    def restore(self, name: str | None, version: float | None) -> str:
        """Restore from the page: the version number given, then restore_version."""
        if version is None:
            raise ValueError("enter the number of the version to restore (first column of the table)")
        return self.restore_version(self.need_user(name), int(version))

    def forget_me(self, name: str | None, confirmed: bool) -> dict:
        """"Forget me" from the page: only with the box that confirms it ticked (forget)."""
        name = self.need_user(name)
        if not confirmed:
            raise ValueError("tick the box to confirm: forgetting cannot be undone")
        return self.forget(name)

    def compare_plan(self, name: str | None, text: str | None, templated: bool, item_id: float | None,
                     methods: Sequence[str] | None, k: int | None = None) -> dict:
        """What Compare runs, checked before anything decodes: {"name", "prompt" (resolve_prompt), "state" (at
        K), "first_use" (method -> its first use for the user does per-user work: EXACT's attribute search,
        OPPU's training), "order" (the chosen methods, slow first uses last)}."""
        name = self.need_user(name)
        if not methods:
            raise ValueError("choose at least one method")
        prompt, _ = self.resolve_prompt(text, templated, item_id, name)
        state = self.user_state(name, k)
        first = {m: self.needs_indexing(name, m) for m in methods}
        return {"name": name, "prompt": prompt, "state": state, "first_use": first,
                "order": sorted(methods, key=first.get)}

    def explain(self, name: str | None, text: str | None, templated: bool, item_id: float | None,
                s: DecodingSettings, k: int | None = None) -> dict:
        """Why: CARD step by step (why) for the user on Compare's prompt (resolve_prompt)."""
        name = self.need_user(name)
        return self.why(name, self.resolve_prompt(text, templated, item_id, name)[0], s, k)

    def quick_pair(self, name: str | None, prompt: str | None, fallback_prompt: str | None, templated: bool,
                   methods: Sequence[str] | None, s: DecodingSettings, k: int | None = None,
                   rater: str | None = None, logged_in: str | None = None) -> dict:
        """Quick pair: a blind pair drawn now (new_pair) on pair_prompt's prompt, and whether the rater
        (arena.rater_id: the logged-in name under --auth, else the typed id) already voted on these two outputs.
        Returns {"user", "pair": BlindPair, "rater", "seen": bool}."""
        from personalize.humaneval.arena import rater_id

        name = self.need_user(name)
        who = rater_id(rater, logged_in)
        pair = self.new_pair(name, self.pair_prompt(prompt, fallback_prompt, templated), methods or [], s, k)
        return {"user": name, "pair": pair, "rater": who, "seen": self.store.has_rating(who, *pair.gen_ids)}

    def vote_as(self, pair_id: str | None, winner: str, rater: str | None = None,
                logged_in: str | None = None) -> tuple[BlindPair, int, str]:
        """A vote from the page, counted under arena.rater_id (with --auth: the logged-in name, always):
        (pair, rating id, rater)."""
        from personalize.humaneval.arena import rater_id

        who = rater_id(rater, logged_in)
        pair, rid = self.vote(pair_id, winner, who)
        return pair, rid, who

    def export_table(self, table: str, fmt: str) -> tuple[Path, int]:
        """Export: a table (votes, generations) as JSONL or CSV in a new time-stamped folder under export_dir."""
        from personalize.humaneval.export import export_table

        return export_table(self.store, table, fmt, self._export_folder())

    def export_predictions(self, method: str) -> Path:
        """Export: `method`'s generations as LaMP predictions for the task served."""
        from personalize.humaneval.export import export_predictions

        return export_predictions(self.store, TASKS[self.task.name].lamp_name, method, self._export_folder())

    def _export_folder(self) -> Path:
        return Path(self.cfg.export_dir) / time.strftime("%Y%m%d-%H%M%S")

    # ------------------------------------------------------------ Populations: make one, build it, serve it
    # (population_jobs); one build at a time: it takes the CPU for minutes
    _population_job = None  # the newest PopulationJob started from the app, running or ended
    _population_start = threading.Lock()

    @property
    def population_job(self):
        return self._population_job

    def start_population_build(self, source: str, name: str | None, paths: Sequence[str] | str | None = None,
                               serve: bool = True, cfg=None, build_kwargs: dict | None = None):
        """A population from `source` (population_jobs.SOURCES: git repositories, one per line; a Debian docs
        folder; a .csv / .jsonl table) built into <artifacts root>/<name> by a background PopulationJob (progress,
        cancel) with its own copy of the served build's model, so every tab keeps answering; served once written
        when `serve`. cfg / build_kwargs replace the app's build settings (tests)."""
        from personalize.studio import population_jobs

        with self._population_start:
            job = self._population_job
            if job is not None and job.running:
                raise ValueError(f"the build of {job.name!r} is still running: wait for it, or cancel it")
            self._population_job = population_jobs.start(
                name or "", source, paths.splitlines() if isinstance(paths, str) else list(paths or []),
                self.artifacts_root, self.artifacts_root.parent / "populations", self.engine.cfg.model,
                self.engine.cfg.encoder, self.use_build, serve, cfg, build_kwargs)
            return self._population_job

    def cancel_population_build(self) -> str:
        """Cancel: the running build stops at its next step and leaves nothing behind; returns the job's line."""
        job = self._population_job
        if job is None or not job.running:
            raise ValueError("no population build is running")
        job.cancel()
        return job.line()

    def build_choices(self) -> list[tuple[str, str]]:
        """Every build under the artifacts root as (label, folder): the one served first, then newest first."""
        served = self.build
        here = Path(served.folder).resolve()
        found = [b for b in find_builds(self.artifacts_root) if Path(b.folder).resolve() != here]
        return [(f"{b.id} ({b.task}){' · served now' if b is served else ''}", b.folder) for b in [served, *found]]

    def serve_build(self, folder: str | None) -> str:
        """Serves one of build_choices' builds for every session (use_build); returns the status line."""
        if not folder:
            raise ValueError("choose a build first")
        if Path(folder).resolve() == Path(self.build.folder).resolve():
            return f"Serving `{self.engine.artifacts_id}` ({self.task.name}) already."
        if str(Path(folder).resolve()) not in {str(Path(f).resolve()) for _, f in self.build_choices()}:
            raise ValueError(f"{folder} is not a build under {self.artifacts_root}")
        t0 = time.perf_counter()
        self.use_build(folder)
        return (f"Serving `{self.engine.artifacts_id}` ({self.task.name}, K ∈ {self.ks}) now, loaded in "
                f"{time.perf_counter() - t0:.1f} s. Save your history again to place it in this build.")

    def nearest_build(self, name: str, embedding: np.ndarray | None = None) -> dict:
        """Which build's population the person's writing is nearest: the distance of their mean embedding to each
        build's nearest cluster centre at its default K (only the other builds' clusters.npz is read, no model),
        for the builds that embed with the served build's encoder, nearest first, each with cluster.closeness's
        words. Returns {"user", "builds", "nearest", "other_encoder" (ids not comparable), "message": one line
        when another build is nearer than the served one, else ""}."""
        from personalize.studio import population_jobs
        from personalize.display import md

        name = self.store.user(name)["name"]
        enc, k, c = self.engine.meta.get("encoder_id"), self.engine.cfg.default_k, self.engine.clusters
        served = {"folder": self.build.folder, "id": self.engine.artifacts_id, "task": self.task.name, "k": k,
                  "encoder_id": enc, "served": True, "embeddings": c.embeddings, "centroids": c.centroids[k],
                  "labels": c.labels[k]}
        others = [x for _, f in self.build_choices()[1:] if (x := population_jobs.build_centres(f)) is not None]
        embedding = self.embed_history(name) if embedding is None else embedding  # Save has just computed it
        res = population_jobs.nearest(embedding, [served, *(x for x in others if x["encoder_id"] == enc)])
        res |= {"user": name, "other_encoder": [x["id"] for x in others if x["encoder_id"] != enc], "message": ""}
        best, here = res["nearest"], next(r for r in res["builds"] if r["served"])
        if not best["served"]:
            res["message"] = (f"Of the {len(res['builds'])} builds here, **{md(best['id'])}** ({best['task']}) is "
                              f"nearest your writing (distance {best['distance']:.2f}, against {here['distance']:.2f} "
                              f"for the one served): there you are {best['words']}. Serve it in the *Populations* tab.")
        return res


def job_line(job: dict) -> str:
    """A first-use job's progress as the Compare column shows it."""
    what = {"exact": "searching your attributes", "oppu": "training your own LoRA"}.get(job["method"], "preparing")
    if job["state"] == "queued":
        return f"first use: {what} (queued behind other first-use work)…"
    part = f" {job['done']}/{job['total']}" if job["total"] else ""
    return f"first use: {what}{part}, {time.time() - job['started']:.0f} s so far; the other columns do not wait…"


def text_pieces(tok, steps: Sequence[dict]) -> list[tuple[str, bool]]:
    """(text, changed) per displayed piece: byte-level tokens that only together form a character (an
    emoji is often 2-4 tokens) are merged, changed if any of them was; special tokens are dropped."""
    ids, shown, out, changed = [], "", [], False
    for st in steps:
        ids.append(st["token_id"])
        changed = changed or st["changed"]
        text = tok.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete character: wait for its next bytes
            continue
        if text[len(shown):]:
            out.append((text[len(shown):], changed))
        shown, changed = text, False
    return out


def _lamp_users(folder: Path, split: str = "dev") -> dict[str, list[Item]]:
    try:
        _, queries = read_lamp(folder, split)
    except (HistoryError, OSError, ValueError):
        return {}
    return {(q.user or q.id): list(q.profile) for q in queries}


def _population_texts(engine: Engine) -> dict[str, list[str]]:
    """The build's users' texts, for cluster examples; empty when the build's data is not on this machine."""
    data = engine.meta.get("data")
    if not data or not Path(data).is_dir():
        return {}
    try:
        _, queries = read_lamp(data, engine.meta.get("split", "dev"))
    except (HistoryError, OSError, ValueError):
        return {}
    return {(q.user or q.id): [it.y for it in q.profile] for q in queries}
