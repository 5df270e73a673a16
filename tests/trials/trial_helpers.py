"""Helpers for the backend tests."""

from __future__ import annotations

import time

from autotune.trials.spec import TrialResult


def wait_result(backend, handle, limit: float = 90.0, poll_s: float = 0.2) -> TrialResult:
    """Poll until the trial finishes; fail the test if it takes longer than `limit` seconds."""
    deadline = time.monotonic() + limit
    while (res := backend.poll(handle)) is None:
        assert time.monotonic() < deadline, "the trial did not finish"
        time.sleep(poll_s)
    return res
