"""The user's own: the style key (round trip, size, refusals, every version) and "forget me" (nothing of the
user left in the database file or beside it), through the studio and the CLI."""

from __future__ import annotations

import dataclasses

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from personalize.methods.card.style import UserStyle
from personalize.cli import main
from personalize.data import Item
from personalize.methods.oppu import adapter_id
from personalize.studio.own_data import BuildInfo, export_keys, import_keys
from personalize.store import Store

from conftest import tiny_studio
from personalize.methods.card.stylekey import MAX_KEY, StyleKey, StyleKeyError, decode, encode

TERSE = [f"ok so the {w} was fine i guess" for w in ("bus", "tea", "rain", "film", "shop", "walk", "game", "cake")]


def test_a_full_style_fits_in_a_key_and_decodes_exactly():
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(49_152, 512, replace=False))
    k = StyleKey("ana", "demo-1", "tweets", "m", rng.normal(1, 0.3, 128).astype(np.float32), ids,
                 rng.normal(0, 1, 512).astype(np.float16).astype(np.float32), True,
                 {2: {"cluster": 1, "distances": [0.5, 0.25]}}, "vote", "history + 3 votes", "2026-11-23T10:00:00")
    text = encode(k)
    assert len(text) <= MAX_KEY and "\n" not in text
    back = decode(text)
    kept = len(back.bias)
    assert np.array_equal(back.lam, k.lam) and back.helps is True and back.clusters == k.clusters
    assert back.trimmed == 512 - kept and kept >= 400  # the smallest |b| go first, when any must
    order = np.argsort(-np.abs(k.bias), kind="stable")[:kept]
    got = dict(zip(back.bias_ids.tolist(), back.bias.tolist()))
    assert got == dict(zip(k.bias_ids[order].tolist(), k.bias[order].tolist()))
    assert back.own is False and decode(encode(dataclasses.replace(k, own=True))).own is True  # how it is restored
    for bad, msg in [("hello", "not a style key"), (text[:-40], "damaged"), (text[:20] + "!!" + text[22:], "damaged"),
                     ("card-style-1:" + "A" * MAX_KEY, "at most")]:
        with pytest.raises(StyleKeyError, match=msg):
            decode(bad)


@pytest.fixture(scope="module")
def studio(tiny_artifacts, tmp_path_factory):
    s = tiny_studio(tiny_artifacts, tmp_path_factory.mktemp("owner"))
    yield s
    s.runtime.store.close()


def test_style_key_round_trip_into_another_studio(studio, tmp_path):
    studio.histories.save_history("kim", [Item(y=t) for t in TERSE], "tweets")
    studio.fits.fit("kim")
    key = studio.own_data.style_key("kim")
    assert key.startswith("card-style-1:") and len(key) <= MAX_KEY
    mine = UserStyle.from_stored(studio.runtime.store.style("kim", studio.runtime.engine.artifacts_id))
    build = BuildInfo.of_engine(studio.runtime.engine)
    assert BuildInfo.of_folder(studio.runtime.engine.folder) == build  # the CLI reads the same facts without the model

    other = Store(tmp_path / "elsewhere.db")
    res = import_keys(other, build, key, "kim-elsewhere")
    got = UserStyle.from_stored(other.style("kim-elsewhere", build.artifacts))
    assert np.array_equal(got.lam, mine.lam) and got.helps == mine.helps
    assert dict(zip(got.bias_ids.tolist(), got.bias.tolist())) == dict(zip(mine.bias_ids.tolist(), mine.bias.tolist()))
    assert len(got.values) == 0  # the memory is the history's data: it does not travel
    for k in build.ks:
        assert other.assignment("kim-elsewhere", build.artifacts, k)["cluster"] == \
            studio.runtime.store.assignment("kim", build.artifacts, k)["cluster"]
    assert [v["source"] for v in other.versions("kim-elsewhere", build.artifacts)] == ["import"]
    assert res.versions and other.items("kim-elsewhere") == []
    # exported again from there, the key carries the same style
    again = decode(export_keys(other, build, "kim-elsewhere"))
    assert np.array_equal(again.lam, mine.lam)

    with pytest.raises(StyleKeyError, match="made for the artifacts"):
        import_keys(other, replace(build, artifacts="another-build"), key)
    other.close()


def test_every_version_exports_and_imports_in_order(studio, tmp_path):
    studio.histories.save_history("lou", [Item(y=t) for t in TERSE], "tweets")
    studio.fits.fit("lou")
    studio.fits.fit("lou")
    keys = studio.own_data.style_key("lou", all_versions=True).splitlines()
    assert len(keys) == 2 and all(len(k) <= MAX_KEY for k in keys)
    other = Store(tmp_path / "v.db")
    res = import_keys(other, BuildInfo.of_engine(studio.runtime.engine), "\n".join(keys))
    versions = other.versions("lou", studio.runtime.engine.artifacts_id)
    assert [v["id"] for v in versions] == res.versions and versions[-1]["current"]
    other.close()


