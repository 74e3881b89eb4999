"""Every wait says what it waits for, its place in the queue and a time from its own start (issue 59, item 3): a
first use queued behind another, a running one with its steps, an own adapter that queued for minutes (its time
left measured from its own steps, never from its queueing), another login's person never named, and Fit's
decoded check saying at once that it waits for the model."""

from __future__ import annotations

import threading
import time

from personalize.schema import acting_as
from personalize.studio.first_use_jobs import OWN, in_line, job_line, job_what, own_line, wait_line
from tests.studio.test_access import logins_studio


def job(user, method, state="queued", seq=1, queued=0.0, started=None, done=0, total=0, **more):
    return {"user": user, "method": method, "state": state, "done": done, "total": total, "error": None,
            "queued": queued, "started": started, "seq": seq, **more}


def test_a_queued_job_says_what_it_waits_for_its_place_and_its_own_time():
    oppu = job("ben", "oppu", "running", seq=1, queued=0.0, started=5.0, done=3, total=20)
    exact = job("ana", "exact", seq=2, queued=10.0)
    own = job("ana", OWN, seq=3, queued=40.0)
    assert in_line([oppu, exact, own], exact) == [oppu, own]  # an own adapter goes before a method's first use
    line = job_line(exact, [(oppu, True), (own, True)])
    assert line.startswith("first use, EXACT's attribute search: queued for") and "3rd in line" in line
    line = wait_line(exact, [(oppu, True), (own, True)], job_what(exact, True), now=70.0)
    assert line == ("EXACT's attribute search for ana: queued for 60 s, 3rd in line, behind OPPU's training for ben, "
                    "ana's own adapter")
    assert "0/?" not in own_line(own, [(oppu, True)]) and "queued for" in own_line(own, [(oppu, True)])


def test_a_running_job_says_its_steps_and_a_time_left_from_its_own_steps_only():
    """The walk's own adapter queued 8-11 minutes, then said "about 1160 s left" (its queueing taken for its
    training): the time left is measured from its first step."""
    own = job("ana", OWN, "running", queued=0.0, started=600.0, done=4, total=20, first_step=(610.0, 0))
    line = wait_line(own, [], "your own adapter", now=630.0)
    assert line == "your own adapter: running for 30 s, 4/20 steps, about 80 s left"
    fresh = job("ana", OWN, "running", queued=0.0, started=600.0)
    assert wait_line(fresh, [], "your own adapter", now=601.0) == "your own adapter: running for 1 s"


def test_another_logins_person_is_not_named(tiny_artifacts, tmp_path):
    studio = logins_studio(tiny_artifacts, tmp_path)
    try:
        task, jobs, gate = studio.runtime.task.name, studio.first_use_jobs, threading.Event()
        with acting_as("ben"):
            studio.save_from("ben-log", "\n".join(f"ben logs the {w} numbers" for w in "abcdef"), None, task)
            first = jobs._submit("ben-log", "oppu", lambda j, progress: gate.wait(30))
        with acting_as("ana"):
            studio.save_from("ana-notes", "\n".join(f"ana writes of the {w} at dawn" for w in "abcdef"), None, task)
            mine = jobs._submit("ana-notes", "exact", lambda j, progress: None)
            deadline = time.time() + 30
            while first["state"] != "running" and time.time() < deadline:
                time.sleep(0.05)
            line = jobs.line(mine)
            assert "2nd in line, behind another person's OPPU training" in line and "ben" not in line, line
            check = studio.explorer.check_line(time.time() - 3, None)
            assert "queued for the model for 3 s" in check and "another person's OPPU training" in check
            assert "ben" not in check
        with acting_as("ben"):
            assert "behind" not in jobs.line(first) and "running for" in jobs.line(first)
        gate.set()
        while mine["state"] in ("queued", "running") and time.time() < deadline:
            time.sleep(0.05)
    finally:
        gate.set()
        studio.runtime.store.close()
