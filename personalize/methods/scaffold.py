"""The lines of a prompt that are no one's writing (issue 36): the task's instruction and the framing the methods
put around what they add (RAG's header, PAG's profile line). An output that repeats one echoes its prompt instead
of answering it: metrics.echoes counts such outputs, and the rows of the methods whose prompts carry framing stop
a row that starts one (generation.EchoStop, DecodeRow.scaffold)."""

from __future__ import annotations

from personalize.data import Task

HEADER = "Texts this user wrote before (input → output):"  # RAG's (and PAG's) retrieved items follow it
PROFILE_PREFIX = "About this author:"  # PAG's summary line


def scaffold_lines(task: Task) -> tuple[str, ...]:
    """The instruction's lines and every method's framing lines, for prompts of `task`."""
    instruction = tuple(line.strip() for line in task.fixed_start.splitlines() if line.strip())
    return (*instruction, HEADER, PROFILE_PREFIX)
