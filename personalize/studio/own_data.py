"""What belongs to the user: their style, to take elsewhere as a key, and the right to be forgotten.

Both work on the store and the build's description alone (no model is loaded), so
the CLI runs them in a second and the app calls the same functions.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import safe_open

from personalize.methods.card.style import UserStyle
from personalize.methods.card import stylekey
from personalize.humaneval import campaign_schema
from personalize.store import Store
from personalize.studio.service import Service

if TYPE_CHECKING:
    from personalize.studio.fits import Fits


@dataclass(frozen=True)
class BuildInfo:
    """What a style key must match: the artifacts id, and what its λ means there."""

    artifacts: str
    task: str
    model_id: str
    ks: tuple[int, ...]
    default_k: int
    objective: str
    d: int

    @classmethod
    def of_engine(cls, engine) -> "BuildInfo":
        obj = engine.cfg.objectives[0]
        return cls(engine.artifacts_id, engine.task.name, engine.lm.model_id, tuple(sorted(engine.clusters.centroids)),
                   engine.cfg.default_k, obj, engine.heads[obj].d)

    @classmethod
    def of_folder(cls, folder: str | Path) -> "BuildInfo":
        from personalize.methods.artifacts import artifacts_meta

        folder = Path(folder)
        meta = artifacts_meta(folder)
        st = meta["settings"]
        obj = st["objectives"][0]
        with safe_open(str(folder / f"head_{obj}.safetensors"), "np") as f:
            d = f.get_slice("U").get_shape()[1]
        model = st.get("model", {})
        return cls(meta["id"], meta["task"], str(meta.get("model_id") or model.get("name_or_path", "")),
                   tuple(st["ks"]), int(st["default_k"]), obj, int(d))


def export_keys(store: Store, build: BuildInfo, name: str, all_versions: bool = False) -> str:
    """The user's current style (or every version, oldest first, one key per line) as style keys."""
    name = store.user(name)["name"]
    rows = store.versions(name, build.artifacts)
    if not rows:
        raise ValueError(f"{name!r} has no fitted style under the artifacts {build.artifacts}: fit it first")
    chosen = rows if all_versions else ([r for r in rows if r["current"]] or rows[-1:])
    placed = {k: store.assignment(name, build.artifacts, k) for k in build.ks}
    clusters = {k: {"cluster": a["cluster"], "distances": a["distances"]} for k, a in placed.items() if a is not None}
    task = store.user(name)["task"]
    keys = []
    for r in chosen:
        stored, _ = store.version_style(name, build.artifacts, r["id"])
        style = UserStyle.from_stored(stored)
        keys.append(stylekey.encode(stylekey.StyleKey(
            name, build.artifacts, task, build.model_id, style.lam, style.bias_ids, style.bias, style.helps,
            clusters, r["source"], r["note"], r["created"], own=bool(style.own))))
    return "\n".join(keys)


@dataclass(frozen=True)
class ImportedKeys:
    """A style-key import: whose styles they now are, the versions stored (the last one current), and how many of
    the smallest word-bias entries the keys had left out."""
    user: str
    versions: list[int]
    trimmed: int
    own: bool = False  # the key's style was fitted over its person's own adapter, which an import retrains

    @property
    def own_line(self) -> str:
        """What the page says of a key made over an own adapter: how that adapter comes back."""
        return (" This style was fitted over its person's own adapter, which a key cannot carry: until you save your "
                "history here (or press *Train my own adapter*), card decodes it over your nearest cluster's; then "
                "the adapter is retrained from your history and your style fitted over it.") if self.own else ""


