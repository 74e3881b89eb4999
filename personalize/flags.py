"""Command-line flags made from settings dataclasses, as transformers' HfArgumentParser does: a field's default,
type and help (`setting(default, help)`, the help kept in the field's metadata) are its flag's, so each setting is
written once, beside its validation (the dataclass's __post_init__), and a flag can never disagree with it."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping

TYPES = {"int": int, "float": float, "str": str}


def setting(default: Any, help: str) -> Any:
    """A dataclass field with its help (a tuple default is kept as is: frozen settings)."""
    return dataclasses.field(default=default, metadata={"help": help})


def _parse_tuple(kind):
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}")
    return parse


def add_flags(p: argparse.ArgumentParser, cls, flags: Mapping[str, str]) -> None:
    """One flag per field of `cls` named in `flags` (field → "--flag"), with the field's default, type and help."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, flag in flags.items():
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kind = str(f.type)
        help_ = f.metadata.get("help", "")
        if kind == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_)
        elif kind.startswith("tuple["):
            item = TYPES[kind[len("tuple["):].split(",")[0].strip()]
            p.add_argument(flag, type=_parse_tuple(item), default=default,
                           help=f"{help_} (default {','.join(map(str, default))})")
        else:
            p.add_argument(flag, type=TYPES[kind], default=default, help=f"{help_} (default {default})".lstrip())


def add_overrides(p: argparse.ArgumentParser, cls, flags: Mapping[str, str]) -> None:
    """Flags that change a loaded build's settings (none given: the build's own), typed and told by the field."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, flag in flags.items():
        f = fields[name]
        p.add_argument(flag, type=TYPES[str(f.type)], default=None,
                       help=f"{f.metadata.get('help', '')} (default: the build's; {f.default} unless it chose another)")


def flag_values(a: argparse.Namespace, flags: Mapping[str, str]) -> dict[str, Any]:
    """The parsed values of `flags` (field → "--flag") by field name, for dataclasses.replace (which validates)."""
    return {name: getattr(a, flag.lstrip("-").replace("-", "_")) for name, flag in flags.items()}
