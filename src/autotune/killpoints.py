"""Named points where a test can kill the process (SIGKILL), to prove crash consistency at exact places.

`AUTOTUNE_KILL_AT=name` kills the process the first time it reaches `kill_point("name")`;
`AUTOTUNE_KILL_AT=name:N` the N-th time. Only tests set the variable; unset, a point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["kill_point", "POINTS"]

# every point, in the order a trial passes them (the kill tests loop over this)
POINTS = ("enqueued", "asked", "spec_written", "submitted", "result_on_disk", "told", "outputs_staged",
          "outputs_swapped")
_hits: dict[str, int] = {}


def kill_point(name: str) -> None:
    want = os.environ.get("AUTOTUNE_KILL_AT")
    if not want:
        return
    point, _, nth = want.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