def import_keys(store: Store, build: BuildInfo, text: str, name: str | None = None) -> ImportedKeys:
    """Stores the style of each key (one per line) for `name` (default: the key's user) as a new version, the
    last one current, with the key's clusters. Refused, saying what to do, when a key was made elsewhere."""
    keys = [stylekey.decode(line) for line in (text or "").splitlines() if line.strip()]
    if not keys:
        raise stylekey.StyleKeyError("paste a style key (it starts with card-style-1:)")
    for key in keys:
        if key.artifacts != build.artifacts:
            raise stylekey.StyleKeyError(
                f"this key was made for the artifacts {key.artifacts} ({key.task}); this studio serves "
                f"{build.artifacts} ({build.task}). Load that build, or paste your writing here and fit a new style.")
        if len(key.lam) != build.d:
            raise stylekey.StyleKeyError(f"the key's λ has {len(key.lam)} values; this build's head has {build.d}")
    last = keys[-1]
    user = store.ensure_user(name or last.user, last.task)
    cluster = last.clusters.get(build.default_k, {"cluster": 0})["cluster"]
    stats = {"cluster": cluster, "k": build.default_k, "objective": build.objective, "imported": True}
    clusters = {k: (a["cluster"], a["distances"]) for k, a in last.clusters.items() if k in build.ks}
    vids = [store.save_vector(user, build.artifacts, key.lam, key.model_id,
                              stats | {"diagnostics": {"helps": key.helps}}, key.style.extras_bytes(), source="import",
                              note=f"{key.source} version of {key.created[:19].replace('T', ' ')}",
                              assignments=clusters if key is last else None)
            for key in keys]
    return ImportedKeys(user, vids, sum(k.trimmed for k in keys), last.own)


@dataclass(frozen=True)
class Forgotten:
    """What "forget me" took: rows deleted per table, ratings and campaign items kept without texts or name, files
    removed, the exports rewritten with how many of the person's records left each, and the rows where their name
    was a rater's id (now an anonymous one)."""
    deleted: dict[str, int]
    ratings_anonymised: int
    campaign_items_anonymised: int
    files: list[str]
    exports: dict[str, int]
    rater_ids_anonymised: int = 0

    @property
    def rows_deleted(self) -> int:
        return sum(self.deleted.values())


def forget_user(store: Store, name: str, oppu_root: Path, export_dir: Path, page_files: Path | None = None
                ) -> Forgotten:
    """Deletes the user from the store (store.forget: one transaction, ratings anonymised, file vacuumed) and
    what of them is in the files beside it: their OPPU adapters (every build, partial saves included), their
    records in exports (the other people's records stay; a file of no known format that quotes them goes whole;
    LaMP predictions lose the rows of their generations), and every file of the page's cache (`page_files`:
    their uploads, and the copies of exports the page handed out) that holds any of it, so its link answers 404."""
    name = store.user(name)["name"]
    texts = [s.y for s in store.items(name)]
    texts += [i["y"] for r in store.query("SELECT items FROM replaced WHERE user = ?", [name])
              for i in json.loads(r["items"])]  # the histories a Save replaced are theirs too
    gens = store.generations(user=name)
    gen_ids = {str(g["extra"].get("question_id", g["id"])) for g in gens}  # LaMP ids
    outputs = [g["output"] for g in gens if len(g["output"].strip()) >= 16]  # what a predictions file quotes
    store.attach(campaign_schema.TABLES)  # a campaign's items hold the person's texts too
    out = store.forget(name)
    long_texts = [t for t in texts if len(t) >= 8]  # long enough to be theirs
    # what marks a record as the person's: their name as a JSON value or a whole CSV field, or one of their texts
    needles = [json.dumps(name, ensure_ascii=False), json.dumps(name), f",{name},", f",{name}\n", f"\n{name},",
               *long_texts]
    removed, rewritten = [], {}
    oppu_root = Path(oppu_root)
    from personalize.methods.oppu import adapter_id  # model code: imported once there is someone to forget
    for f in sorted(oppu_root.glob(f"*/{adapter_id(name)}*")) if oppu_root.is_dir() else []:
        shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)
        removed.append(f)
    for f in _quoting(Path(export_dir), needles + outputs):
        dropped = _drop_records(f, lambda r: _theirs(r, name, long_texts, gen_ids))
        if dropped is None or _quotes(f, needles + outputs):  # still quotes them
            f.unlink(missing_ok=True)
            removed.append(f)
        else:
            rewritten[str(f)] = dropped
    if page_files is not None:  # the page's copies: gone whole (a download made again is made without them)
        for f in _quoting(Path(page_files), needles + outputs):
            f.unlink(missing_ok=True)
            removed.append(f)
            if f.parent != Path(page_files) and not any(f.parent.iterdir()):
                f.parent.rmdir()
    anonymised = {k: out.pop(k, 0) for k in ("ratings_anonymised", "campaign_items_anonymised",
                                             "rater_ids_anonymised")}
    return Forgotten(out, anonymised["ratings_anonymised"], anonymised["campaign_items_anonymised"],
                     [str(f) for f in removed], rewritten, anonymised["rater_ids_anonymised"])


