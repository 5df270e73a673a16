"""Paths of the seed recipes and the numbers the seed page publishes (shared by the recipe tests)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEED_DIR = REPO / "recipes" / "qwen3.5-122b-a10b" / "h200"
SEED_PAGE = REPO.parent / "shared" / "seeds" / "000_3f17f510fd0702dc.txt"

# The seed page's leaderboard and recipe cards (what the page prints, not what our code computes).
PUBLISHED = {
    "attune-tp1-pp4-ep8-rc2": {"rank": 1, "tps": "2,451.4", "usd": "$0.90", "mfu_pct": "13.4%"},
    "attune-tp1-pp4-ep8": {"rank": 2, "tps": "2,366.7", "usd": "$0.93", "mfu_pct": "12.9%"},
    "attune-tp1-pp4-ep8-flex": {"rank": 3, "tps": "2,289.7", "usd": "$0.96", "mfu_pct": "12.5%"},
}
SEED_NAMES = list(PUBLISHED)
