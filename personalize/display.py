"""How text from people and models is shown: always as the text itself, never as markup.

History items, user names, prompts, every method's output, the population's texts, token pieces and error
messages that quote any of them can hold `<script>`, `<img onerror=...>`, `**`, `|` or `$$`. The app puts
such text into Markdown (and Plotly labels) only through these functions, so it is displayed literally and
never executed or rendered. Components that show plain text (Textbox, Dataframe, Dropdown choices,
HighlightedText) need nothing.
"""

from __future__ import annotations

import html
import re
import string

# HTML's special characters become entities (escaped before Markdown sees them: a backslash would keep
# `&lt;` from being decoded); every other ASCII punctuation character is backslash-escaped, which CommonMark
# (and marked, Gradio's renderer) allows for all of them, so no emphasis, link, heading, list, table, code span,
# autolink or HTML block can start.
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"}
_ACTIVE = re.compile("[" + re.escape(string.punctuation) + "]")
# A line's indentation as character references: CommonMark never reads them as structure, so an indented line after
# a blank one (a diff's context, an output's list) stays text instead of becoming a code block that shows the escapes.
_INDENT = re.compile(r"^[ \t]+", re.MULTILINE)
_SPACES = {" ": "&#32;", "\t": "&#9;"}


def _one(m: re.Match) -> str:
    c = m.group(0)
    return _ENTITIES.get(c) or "\\" + c


def md(text: object, limit: int | None = None) -> str:
    """`text` for embedding in Markdown, so that it shows exactly as written. Line breaks stay line breaks
    (a paragraph break stays one); `limit` keeps the first `limit` characters (cut before escaping, so no
    escape is ever split) and marks the cut with "…"."""
    s = "" if text is None else str(text)
    s = s.replace("\r\n", "\n").replace("\r", "\n")
    if limit is not None and len(s) > limit:
        s = s[:limit] + "…"
    s = _INDENT.sub(lambda m: "".join(_SPACES[c] for c in m.group(0)), _ACTIVE.sub(_one, s))
    return s.replace("\n", "  \n")  # two spaces: a hard line break, not a joined line


def plot_text(text: object) -> str:
    """`text` for a Plotly label (trace name, point or hover text, axis category): Plotly reads a few HTML
    tags (<b>, <br>, <a href>) and decodes entities, so the HTML specials become entities."""
    return html.escape("" if text is None else str(text), quote=False)


def md_quoting(message: str, raw: object) -> str:
    """A Markdown message built elsewhere (the library's status lines) that quotes the value `raw` unescaped:
    each occurrence of it is replaced by its escaped form. A stop-gap for messages the app cannot build
    itself; a value that needs no escaping leaves the message as it is."""
    r = "" if raw is None else str(raw)
    return message.replace(r, md(r)) if r and md(r) != r else message
