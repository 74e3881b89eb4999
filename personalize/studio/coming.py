"""The parts of the served build still being built (issue 58): the first start serves the demo once card can decode,
while its build runs card's check on the validation people (the harm guard) and trains P2P's hypernetwork. Until
then a column of a method not served yet says when it comes, and Fit and Compare say that card's check is running;
card decodes with the planned settings. The build's own progress hook is the only source of the figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# (the build's stage in its own words, its share done in 0..1, seconds it has run)
Progress = Callable[[], tuple[str, float, float]]


@dataclass(frozen=True)
class Coming:
    """What the served build does not serve yet, and the build's progress. Coming() is a whole build: nothing."""

    methods: frozenset[str] = frozenset()
    progress: Progress | None = None
    checking: bool = False  # card's check (the guard) has not decided

    def eta_s(self) -> float | None:
        """The build's time left, from its share done so far (None until there is enough of it to say)."""
        if self.progress is None:
            return None
        _, share, spent = self.progress()
        return spent * (1 - share) / share if share >= 0.05 else None

    def _in_about(self) -> str:
        eta = self.eta_s()
        return f"in about {max(5, round(eta / 5) * 5):.0f} s" if eta is not None else "when the build is done"

    def eta_line(self) -> str:
        """"done in about N s" (or "done when the build is")."""
        eta = self.eta_s()
        return f"done in about {max(5, round(eta / 5) * 5):.0f} s" if eta is not None else "done when the build is"

    def column(self, method: str) -> str | None:
        """A column's line for a method not served yet, else None."""
        if method not in self.methods:
            return None
        return (f"{method} is coming {self._in_about()}: the first start's build trains it after card's check on "
                "its validation people. The other columns do not wait; Compare again then.")

    def check_line(self) -> str | None:
        """Fit's and Compare's line while card's check runs, with where it stands, else None."""
        if not self.checking:
            return None
        stage = self.progress()[0] if self.progress else ""
        where = stage[stage.find("(") + 1: stage.rfind(")")] if "(" in stage and stage.startswith("decoding") else \
            "starting"
        return (f"card's check on this build's validation people: running ({where}); until it decides, card decodes "
                f"with the planned settings, and {self._in_about()} the studio takes its verdict")
