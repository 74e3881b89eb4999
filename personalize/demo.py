"""The demo population: synthetic tweet writers in six clearly different styles, in LaMP format.

The project ships no real user data, so the app and the tests need a population
whose style signal is known: every text is a styled rendering of a neutral
sentence, styles differ between clusters and quirks differ between users.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from personalize.data import TASKS, Item, Query, write_lamp

DEMO_DIR = Path(__file__).resolve().parents[1] / "data" / "demo"
SPLIT = "dev"
STYLES = ("terse", "emoji", "formal", "hype", "hashtag", "academic")

# Everyday facts: (topic, neutral sentence with {slots}); combined with the slot values they give thousands of texts.
_FACTS = (
    ("weather", "It rained all morning in {city}, but the sun came out after lunch."),
    ("weather", "It is {temp} degrees in {city} today, so I am staying inside."),
    ("coffee", "I tried the new coffee place on {street} and the {drink} was good."),
    ("coffee", "I have had {n} cups of coffee and it is not even noon."),
    ("train", "My train to {city} was delayed by {mins} minutes this morning."),
    ("train", "The {day} train was cancelled, so I took the bus instead."),
    ("book", "I started reading {book} and the first chapter is very good."),
    ("book", "I finished {book} last night and I am still thinking about it."),
    ("football", "{team} won {score} last night and the second half was exciting."),
    ("football", "{team} lost again on {day} and the defence looked tired."),
    ("deadline", "The project deadline is on {day} and I still have {n} tasks left."),
    ("deadline", "I submitted the {doc} an hour before the deadline."),
    ("concert", "I saw {band} live in {city} and the crowd was great."),
    ("concert", "I bought tickets for the {band} concert next {day}."),
    ("cooking", "I cooked {dish} for dinner and it turned out well."),
    ("cooking", "I tried a new recipe for {dish}, but I burned the onions."),
    ("run", "I ran {km} kilometres along the river before work."),
    ("run", "My {km} kilometre run was slow today because of the wind."),
    ("bugfix", "I finally fixed the bug in the {lang} parser after {n} hours."),
    ("bugfix", "The tests pass again after I found a missing comma in the {lang} code."),
    ("cat", "My cat knocked a glass off the table at {clock} in the morning."),
    ("garden", "The {plant} in the garden are finally growing after {n} weeks."),
    ("movie", "I watched {movie} on {day} night and the ending surprised me."),
    ("sleep", "I slept for {n} hours and I still feel tired."),
    ("shopping", "The supermarket was out of {food} again."),
    ("travel", "I booked a weekend trip to {city} for next month."),
    ("meeting", "The meeting on {day} lasted {mins} minutes longer than planned."),
    ("bike", "I cycled to work today and it took {mins} minutes."),
    ("music", "I have been listening to {band} on repeat all week."),
    ("study", "I spent {day} afternoon learning {tongue} and it was fun."),
    ("chores", "I cleaned the whole flat and found {n} lost socks."),
    ("bakery", "The bakery on {street} had fresh {pastry} this morning."),
    ("museum", "We visited the {museum} museum in {city} and it was quiet."),
    ("game", "I finally beat the last level of the game I started in {month}."),
)
_SLOTS = {
    "city": ("Leeds", "Lyon", "Porto", "Berlin", "Oslo", "Boston", "Dublin", "Milan", "Ghent", "York"),
    "temp": ("3", "8", "31", "35", "-2", "29"),
    "street": ("Mill Street", "the high street", "Park Road", "the corner", "Station Road", "Elm Lane"),
    "drink": ("flat white", "espresso", "latte", "cold brew", "cortado"),
    "n": ("2", "3", "4", "5", "6", "7"),
    "mins": ("10", "15", "20", "25", "40", "45"),
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "book": ("Dune", "Middlemarch", "The Hobbit", "Emma", "Beloved", "Solaris", "Persuasion"),
    "team": ("Arsenal", "Celtic", "Ajax", "Benfica", "Napoli", "Everton", "Porto"),
    "score": ("2-1", "3-0", "1-0", "4-2", "2-0"),
    "doc": ("report", "grant proposal", "slides", "budget", "review"),
    "band": ("Wet Leg", "Bicep", "Khruangbin", "Fontaines D.C.", "Big Thief", "Jungle"),
    "dish": ("lentil soup", "a mushroom risotto", "tacos", "a curry", "lasagne", "dumplings"),
    "km": ("5", "8", "10", "12", "15", "21"),
    "lang": ("Python", "Rust", "Go", "SQL", "Java", "C"),
    "tongue": ("Spanish", "Italian", "Japanese", "Welsh", "Greek"),
    "clock": ("4", "5", "6", "3"),
    "plant": ("tomatoes", "beans", "sunflowers", "herbs", "peas"),
    "movie": ("Alien", "Heat", "Amelie", "Arrival", "Up", "Jaws"),
    "food": ("oat milk", "bananas", "eggs", "bread", "avocados", "pasta"),
    "pastry": ("croissants", "cinnamon buns", "bagels", "scones"),
    "museum": ("science", "modern art", "railway", "history", "design"),
    "month": ("January", "March", "May", "August", "October"),
}
_TOPIC_EMOJI = {
    "weather": "🌧☀️⛅", "coffee": "☕😋", "train": "🚆⏰", "book": "📚📖", "football": "⚽🏆", "deadline": "⏳📝",
    "concert": "🎸🎶", "cooking": "🍳🍲", "run": "🏃👟", "bugfix": "🐛💻", "cat": "🐱😼", "garden": "🌱🌻",
    "movie": "🎬🍿", "sleep": "😴🛌", "shopping": "🛒😩", "travel": "✈️🧳", "meeting": "📅🙄", "bike": "🚲💨",
    "music": "🎧🎵", "study": "📚🧠", "chores": "🧦🧹", "bakery": "🥐🥯", "museum": "🏛️🖼️", "game": "🎮👾",
}
_ADJ = re.compile(r"\b(?:very )?(good|great|tired|slow|quiet|exciting|fun|well|surprised)\b")


@dataclass(frozen=True)
class Quirks:
    """What makes one user recognisable inside their style cluster."""

    opener: str
    ending: str
    intensifier: str
    mark: str  # signature emoji, hashtag or closing remark


# Per style: openers, endings, intensifiers, marks; user i of a style takes entry i of each (after a seeded shuffle).
_QUIRKS: dict[str, tuple[tuple[str, ...], ...]] = {
    "terse": (("welp", "ok", "meh", "so", "update:", "fyi", "k", "hm"),
              (" ...", " lol", " ugh", " tbh", " fr", " smh", " idk", " lmao"),
              ("kinda", "v", "p", "lowkey", "so", "mad", "real", "bit"),
              (" :/", " ok", " whatever", " k", " rip", " ..", " nvm", " yep")),
    "emoji": (("omg", "ok so", "guess what", "yay", "aaaa", "ngl", "hehe", "wow"),
              ("!!", "!", "~", "!!!", " <3", "", "!?", " xx"),
              ("sooo", "literally", "super", "totally", "lowkey", "actually", "honestly", "crazy"),
              ("😂", "🙌", "✨", "💖", "😭", "🥳", "🤩", "🫶")),
    "formal": (("I am pleased to report that", "Please note that", "For the record,", "I should mention that",
                "It may interest you that", "Allow me to note that", "I am delighted to share that", "Permit me to say that"),
               ("Kind regards, M.", "Best wishes.", "Yours, J. T.", "Respectfully, A. K.", "With thanks.",
                "Sincerely, R.", "Warm regards.", "Regards, P. L."),
               ("rather", "quite", "most", "remarkably", "exceedingly", "thoroughly", "decidedly", "truly"),
               ("", "Indeed,", "", "Incidentally,", "", "Naturally,", "", "Evidently,")),
    "hype": (("BREAKING:", "HUGE NEWS:", "OMG", "YOOO", "NO WAY", "LISTEN UP:", "ATTENTION:", "BIG DAY:"),
             ("!!!", "!!!!!", "!!1", "!!! LET'S GOOO", "!!! W", "!!! NO CAP", "!!!!", "!!! HYPE"),
             ("SO", "MEGA", "TOTALLY", "ABSOLUTELY", "INSANELY", "ULTRA", "SUPER", "WILDLY"),
             ("🔥", "", "💯", "", "🚀", "", "⚡", "")),
    "hashtag": (("", "", "Today:", "Update:", "", "PSA:", "", "Fact:"),
                (" ", " ", " · ", " ", " | ", " ", " ", " / "),
                ("really", "so", "very", "truly", "seriously", "pretty", "super", "totally"),
                ("#LifeUpdate", "#SmallWins", "#RandomThoughts", "#justsaying", "#mood", "#DailyLife", "#blessed", "#TGIF")),
    "academic": (("Preliminary observations suggest that", "Anecdotally,", "Field note:", "Empirically,",
                  "Data point:", "Observation:", "We report that", "Interestingly,"),
                 ("(n = 1)", "Further replication is warranted.", "Limitations apply.", "cf. previous entries.",
                  "Effect size unclear.", "[citation needed]", "Results may not generalise.", "More data required."),
                 ("moderately", "notably", "markedly", "substantially", "somewhat", "measurably", "considerably", "modestly"),
                 ("approximately ", "~", "circa ", "roughly ", "approximately ", "~", "about ", "an estimated ")),
}


def _neutral(rng: random.Random) -> tuple[str, str]:
    topic, template = rng.choice(_FACTS)
    text = re.sub(r"\{(\w+)\}", lambda m: rng.choice(_SLOTS[m.group(1)]), template)
    return topic, text


def _intensify(t: str, word: str) -> str:
    return _ADJ.sub(lambda m: f"{word} {m.group(1)}", t, count=1)


def _lead(opener: str, t: str) -> str:
    """Opener + sentence, lower-casing a plain first word when the opener runs into it."""
    if opener.endswith(":") or t.split()[0] not in ("It", "My", "The", "We"):
        return f"{opener} {t}"
    return f"{opener} {t[0].lower()}{t[1:]}"


def _terse(t: str, topic: str, q: Quirks, rng: random.Random) -> str:
    t = t.lower().rstrip(".").replace(",", "")
    for a, b in ((r"\bi am\b", "im"), (r"\bi have\b", "ive"), (r"\bit is\b", "its"), (r"\bminutes\b", "min"),
                 (r"\bkilometres?\b", "k"), (r"\bbecause of\b", "bc"), (r"\bthis morning\b", "this am"),
                 (r"\b(the|a|an|very|really|finally|again|so|still|too) ", ""), (r"\band\b", "&")):
        t = re.sub(a, b, t)
    t = _intensify(t, q.intensifier)
    if q.opener and rng.random() < 0.5:
        t = f"{q.opener} {t}"
    return f"{t}{q.ending if rng.random() < 0.7 else ''}{q.mark if rng.random() < 0.5 else ''}".lower()


def _emoji(t: str, topic: str, q: Quirks, rng: random.Random) -> str:
    pics = list(_TOPIC_EMOJI[topic].replace("\ufe0f", ""))
    t = _intensify(t.rstrip("."), q.intensifier).replace(", ", f" {rng.choice(pics)} ", 1)
    if rng.random() < 0.6:
        t = f"{q.opener} {t[0].lower()}{t[1:]}" if not t.startswith("I ") else f"{q.opener} {t}"
    return f"{t}{q.ending} {rng.choice(pics)}{q.mark * rng.randint(1, 3)}"


def _formal(t: str, topic: str, q: Quirks, rng: random.Random) -> str:
    t = _intensify(t, q.intensifier).replace(" so ", " and therefore ").replace(" but ", " however, ")
    t = _lead(q.mark if q.mark and rng.random() < 0.5 else q.opener, t)
    return f"{t} {q.ending}" if rng.random() < 0.8 else t


def _hype(t: str, topic: str, q: Quirks, rng: random.Random) -> str:
    t = _intensify(t.rstrip("."), q.intensifier).replace(",", "!!").upper()
    if rng.random() < 0.7:
        t = f"{q.opener} {t}"
    return f"{t}{q.ending}{' ' + q.mark if q.mark else ''}"


def _hashtag(t: str, topic: str, q: Quirks, rng: random.Random) -> str:
    words = _intensify(t, q.intensifier).split()
    for i in rng.sample(range(len(words)), k=min(3, len(words))):
        core = re.sub(r"\W", "", words[i])
        if len(core) > 3 and core.isalpha() and core.lower() not in _PLAIN:
            words[i] = words[i].replace(core, "#" + core)
    tags = [f"#{topic}", f"#{rng.choice(_TAGS)}", q.mark]
    return f"{q.opener} {' '.join(words)} {q.ending.join(tags)}"


_PLAIN = frozenset("than that this with after before still again even last next along from have were turned "
                   "longer finally started found took very really about into".split())
_TAGS = ("everyday", "today", "weekend", "thoughts", "life", "citylife", "vibes", "realtalk")


def _academic(t: str, topic: str, q: Quirks, rng: random.Random) -> str:
    t = re.sub(r"(?<![-\d])\b(\d+)\b(?![-\d])", lambda m: q.mark + m.group(1), t, count=1)
    t = _intensify(t.replace(" good", " satisfactory").replace(" great", " notable"), q.intensifier)
    return f"{_lead(q.opener, t)} {q.ending}"


_STYLE_FNS: dict[str, Callable[[str, str, Quirks, random.Random], str]] = {
    "terse": _terse, "emoji": _emoji, "formal": _formal, "hype": _hype, "hashtag": _hashtag, "academic": _academic,
}


def _fit(text: str, limit: int = 199) -> str:
    """Tweet-sized: collapse spaces and cut at a word boundary if a rendering ran long."""
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


def user_name(style: str, i: int) -> str:
    """Demo user names, e.g. "terse_01", "emoji_03": the style is readable in the name."""
    return f"{style}_{i + 1:02d}"


def demo_queries(n_users_per_style: int = 8, n_items: int = 20, seed: int = 0) -> list[Query]:
    """One query per user: n_items styled profile items and a held-out styled gold, all deterministic in seed."""
    task = TASKS["tweets"]
    queries = []
    for style in STYLES:
        pools = [list(p) for p in _QUIRKS[style]]
        for k, p in enumerate(pools):
            random.Random(f"{seed}:{style}:{k}").shuffle(p)
        for i in range(n_users_per_style):
            user = user_name(style, i)
            q = Quirks(*(p[(i + k * (i // len(p))) % len(p)] for k, p in enumerate(pools)))  # distinct up to 8 users
            rng = random.Random(f"{seed}:{user}")
            facts: dict[str, str] = {}
            while len(facts) < n_items + 1:
                topic, text = _neutral(rng)
                facts.setdefault(text, topic)
            pairs = [(task.prompt(text), _fit(_STYLE_FNS[style](text, topic, q, rng))) for text, topic in facts.items()]
            profile = tuple(Item(y=y, x=x, id=f"{user}-{j:02d}") for j, (x, y) in enumerate(pairs[:-1]))
            x, y = pairs[-1]
            queries.append(Query(id=f"demo-{user}", input=x, profile=profile, gold=y, user=user))
    return queries


def write_demo(folder: str | Path = DEMO_DIR, n_users_per_style: int = 8, n_items: int = 20, seed: int = 0) -> Path:
    """Write the demo population as LaMP split "dev" of task tweets; returns the folder.

    Safe when two processes write the first demo at once: the files are written into a temp folder beside
    it, which is renamed into place whole; a process that then finds the other's finished folder leaves it
    (same arguments, same bytes). An existing folder (asked for again on purpose) gets each file replaced
    atomically, the questions file last, since its presence is what marks the demo as written."""
    folder = Path(folder)
    queries = demo_queries(n_users_per_style, n_items, seed)
    existed = folder.is_dir() and any(folder.iterdir())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
    try:
        write_lamp(tmp, SPLIT, TASKS["tweets"], queries)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; this is an ordinary data folder
        if not existed:
            try:
                os.rename(tmp, folder)  # onto a missing or empty folder: atomic
                return folder
            except OSError:
                if (folder / f"{SPLIT}_questions.json").exists():
                    return folder  # another process finished first: keep its folder
                if not folder.is_dir():
                    raise
        folder.mkdir(exist_ok=True)
        names = [f"{SPLIT}_{n}.json" for n in ("outputs", "meta", "questions")]
        for name in names:
            if (tmp / name).exists():
                os.replace(tmp / name, folder / name)
            else:
                (folder / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m personalize.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEMO_DIR, help=f"folder to write (default: {DEMO_DIR})")
    ap.add_argument("--users-per-style", type=int, default=8, help="users per style (default: 8)")
    ap.add_argument("--items", type=int, default=20, help="profile items per user (default: 20)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = ap.parse_args(argv)
    folder = write_demo(args.out, args.users_per_style, args.items, args.seed)
    n = args.users_per_style * len(STYLES)
    print(f"wrote {n} demo users ({', '.join(STYLES)}) to {folder}/{SPLIT}_*.json")


if __name__ == "__main__":
    main()
