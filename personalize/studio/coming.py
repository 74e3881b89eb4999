"""The parts of the served build still being built (issue 58): the first start serves the demo as soon as the
cluster model can decode, while its build trains the head (card's part), then runs card's check on the validation
people (the harm guard) and trains P2P's hypernetwork. Until each arrives, a column of a method not served yet says
when it comes, what needs the head (Fit, Why, Explore, a vote's refit) says it waits for it, and Fit and Compare say
that card's check is running while card decodes with the planned settings. The build's own progress hook is the only
source of the figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from personalize.catalog import STEERED

# (the build's stage in its own words, its share done in 0..1, seconds it has run)
Progress = Callable[[], tuple[str, float, float]]


@dataclass(frozen=True)
class Coming:
    """What the served build does not serve yet, and the build's progress. Coming() is a whole build: nothing."""

    methods: frozenset[str] = frozenset()
    progress: Progress | None = None
    checking: bool = False  # card's check (the guard) has not decided
    head: bool = False  # the head is still training: card and whatever fits a style wait for it
    head_share: float = 1.0  # the build's share done when the head is (build.STAGE_SHARES)
    failed: str = ""  # the build stopped with this error: what it had not made yet will not come

    @classmethod
    def waiting(cls, head: bool, progress: Progress | None = None, head_share: float = 1.0,
                failed: str = "") -> "Coming":
        """What a build still running has not made: card and its variants while its `head` is still to come, card's
        check and P2P until its end. `failed`: the build stopped with this error, so none of it will come."""
        methods = set(STEERED) | {"p2p"} if head else {"p2p"}
        return cls(frozenset(methods), progress, checking=not failed, head=head, head_share=head_share,
                   failed=failed)

    @property
    def pending(self) -> bool:
        return bool(self.methods or self.checking or self.head) and not self.failed

    def eta_s(self, share: float = 1.0) -> float | None:
        """Seconds until the build's share reaches `share`, from its pace so far (None until there is enough of it
        to say)."""
        if self.progress is None:
            return None
        _, done, spent = self.progress()
        return max(0.0, spent * (share - done) / done) if done >= 0.05 else None

    @staticmethod
    def _about(eta: float | None) -> str:
        return f"in about {max(5, round(eta / 5) * 5):.0f} s" if eta is not None else "when the build gets there"

    def head_in(self) -> str:
        return self._about(self.eta_s(self.head_share))

    def column(self, method: str) -> str | None:
        """A column's line for a method not served yet, else None."""
        if method not in self.methods:
            return None
        if self.failed:
            return f"{method} is not served: the first start's build failed ({self.failed}); the next start builds it again."
        if self.head and method in STEERED:
            return (f"{method} is coming {self.head_in()}: the first start's build trains the head that scores your "
                    "style now. The other columns do not wait; try again then.")
        return (f"{method} is coming {self._about(self.eta_s())}: the first start's build trains it after card's "
                "check on its validation people. The other columns do not wait; try again then.")

    def head_line(self, what: str) -> str | None:
        """Why `what` (Fit, Why, Explore, a vote's refit) cannot run yet, else None."""
        if not self.head:
            return None
        if self.failed:
            return (f"{what} needs the head, which the first start's build did not make ({self.failed}); the next start "
                    "builds it again.")
        return (f"{what} waits for the head, the scorer of your style that the first start's build trains now: ready "
                f"{self.head_in()}. Save, My cluster and every Compare column but card's and P2P's serve meanwhile.")

    def check_line(self) -> str | None:
        """Fit's and Compare's line while card's check runs, with where it stands, else None."""
        if not self.checking or self.head:
            return None
        stage = self.progress()[0] if self.progress else ""
        where = stage[stage.find("(") + 1: stage.rfind(")")] if "(" in stage and stage.startswith("decoding") else \
            "starting"
        return (f"card's check on this build's validation people: running ({where}); until it decides, card decodes "
                f"with the planned settings, and {self._about(self.eta_s())} the studio takes its verdict")

    def eta_line(self) -> str:
        """"done in about N s" (or "done when the build gets there")."""
        return f"done {self._about(self.eta_s())}"
