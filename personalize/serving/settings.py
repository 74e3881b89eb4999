"""DecodingSettings: what every method's decoding takes (steering strength, candidates, length, repetition control,
sampling); settings only, so that the command line reads them without the model code."""

from __future__ import annotations

from dataclasses import dataclass

from personalize.flags import setting


@dataclass(frozen=True)
class DecodingSettings:
    alpha: float = setting(1.0, "steering strength α: 1 the tokens head's trained rule, 0 the cluster model")
    top_k: int = setting(50, "candidates re-ranked per step")
    max_new_tokens: int = setting(32, "max new tokens")
    min_new_tokens: int = 0  # > 0 only to time a fixed number of steps (bench)
    # every method, generated tokens only (the prompt is ignored); chosen on validation users (build, tune)
    repetition_penalty: float = 1.0
    no_repeat_ngram: int = 4  # no n-gram of this size twice in the output (0 = off): stops loops
    # no n-gram of up to this many tokens a third time back to back (0 = off): loops that the n-gram rule, tuned off
    # where a text repeats its own forms (changelog lines), let through; 12 covers "2023-02-24 "
    loop_period: int = 12
    do_sample: bool = False
    temperature: float = 1.0
    standardize: bool = False  # set by the engine for heads whose Δ has no logit scale (pairs, hard_pairs)

    def __post_init__(self):
        if self.alpha < 0 or self.top_k < 1 or self.max_new_tokens < 1:
            raise ValueError("alpha must be >= 0, top_k >= 1 and max_new_tokens >= 1")
        if self.repetition_penalty <= 0 or self.temperature <= 0 or self.no_repeat_ngram < 0 or self.loop_period < 0:
            raise ValueError("repetition_penalty and temperature must be > 0, no_repeat_ngram and loop_period >= 0")
