"""The style key: a person's fitted style as one copyable line of text (≤ 4 KiB) that they own.

It holds the parameters CARD decodes with (λ, the token bias, whether the style
beat the cluster model), the person's cluster for every K and the artifacts id it
belongs to: nothing of the history itself. A style fitted over the person's own adapter
(a cluster of one, own.py) says so (`own`), but the adapter stays out: it is up to a
megabyte and trained on their writing; an import decodes over their cluster until a Save
of their history (or Fit's *Train my own adapter*) retrains it. The kNN memory and the openings' form bias
are left out on purpose: the memory's keys are states of the person's own sentences and
its values their words, and the form bias lists the first words of their texts, i.e. data
derived from the history (a fit from the history rebuilds both).

Format: `card-style-1:` + base64url(zlib(safetensors)), the safetensors metadata holding
the JSON header. Bias ids are stored as uint16 when the vocabulary allows, the bias in
float16 (as the store keeps it) and λ in float32, so an import decodes exactly as the
export did, bar the memory and the form bias.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass, field

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as np_load, save as np_save

from personalize.methods.card.style import UserStyle

PREFIX = "card-style-1:"
MAX_KEY = 4096  # characters: fits a chat message, a form field, a QR code


class StyleKeyError(ValueError):
    """Not a style key, a damaged one, or one made for other artifacts."""


@dataclass
class StyleKey:
    user: str
    artifacts: str
    task: str
    model_id: str
    lam: np.ndarray
    bias_ids: np.ndarray
    bias: np.ndarray
    helps: bool | None
    clusters: dict[int, dict] = field(default_factory=dict)  # K -> {"cluster", "distances"}
    source: str = "history"  # what made this version (history fit, votes, import)
    note: str = ""
    created: str = ""
    trimmed: int = 0  # bias entries left out to fit MAX_KEY (the smallest |b|)
    # the style was fitted over its person's own adapter (a cluster of one): a key cannot carry the adapter (up to a
    # megabyte, and made of their writing), so an import retrains it from the history saved with it
    own: bool = False

    @property
    def style(self) -> UserStyle:
        return UserStyle(self.lam.astype(np.float32), self.bias_ids.astype(np.int64), self.bias.astype(np.float32),
                         helps=self.helps)


def _pack(k: StyleKey, n_bias: int) -> str:
    order = np.argsort(-np.abs(k.bias), kind="stable")[:n_bias]
    ids, vals = k.bias_ids[order], k.bias[order]
    dtype = np.uint16 if (len(ids) == 0 or ids.max() < 2 ** 16) else np.uint32
    header = {"user": k.user, "artifacts": k.artifacts, "task": k.task, "model_id": k.model_id, "helps": k.helps,
              "clusters": {str(c): v for c, v in k.clusters.items()}, "source": k.source, "note": k.note,
              "created": k.created, "trimmed": k.trimmed + len(k.bias) - len(ids), "own": k.own}
    raw = np_save({"lam": np.asarray(k.lam, "<f4"), "bias_ids": ids.astype(dtype), "bias": vals.astype(np.float16)},
                  metadata={"key": json.dumps(header, separators=(",", ":"))})
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def encode(k: StyleKey) -> str:
    """The key as text; when the whole bias does not fit in MAX_KEY characters, its smallest entries go."""
    n = len(k.bias)
    text = _pack(k, n)
    while len(text) > MAX_KEY and n > 0:
        n = int(n * 0.9)
        text = _pack(k, n)
    if len(text) > MAX_KEY:
        raise StyleKeyError(f"λ alone needs {len(text)} characters, over the {MAX_KEY} a style key may have")
    return text


def decode(text: str) -> StyleKey:
    text = (text or "").strip()
    if not text.startswith(PREFIX):
        raise StyleKeyError(f"not a style key: it should start with {PREFIX!r} (copy the whole key)")
    if len(text) > MAX_KEY:
        raise StyleKeyError(f"a style key has at most {MAX_KEY} characters; this one has {len(text)}")
    body = text[len(PREFIX):]
    try:
        raw = zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)), bufsize=1 << 16)
        t = np_load(raw)
        header = json.loads(_metadata(raw)["key"])
        clusters = {int(c): {"cluster": int(v["cluster"]), "distances": [float(x) for x in v["distances"]]}
                    for c, v in header["clusters"].items()}
        return StyleKey(str(header["user"]), str(header["artifacts"]), str(header["task"]), str(header["model_id"]),
                        t["lam"].astype(np.float32), t["bias_ids"].astype(np.int64), t["bias"].astype(np.float32),
                        header.get("helps"), clusters, str(header.get("source", "import")), str(header.get("note", "")),
                        str(header.get("created", "")), int(header.get("trimmed", 0)), bool(header.get("own", False)))
    except (binascii.Error, zlib.error, SafetensorError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise StyleKeyError(f"this style key is damaged ({type(e).__name__}): copy it again, whole") from None


def _metadata(raw: bytes) -> dict:
    """The safetensors header's __metadata__ (safetensors.numpy.load does not return it)."""
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8: 8 + n])["__metadata__"]
