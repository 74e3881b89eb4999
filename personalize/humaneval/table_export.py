"""Export of what the studio collected: votes and generations as JSONL or CSV, generations as LaMP predictions.

Files are written whole to a temporary name and renamed, so an export that
fails half-way never leaves a truncated file where a complete one is expected.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Sequence

from personalize.schema import current_login
from personalize.store import Store

FORMATS = ("jsonl", "csv")
TABLES = ("votes", "generations")


def rows(store: Store, table: str) -> list[dict]:
    """The table's records the current login may take away (schema.Access): generations of its people; votes it
    cast or that are about its people. Without logins, all of them."""
    if table == "votes":
        me = current_login()
        return [r for r in store.ratings() if (me is not None and r["rater"] == me) or store.may_reach(r["user"])]
    if table == "generations":
        return list(reversed(store.generations()))  # oldest first, like the votes
    raise ValueError(f"unknown table {table!r}; choose from {TABLES}")


def to_jsonl(records: Sequence[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)


def to_csv(records: Sequence[dict]) -> str:
    """One column per key (union over rows, first-seen order); nested values as JSON text."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns)
    w.writeheader()
    for r in records:
        w.writerow({k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in r.items()})
    return buf.getvalue()


def lamp_predictions(generations: Sequence[dict], task: str, method: str) -> dict:
    """LaMP's predictions file for one method: {"task", "golds": [{"id", "output"}]}, id = the generation's
    question id when it has one (eval, Explore), else its row id."""
    golds = [{"id": str(g["extra"].get("question_id", g["id"])), "output": g["output"]}
             for g in generations if g["method"] == method]
    return {"task": task, "golds": golds}


def write(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def export_table(store: Store, table: str, fmt: str, folder: str | Path) -> tuple[Path, int]:
    """Writes `table` as folder/<table>.<fmt>; returns the path and the number of records."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {FORMATS}")
    records = rows(store, table)
    text = to_jsonl(records) if fmt == "jsonl" else to_csv(records)
    return write(Path(folder) / f"{table}.{fmt}", text), len(records)


def export_predictions(store: Store, task: str, method: str, folder: str | Path) -> Path:
    preds = lamp_predictions(list(reversed(store.generations(method=method))), task, method)
    return write(Path(folder) / f"predictions_{method}.json", json.dumps(preds, indent=1, ensure_ascii=False))
