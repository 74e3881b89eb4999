"""The scheduler's window: requests that keep arriving join one batch, up to its cap."""

import time
from types import SimpleNamespace

import pytest

from personalize.serving import scheduler
from personalize.serving.scheduler import DecodeScheduler, SchedulerConfig


@pytest.fixture(autouse=True)
def echo(monkeypatch):  # a runner that decodes each row as itself, instantly
    monkeypatch.setattr(scheduler, "decode_rows", lambda model, tok, rows, on_step=None: list(rows))


def batches_of(cfg: SchedulerConfig, gaps_s: list[float]) -> list[int]:
    """Requests submitted with these gaps between them; the requests of each batch decoded."""
    s = DecodeScheduler(SimpleNamespace(model=None, tok=None), cfg=cfg)
    try:
        futures = []
        for i, gap in enumerate([0.0, *gaps_s]):
            time.sleep(gap)
            futures.append(s.submit(lambda i=i: [i]))
        assert [f.result(timeout=30) for f in futures] == [[i] for i in range(len(futures))]
        return [b["requests"] for b in s.batches]
    finally:
        s.close()


def test_requests_arriving_one_after_another_share_a_batch():
    """Each comes within the window of the one before: one batch, though the last came after the window
    measured from the first (8 Compares sent together reach the scheduler over ~70 ms)."""
    assert batches_of(SchedulerConfig(window_ms=500, max_wait_ms=5000), [0.05] * 14) == [15]


def test_a_batch_waits_no_longer_than_its_cap():
    sizes = batches_of(SchedulerConfig(window_ms=500, max_wait_ms=600), [0.1] * 14)
    assert len(sizes) >= 2 and sum(sizes) == 15 and sizes[0] <= 8


def test_the_window_settings_are_checked():
    with pytest.raises(ValueError, match="max_wait_ms"):
        SchedulerConfig(window_ms=300, max_wait_ms=100)