def test_style_key_and_forget_from_the_command_line(studio, tmp_path, capsys):
    art = str(studio.runtime.engine.folder)
    db = Path(studio.runtime.cfg.db)
    studio.histories.save_history("max", [Item(y=t) for t in TERSE], "tweets")
    studio.fits.fit("max")
    out = tmp_path / "max.key"
    assert main(["style-key", "export", "--user", "max", "--out", str(out), "--db", str(db), "--artifacts", art]) == 0
    assert out.read_text() == studio.own_data.style_key("max")  # the file is exactly the key
    db2 = tmp_path / "two.db"
    assert main(["style-key", "import", "--file", str(out), "--db", str(db2), "--artifacts", art]) == 0
    assert "imported 1 version" in capsys.readouterr().out
    bad = tmp_path / "bad.key"
    bad.write_text("card-style-1:xyz")
    assert main(["style-key", "import", "--file", str(bad), "--db", str(db2), "--artifacts", art]) == 2
    assert "damaged" in capsys.readouterr().err
    assert main(["forget", "--user", "max", "--db", str(db2)]) == 0
    assert "forgot max" in capsys.readouterr().out
    assert main(["forget", "--user", "max", "--db", str(db2)]) == 2
    assert "unknown user" in capsys.readouterr().err


def _bytes_under(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_forget_me_leaves_nothing_of_the_user(studio):
    marker = "zanzibar-quokka"
    db = Path(studio.runtime.cfg.db)
    items = [Item(y=f"{marker} {t}") for t in TERSE]
    studio.histories.save_history(marker, items, "tweets")
    studio.fits.fit(marker)
    s = studio.runtime.settings(alpha=2.0, max_new_tokens=5)
    prompt = studio.runtime.task.prompt(f"{marker} news")
    studio.votes.thumb(marker, True, s, prompt=prompt, text=f"{marker} liked this")
    pair = studio.votes.new_pair(marker, prompt, ["base", "card"], s).pair
    studio.votes.vote(pair.id, "tie", "rater-q")
    studio.votes.wait_feedback()
    studio.runtime.store.put_blob(marker, "exact_memory", prompt, {"prompt": prompt, "attributes": ["a"]})
    oppu = db.parent / "oppu" / studio.runtime.engine.artifacts_id / adapter_id(marker)
    oppu.mkdir(parents=True)
    (oppu / "adapter_model.safetensors").write_text(marker)
    exports = Path(studio.runtime.cfg.export_dir)
    exports.mkdir(parents=True, exist_ok=True)
    (exports / "generations.jsonl").write_text(json.dumps({"user": marker, "output": "x"}) + "\n"
                                               + json.dumps({"user": "someone", "output": "kept"}) + "\n")
    (exports / "votes.csv").write_text(f"user,output\nsomeone,hello\n{marker},bye\nother,{items[0].y} quoted\n")
    (exports / "predictions_card.json").write_text(json.dumps({"task": "x", "golds": [{"id": "-1", "output": "o"}]}))
    (exports / "unrelated.csv").write_text("user,output\nsomeone,hello\n")
    pending = studio.votes.new_pair(marker, prompt, ["base", "card"], s).pair
    n_ratings = len(studio.runtime.store.ratings())
    from personalize.humaneval.campaign_schema import CampaignConfig, CampaignItem  # the person as an item of a campaign

    studio.runtime.campaigns.create("forget-campaign", [CampaignItem(marker, prompt, tuple(it.y for it in items),
                                                             f"{marker} gold")], CampaignConfig(("base", "card"),
                                                                                                reference=True))
    for item, m in studio.runtime.campaigns.missing("forget-campaign"):
        studio.runtime.campaigns.add_output(item["id"], m, f"{marker} {m} output", 0.1)
    unit = studio.runtime.campaigns.next("forget-campaign", "rater-q")
    studio.runtime.campaigns.submit(unit.id, "rater-q", "a")
    studio.campaign_desk.export_campaign("forget-campaign", "jsonl")
    assert marker.encode() in _bytes_under(db.parent)

    res = studio.own_data.forget(marker, True)
    assert res.deleted["items"] == len(items) and res.ratings_anonymised == 1 and res.deleted["feedback"] == 1
    assert res.deleted["versions"] >= 2 and res.deleted["generations"] >= 2 and res.deleted["blobs"] >= 1
    assert marker.encode() not in _bytes_under(db.parent)  # the database, its WAL, adapters, exports
    assert (exports / "unrelated.csv").exists() and not oppu.exists()
    # exports keep every other person's records: only the forgotten person's rows went (issue 24)
    assert [json.loads(r) for r in (exports / "generations.jsonl").read_text().splitlines()] == [
        {"user": "someone", "output": "kept"}]
    assert (exports / "votes.csv").read_text().splitlines() == ["user,output", "someone,hello"]
    assert json.loads((exports / "predictions_card.json").read_text())["golds"] == [{"id": "-1", "output": "o"}]
    assert res.exports[str(exports / "generations.jsonl")] == 1 and res.exports[str(exports / "votes.csv")] == 2
    ratings = studio.runtime.store.ratings()
    assert len(ratings) == n_ratings  # the verdict stays for the leaderboard, without texts or the user
    anon = [r for r in ratings if r["rater"] == "rater-q"]
    assert anon[0]["winner"] == "tie" and anon[0]["user"] is None and anon[0]["output_a"] == ""
    assert studio.runtime.arena.pending(pending.id) is None
    assert res.campaign_items_anonymised == 1  # the campaign keeps the verdict, not the person's texts
    kept = studio.runtime.campaigns.judgments("forget-campaign")
    assert [r["verdict"] for r in kept] == ["a"] and kept[0]["prompt"] == "" and marker not in kept[0]["user"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with pytest.raises(ValueError, match="unknown user"):
        studio.histories.user_state(marker)


def test_a_second_persons_items_carry_their_own_numbers(studio):
    """Items as the fits and Explore read them are numbered as My writing shows them (and as UserContext numbers the
    items Compare's methods report), not by the store's row id, which counts every person's items before theirs."""
    from personalize.methods.card.person import prepared_items

    studio.histories.save_history("nia", [Item(y=t) for t in TERSE], "tweets")
    studio.histories.save_history("oli", [Item(y=t + " really") for t in TERSE[:5]], "tweets")
    shown = [str(row[0]) for row in studio.histories.item_rows("oli")]
    assert [it.id for it in prepared_items(studio.runtime.engine, studio.runtime.store, "oli")] == shown
    assert shown == ["1", "2", "3", "4", "5"]



def test_forget_me_replaces_the_name_typed_as_a_rater_id_with_one_anonymous_id(studio):
    """Issue 49: a person who typed their own name as the rater id (no logins) left it in `ratings.rater` and the
    campaigns' rater columns after Forget me. Now one new anonymous id takes its place in every one of them, so
    the votes still count once per pair and as one rater's, and no byte of the name is left in the files."""
    marker = "noor-quillfeather"
    db = Path(studio.runtime.cfg.db)
    studio.histories.save_history(marker, [Item(y=f"{t} said noor") for t in TERSE], "tweets")
    studio.histories.save_history("pat", [Item(y=f"{t}, wrote pat") for t in TERSE], "tweets")
    s = studio.runtime.settings(max_new_tokens=3)
    pairs = [studio.votes.new_pair(person, studio.runtime.task.prompt(f"a day of {person}"), ["base", "cluster"],
                                   s).pair for person in ("pat", marker)]
    for pair in pairs:
        studio.votes.vote(pair.id, "a", marker)  # the rater id she typed is her name
    studio.votes.wait_feedback()
    from personalize.humaneval.campaign_schema import CampaignConfig, CampaignItem

    studio.runtime.campaigns.create("rater-ids", [CampaignItem("pat", "a prompt", ("pat's text",), "gold")],
                                    CampaignConfig(("base", "cluster"), reference=True))
    for item, m in studio.runtime.campaigns.missing("rater-ids"):
        studio.runtime.campaigns.add_output(item["id"], m, f"{m} output", 0.1)
    unit = studio.runtime.campaigns.next("rater-ids", marker)
    studio.runtime.campaigns.submit(unit.id, marker, "b")

    res = studio.own_data.forget(marker, True)
    store = studio.runtime.store
    columns = ("ratings.rater", "campaign_assignments.rater", "campaign_judgments.rater")
    ids = {c: {r["rater"] for r in store.query(f"SELECT {c.split('.')[1]} AS rater FROM {c.split('.')[0]}")}
           for c in columns}
    assert not any(marker in v for c in columns for v in ids[c]), ids
    ratings = [r for r in store.ratings() if r["gen_a"] in {g for p in pairs for g in p.gen_ids}]
    (anonymous,) = {r["rater"] for r in ratings}  # one id for both of her votes...
    assert anonymous.startswith("forgotten-") and anonymous in ids["campaign_judgments.rater"]  # ...and her judgment
    assert res.rater_ids_anonymised == 4  # two votes, one campaign assignment, one judgment
    assert store.has_rating(anonymous, *pairs[0].gen_ids)  # her vote still counts once for that pair
    assert marker.encode() not in _bytes_under(db.parent)
