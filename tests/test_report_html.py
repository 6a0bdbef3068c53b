"""`tuneforge report` and `tune --report`: one self-contained HTML file, rendered by a real headless Chromium.

The records are a real tuning (`tuneforge tune matmul ... --report`) plus made-up ones for what a short test
cannot measure (several GEMM shapes, a searched selection, one selection measured on two dates), put in the
record database as any process would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the report draws with Plotly (the report extra)")

from tuneforge.store.record import Record
from tuneforge.store.records import RecordDB

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name)) is not None), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium)")


def made_up_records(now: float) -> list[Record]:
    """GEMM selections on three shapes (two kernels with parameters and the library call each), a searched
    selection, and one selection measured again a week later on another system."""
    records = []
    for i, (m, n, k) in enumerate([(64, 64, 64), (256, 256, 256), (1024, 1024, 1024)]):
        inputs = f"float32[{m}x{k}], float32[{k}x{n}], 1.0, 0.0, None, float32[{m}x{n}]"
        scale = 2.0 * m * n * k / 1e9
        for name, ms, params in (("numpy_matmul", scale * 1.1, {}),
                                 ("kernel_a", scale, {"MR": 6, "NR": 16, "threads": 2}),
                                 ("kernel_b", scale * 1.6, {"MR": 4, "NR": 24, "threads": 1}),
                                 ("kernel_c", scale * 1.3, {"MR": 6, "NR": 24, "threads": 1})):
            records.append(Record(key=f"gemm-key-{i}", choice=f"c-{name}", op="gemm", choice_name=name, status="ok",
                                  median_ms=ms, p20_ms=ms * 0.95, p80_ms=ms * 1.08, min_ms=ms * 0.9, count=10,
                                  params=params, inputs=inputs, system="sys-a", created=now - 100 + i))
        records.append(Record(key=f"gemm-key-{i}", choice="c-broken", op="gemm", choice_name="kernel_broken",
                              status="compile_error", error="kernel.cpp:12: error: 'vfmadd' was not declared\n"
                              "  12 |   vfmadd(a, b);\nsecond line\nthird\nfourth (not shown)",
                              params={"MR": 8, "NR": 8, "threads": 1}, inputs=inputs, system="sys-a", created=now))
    for step, ms in enumerate([5.0, 4.0, 4.5, 3.0, 3.2, 2.9]):
        records.append(Record(key="searched-key", choice=f"s{step}", op="gemm_search", choice_name=f"cfg{step}",
                              status="ok", median_ms=ms, params={"KC": 64 * (step + 1)}, inputs="float32[96x96]",
                              system="sys-a", created=now - 50 + step,
                              info={"search": "random/15%"} if ms == 2.9 else {}))
    for system, when, ms in (("sys-old", now - 7 * 86400, 2.0), ("sys-new", now, 2.6)):
        records.append(Record(key=f"drift-{system}", choice="d", op="drift", choice_name="kernel_x", status="ok",
                              median_ms=ms, inputs="float64[128x128]", system=system, created=when))
    return records


def render_in_chromium(page: Path, shot: Path, profile: Path) -> tuple[str, str]:
    """(the DOM once the page's scripts ran, Chromium's log with the page's console messages); a screenshot."""
    assert CHROMIUM is not None
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--user-data-dir={profile}", "--window-size=1400,4000", "--virtual-time-budget=10000",
              "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    screenshot = subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True,
                                timeout=180)
    assert screenshot.returncode == 0, screenshot.stderr[-2000:]
    return dom.stdout, dom.stderr + screenshot.stderr


@needs_browser
def test_the_report_renders_every_section_with_data_and_no_console_error(tmp_path: Path) -> None:
    env = {**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path / "cache"), "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.003"}
    tuned = subprocess.run([sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "24x24x24", "--report",
                            str(tmp_path / "first.html")], capture_output=True, text=True, env=env, timeout=300)
    assert tuned.returncode == 0, tuned.stderr
    assert f"report: {tmp_path / 'first.html'}" in tuned.stdout
    with RecordDB(tmp_path / "cache" / "records.db") as db:
        db.put_many(made_up_records(time.time()))
    made = subprocess.run([sys.executable, "-m", "tuneforge", "report", "-o", str(tmp_path / "report.html")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    page = tmp_path / "report.html"
    text = page.read_text()
    assert "https://" not in text.split("<body>", 1)[1].split("<script")[0]  # nothing fetched from the network
    dom, log = render_in_chromium(page, tmp_path / "report.png", tmp_path / "profile")

    console = [line for line in log.splitlines() if ":CONSOLE" in line]  # errors, warnings, anything printed
    assert console == [], console
    # Every figure was drawn: a plot's SVG, with its traces' marks in it.
    figures = dom.count('class="main-svg"')
    assert figures >= 2 * 10, figures  # plotly draws two SVG layers a figure; 10+ figures here
    assert dom.count('class="point"') >= 4 * 4  # the bars of the GEMM selections (with error bars)
    assert "class=\"hm\"" in dom or "<image" in dom  # the parameters' heat map
    assert dom.count('class="js-line"') >= 4  # lines: throughput (pick, library), history, convergence
    for heading in ("Selections", "Parameters", "Across shapes", "History", "Search convergence"):
        assert f"<h2>{heading}</h2>" in dom
    assert "compile_error" in dom and "vfmadd" in dom and "fourth (not shown)" not in dom
    assert "matmul(float32[24x24], float32[24x24]" in dom  # the real tuning's selection
    shot = (tmp_path / "report.png").read_bytes()
    assert shot.startswith(b"\x89PNG") and len(shot) > 50_000  # a page of plots, not a blank one


def test_report_without_records_or_plotly_says_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    empty = subprocess.run([sys.executable, "-m", "tuneforge", "report", "-o", str(tmp_path / "r.html")],
                           capture_output=True, text=True, env=env, timeout=120)
    assert empty.returncode == 1 and "no tuning records in this cache" in empty.stderr, empty.stderr
    assert not (tmp_path / "r.html").exists()
    with RecordDB(tmp_path / "cache" / "records.db") as db:
        db.put_many(made_up_records(time.time()))
    shadow = tmp_path / "shadow" / "plotly"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no plotly here')\n")
    no_plotly = subprocess.run([sys.executable, "-m", "tuneforge", "report", "-o", str(tmp_path / "r.html")],
                               capture_output=True, text=True, timeout=120,
                               env={**env, "PYTHONPATH": str(shadow.parent)})
    assert no_plotly.returncode == 1 and "pip install 'tuneforge[report]'" in no_plotly.stderr, no_plotly.stderr
    assert "Traceback" not in no_plotly.stderr and not (tmp_path / "r.html").exists()
