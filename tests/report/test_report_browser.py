"""The HTML report in a real browser: headless Chromium (Debian's `chromium`), network blocked, opens the file;
a probe script checks that every plot laid out with marks in it, that table sorting works, and that no
script error or console error happened; a screenshot is saved under the test's tmp folder."""

import json
import re
import shutil
import subprocess

import pytest

from autotune.report import load_study, write_html

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt-get install chromium)")]

PLOTS = {"best-vs-trials", "best-vs-gpu-hours", "predicted-vs-measured", "memory-vs-throughput", "step-breakdown",
         "map-tp-pp", "map-ep-recompute", "funnel"}

# installed first in <head>: collects uncaught errors and console.error calls
CATCH = """<script>window.__errors=[];window.addEventListener('error',function(e){window.__errors.push('error: '+e.message)});
var _ce=console.error;console.error=function(){window.__errors.push('console: '+[].join.call(arguments,' '));_ce.apply(console,arguments)};
</script>"""
# appended after the page's own script: measures what the browser actually laid out
PROBE = """<script>(function(){var out={plots:[],sorted:null};
document.querySelectorAll('svg.plot').forEach(function(s){var b=s.getBoundingClientRect();
  out.plots.push({name:s.dataset.plot,w:b.width,h:b.height,marks:s.querySelectorAll('.mark').length,
  empty:s.classList.contains('empty')});});
var tb=document.getElementById('trials');var th=tb.tHead.rows[0].cells[1];th.click();
var first=[];for(var i=0;i<3;i++){first.push(+tb.tBodies[0].rows[i].cells[1].dataset.v);}
th.click();out.sorted={asc:first,desc_first:+tb.tBodies[0].rows[0].cells[1].dataset.v};
out.errors=window.__errors;var pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify(out);
document.body.appendChild(pre);})();</script>"""

OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0"]


def _chromium(tmp_path, *args):
    return subprocess.run([shutil.which("chromium"), *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_renders_in_chromium_without_errors(sim_study, tmp_path):
    page = write_html(load_study(sim_study), tmp_path / "report.html")
    html = page.read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("<head>", "<head>" + CATCH, 1).replace("</body>", PROBE + "</body>", 1))
    run = _chromium(tmp_path, "--dump-dom", probe.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S)
    assert m, run.stdout[-1000:]
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert got["errors"] == []
    assert {p["name"] for p in got["plots"]} == PLOTS
    for p in got["plots"]:
        assert p["w"] > 100 and p["h"] > 60 and p["marks"] > 0 and not p["empty"], p
    n = len(load_study(sim_study).trials)
    assert got["sorted"]["asc"] == [0, 1, 2] and got["sorted"]["desc_first"] == n - 1
    console = [ln for ln in run.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == []
    shot = tmp_path / "report.png"
    run = _chromium(tmp_path, "--hide-scrollbars", "--window-size=1300,2600", f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000  # a drawn page, not a blank one
