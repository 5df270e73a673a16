"""Render time of the offline HTML report of a 200-trial study (target: under 2 s), by phase: reading the
study folder (study.db, 400 trial files, recipes), rendering the page, writing it; and the whole
`autotune dashboard --html` command in a fresh process (imports included).

    python bench/report_speed.py [--study runs/<study>] [--repeats 3]

Without --study it first makes a 200-trial simulator study (random planner) in a temporary folder; that
takes minutes and is not timed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0


def make_study(runs: Path, trials: int) -> Path:
    import contextlib
    import io

    from autotune.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):  # the search's --json summary: not this table's business
        rc = main(["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--trials",
                   str(trials), "--planner", "random", "--runs-dir", str(runs), "--study", "bench", "--json"])
    if rc != 0:
        raise SystemExit(f"making the study failed ({rc})")
    return runs / "bench"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", type=Path, help="An existing study folder (default: make a 200-trial one).")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        study = args.study or make_study(Path(tmp), args.trials)
        out = Path(tmp) / "report.html"
        from autotune.report import load_study, render_html, write_html

        rows = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            view = load_study(study)
            t1 = time.perf_counter()
            html = render_html(view)
            t2 = time.perf_counter()
            write_html(view, out)
            t3 = time.perf_counter()
            rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autotune.cli.main", "dashboard", str(study), "--html", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        cli = time.perf_counter() - t0
        best = min(rows, key=lambda r: r[3])
        med = sorted(rows, key=lambda r: r[3])[len(rows) // 2]
        print(f"study {study} ({len(view.trials)} trials), report {len(html) / 1024:,.0f} KiB")
        print(f"{'phase':<26} {'best s':>8} {'median s':>9}")
        for i, name in enumerate(("load the study folder", "render the HTML", "write it (atomic)", "report total")):
            print(f"{name:<26} {best[i]:8.3f} {med[i]:9.3f}")
        print(f"{'autotune dashboard --html':<26} {cli:8.3f} {'':>9}  (fresh process, imports included)")
        ok = med[3] < TARGET_S
        print(f"target: report total under {TARGET_S:g} s: {'met' if ok else 'MISSED'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
