"""The residual model's features: one integer column per searched dimension (layout/dimensions.py) and
three interactions, each a group whose one-hot weights share one prior width. Shared by the residual
model (residual.py) and the derivation of its prior widths (priors.py). Pure numpy."""

from __future__ import annotations

import numpy as np

from ..layout import LayoutTable
from ..layout.dimensions import DIMENSIONS

__all__ = ["INTERACTIONS", "feature_groups"]

INTERACTIONS = ("ep_x_nodes", "pp_x_recompute", "tp_x_hidden")


def feature_groups(t: LayoutTable, hidden: int | None = None, gpus_per_node: int = 8) -> list[tuple[str, np.ndarray]]:
    """(group name, integer column) per layout feature, then the interactions. A group's one-hot weights
    share one prior width. `hidden` (the model's hidden size) and `gpus_per_node` place a layout among
    models and clusters; within one search they are constants, so an interaction there widens the prior
    of the feature it pairs (EP on a layout whose expert group crosses nodes is less certain)."""
    out = []
    for d in DIMENSIONS:
        for j, col in enumerate(d.features(t)):
            out.append((d.name if j == 0 else f"{d.name}_{j}", np.asarray(col, dtype=np.int64)))
    span = np.ceil(t.ep * t.etp / gpus_per_node).astype(np.int64)  # nodes one expert group spans
    rc = t.rc_gran * 100 + t.rc_layers
    out.append(("ep_x_nodes", t.ep * 1000 + span))
    out.append(("pp_x_recompute", t.pp * 100_000 + rc))
    out.append(("tp_x_hidden", t.tp * 100_000 + (int(hidden or 0) // 1024)))
    return out