def _quotes(f: Path, needles) -> bool:
    text = f.read_text(errors="ignore")
    return any(n in text for n in needles)


def _quoting(export_dir: Path, needles) -> list[Path]:
    if not export_dir.is_dir():
        return []
    return [f for f in sorted(export_dir.rglob("*")) if f.is_file() and _quotes(f, needles)]


def _theirs(record, name: str, texts, gen_ids: set[str]) -> bool:
    """A record is the person's when a value is their name, quotes one of their texts, or is one of their
    generations (a LaMP predictions row's id)."""
    stack = [record]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "output" in v and str(v.get("id")) in gen_ids and set(v) <= {"id", "output"}:
                return True
            stack += v.values()
        elif isinstance(v, list):
            stack += v
        elif isinstance(v, str) and (v == name or any(t in v for t in texts)):
            return True
    return False


def _drop_records(path: Path, theirs) -> int | None:
    """Rewrites an export without the records `theirs` picks (atomically); the number dropped, or None when
    the file is of no format whose records can be told apart (it then goes whole)."""
    from personalize.humaneval.table_export import to_csv, to_jsonl, write

    text = path.read_text(encoding="utf-8", errors="ignore")
    try:
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
            keep = [r for r in records if not theirs(r)]
            write(path, to_jsonl(keep))
        elif path.suffix == ".csv":
            import csv
            import io

            records = list(csv.DictReader(io.StringIO(text, newline="")))
            keep = [r for r in records if not theirs(r)]
            write(path, to_csv(keep) if keep else text.split("\n", 1)[0] + "\n")
        elif path.suffix == ".json":
            obj = json.loads(text)
            if not (isinstance(obj, dict) and isinstance(obj.get("golds"), list)):
                return None
            records, keep = obj["golds"], [g for g in obj["golds"] if not theirs(g)]
            write(path, json.dumps(obj | {"golds": keep}, indent=1, ensure_ascii=False))
        else:
            return None
    except (ValueError, TypeError):
        return None
    return len(records) - len(keep)


class OwnData(Service):
    """The person's own, from the app: their style key, and forget me (with the copies this process holds)."""

    def __init__(self, rt, fits: "Fits"):
        super().__init__(rt)
        self.fits = fits

    def style_key(self, name: str, all_versions: bool = False) -> str:
        """The user's current style (or every version, one key per line) as text they can take elsewhere."""
        self.rt.need_head("A style key")
        return export_keys(self.store, BuildInfo.of_engine(self.engine), name, all_versions)

    def import_style_key(self, text: str, name: str | None = None) -> ImportedKeys:
        """The key's style for `name` (else the key's person); a name another login holds is refused first."""
        name = self.rt.need_user(name) if name and name.strip() else None
        self.rt.need_head("A style key")
        return import_keys(self.store, BuildInfo.of_engine(self.engine), text, name)

    def forget(self, name: str | None, confirmed: bool) -> Forgotten:
        """"Forget me", only with the box that confirms it ticked: the person's rows and files (forget_user), and
        the copies this process holds (methods' caches, fit features, jobs, the feedback log)."""
        name = self.rt.need_user(name)
        if not confirmed:
            raise ValueError("tick the box to confirm: forgetting cannot be undone")
        name = self.store.user(name)["name"]
        with self.model_lock:
            for m in self.rt.methods.values():
                if hasattr(m, "forget_user"):
                    m.forget_user(name)
            self.rt.arena.forget_user(name)
            self.fits.forget_user(name)
            for key in [k for k in self.rt.jobs if k[0] == name]:  # first-use jobs' states and errors
                del self.rt.jobs[key]
            self.rt.feedback_log[:] = [e for e in self.rt.feedback_log if e.get("user") != name]
            return forget_user(self.store, name, Path(self.cfg.db).parent / "oppu", self.cfg.exports,
                               self.cfg.page_files)

