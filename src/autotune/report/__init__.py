"""The trial dashboard: a study folder read into a StudyView (study.py), rendered as one offline HTML file
(html.py with hand-written SVG from svg.py, plots.py, bars.py), a terminal summary (summary.py), the live view
of a running search (live.py) and the recipes leaderboard page in the seed's style (leaderboard.py).

Reads only what is on disk under runs/<study>/; imports neither torch nor ray.
"""

from __future__ import annotations

from .html import render_html, write_html
from .study import RecipeView, StudyView, TrialView, load_study, newest_study

__all__ = ["StudyView", "TrialView", "RecipeView", "load_study", "newest_study", "render_html", "write_html"]
