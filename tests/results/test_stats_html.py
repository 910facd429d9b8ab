"""`dphil-stats --format html`: one self-contained report page, checked as HTML and in Chromium.

The episodes are real: scripted grids played by `dphil-rollout` and scored by
`dphil-score` through pipes. The page's numbers are compared with the cell
and comparison records the same command writes as JSONL, its links are
resolved in a real headless browser (tests/support/browser.py), and with
DPHIL_SCREENSHOTS=DIR its screenshots are kept for the README.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dphil.results import report
from dphil.results.html_report import EpisodeSample, key_value
from tests.support.commands import command_path, keep_picture, run

MODELS = ("scripted:naive", "scripted:hierarchy", "scripted:random")
SIZES = (3, 5, 8)
EPISODES = 12
COMPARE = ("--compare", "model", "scripted:naive", "scripted:hierarchy")


class Page(HTMLParser):
    """What the tests look at: ids, in-page links, tags, table cells, external references."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.links: list[str] = []
        self.tags: dict[str, int] = {}
        self.classes: dict[str, int] = {}
        self.external: list[str] = []
        self.rows: list[list[str]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for c in (a.get("class") or "").split():
            self.classes[c] = self.classes.get(c, 0) + 1
        if a.get("id"):
            self.ids.append(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        for name in ("src", "href"):
            value = a.get(name) or ""
            if value and not value.startswith("#"):
                self.external.append(value)
        if tag == "link":
            self.external.append(str(a))
        if tag == "tr":
            self._row = []
        if tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def grid(path: Path, *extra: str) -> Path:
    """A real scripted grid, scored with the shaped reward, written through pipes."""
    models = [a for m in MODELS for a in ("-m", m)]
    rollout = subprocess.Popen(
        [command_path("dphil-rollout"), *models, "-n", ",".join(map(str, SIZES)), "--episodes", str(EPISODES), *extra],
        stdout=subprocess.PIPE,
    )
    with path.open("wb") as out:
        score = subprocess.run([command_path("dphil-score"), "--shaped"], stdin=rollout.stdout, stdout=out, timeout=120)
    assert rollout.wait(timeout=120) == 0 and score.returncode == 0
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stats-html")
    ep = grid(folder / "ep.jsonl")
    page = folder / "report.html"
    # Relative names, as a user types them: the page's header names "ep.jsonl".
    p = run(
        ["dphil-stats", ep.name, *COMPARE, "--format", "html", "-o", page.name, "--timelines", "2", "-q"], cwd=folder
    )
    assert p.returncode == 0, p.stderr
    records = run(["dphil-stats", str(ep), *COMPARE, "-q"])
    assert records.returncode == 0
    out = [json.loads(line) for line in records.stdout.splitlines()]
    cells = [r for r in out if r["kind"] == "cell"]
    comps = [r for r in out if r["kind"] == "comparison"]
    return {"folder": folder, "ep": ep, "page": page, "text": page.read_text(), "cells": cells, "comps": comps}


def test_the_page_holds_the_tables_of_the_records(made):
    page = Page(made["text"])
    header, rows = report.cell_rows(made["cells"], ["model", "n"])
    assert [*header, "timelines"] in page.rows
    for row in rows:
        assert [*row, "2 shown"] in page.rows
    comp_header, comp_rows = report.comparison_rows(made["comps"], ["model", "n"])
    assert len(comp_rows) == len(SIZES)
    assert comp_header in page.rows and all(r in page.rows for r in comp_rows)
    # The intervals are there, as the records have them.
    hierarchy_3 = next(c for c in made["cells"] if c["model"] == "scripted:hierarchy" and c["n"] == 3)
    assert report.with_ci(hierarchy_3["reward_mean"], hierarchy_3["reward_ci"]) in made["text"]


def test_the_page_is_self_contained_and_every_link_resolves(made):
    page = Page(made["text"])
    assert page.external == []
    assert "<script src" not in made["text"] and "@import" not in made["text"]
    assert len(set(page.ids)) == len(page.ids)
    internal = [h for h in page.links if h.startswith("#")]
    assert internal and all(h[1:] in page.ids for h in internal)
    cells = len(MODELS) * len(SIZES)
    # A link per cell from the table, and K timelines per cell, each with its own anchor.
    assert sum(1 for h in internal if re.fullmatch(r"#cell-\d+", h)) == cells
    assert page.classes["episode"] == 2 * cells
    assert page.classes["dphil-timeline"] == 2 * cells
    # The plots are inline SVG (text kept as text).
    assert "Mean reward (95% CI)" in made["text"] and "Deadlock rate (95% Wilson CI)" in made["text"]
    assert "The first 2 complete episodes of each cell" in made["text"]


def test_timelines_are_the_first_episodes_of_each_cell(made):
    episodes = [json.loads(line) for line in made["ep"].read_text().splitlines()]
    text = made["text"]
    for model in MODELS:
        for n in SIZES:
            mine = [e for e in episodes if e["model"] == model and e["n"] == n]
            first, third = mine[0]["episode_id"], mine[2]["episode_id"]
            assert f'data-episode="{first}"' in text
            assert f'data-episode="{third}"' not in text


def test_stdin_and_gzip_give_the_same_page(made):
    plain = made["text"].replace(made["ep"].name, "SOURCE")
    data = made["ep"].read_bytes()
    piped = run(["dphil-stats", "-", *COMPARE, "--format", "html", "--timelines", "2", "-q"], input=data)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.decode().replace("&lt;stdin&gt;", "SOURCE") == plain
    gz = made["folder"] / "ep.jsonl.gz"
    gz.write_bytes(gzip.compress(data))
    zipped = run(["dphil-stats", str(gz), *COMPARE, "--format", "html", "--timelines", "2", "-q"])
    assert zipped.returncode == 0
    assert zipped.stdout.decode().replace(str(gz), "SOURCE") == plain
    assert "SOURCE" in plain


def test_no_timelines_and_no_comparisons(made):
    p = run(["dphil-stats", str(made["ep"]), "--format", "html", "--timelines", "0", "-q"])
    assert p.returncode == 0
    page = Page(p.stdout.decode())
    assert "episode" not in page.classes
    assert "--timelines K" in p.stdout.decode() and "--compare FIELD A B" in p.stdout.decode()
    assert all(h[1:] in page.ids for h in page.links if h.startswith("#"))


def test_no_cells_leaves_only_the_comparisons(made):
    """`--no-cells` writes only the comparisons in html too: no cell table, plot or timelines."""
    p = run(["dphil-stats", str(made["ep"]), *COMPARE, "--format", "html", "--no-cells", "-q"])
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    page = Page(text)
    cell_header, cell_rows = report.cell_rows(made["cells"], ["model", "n"])
    comp_header, comp_rows = report.comparison_rows(made["comps"], ["model", "n"])
    # The comparisons are the same as on the full page ...
    assert comp_header in page.rows and all(r in page.rows for r in comp_rows)
    # ... and nothing per cell is left: not its table, its plot or its timelines.
    assert [*cell_header, "timelines"] not in page.rows
    assert not any(row in page.rows or [*row, "2 shown"] in page.rows for row in cell_rows)
    assert "comparisons" in page.ids
    assert not {"results", "plots", "timelines"} & set(page.ids)
    assert not any(i.startswith("cell-") for i in page.ids)
    assert "episode" not in page.classes and "dphil-timeline" not in page.classes
    assert "<svg" not in text and "Mean reward (95% CI)" not in text
    assert "--no-cells" in text
    assert all(h[1:] in page.ids for h in page.links if h.startswith("#"))
    # Without the flag the same run's page has all of them (the module's page).
    full = Page(made["text"])
    assert [*cell_header, "timelines"] in full.rows
    assert {"results", "plots", "timelines"} <= set(full.ids)
    assert full.classes["episode"] == 2 * len(cell_rows)


def test_timelines_only_go_with_html(made):
    p = run(["dphil-stats", str(made["ep"]), "--timelines", "2"])
    assert p.returncode == 64 and b"--timelines goes with --format html" in p.stderr


def test_timelines_are_a_usage_error_without_cells(made):
    p = run(["dphil-stats", str(made["ep"]), "--format", "html", "--no-cells", "--timelines", "2"])
    assert p.returncode == 64 and b"not with --no-cells" in p.stderr and p.stdout == b""


def test_the_sample_keeps_k_per_cell_of_a_large_input(tmp_path):
    """500 episodes per cell in, K per cell kept: memory follows K, not the input."""
    from dphil.results import frame

    ep = tmp_path / "big.jsonl"
    rollout = run(["dphil-rollout", "-m", "scripted:naive", "-m", "scripted:hierarchy", "-n", "3", "--episodes", "500"])
    assert rollout.returncode == 0
    score = run(["dphil-score"], input=rollout.stdout)
    ep.write_bytes(score.stdout)
    for k in (1, 4):
        sample = EpisodeSample(["model", "n"], k)
        loaded = frame.load([str(ep)], ["model", "n"], keep=sample)
        assert loaded.count == 1000
        assert sorted(sample.kept) == [("scripted:hierarchy", "3"), ("scripted:naive", "3")]
        assert [len(v) for v in sample.kept.values()] == [k, k]
        assert [e["seed"] for e in sample.kept[("scripted:naive", "3")]] == list(range(k))
    # A line the frame leaves out (--on-error skip) shifts the rows: the sample notices
    # and falls back to the records' own fields, so it still holds the first K per cell.
    lines = ep.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join([lines[0], b"{not json\n", *lines[1:]]))
    sample = EpisodeSample(["model", "n"], 3)
    loaded = frame.load([str(bad)], ["model", "n"], keep=sample, on_error="skip")
    assert loaded.skipped == 1 and loaded.count == 1000
    for key, got in sample.kept.items():
        assert [e["seed"] for e in got] == [0, 1, 2], key


def test_grouping_values_match_between_episodes_and_cells():
    assert key_value(3) == key_value(3.0) == key_value("3") == "3"
    assert key_value(True) == "true" and key_value(None) is None and key_value(0.5) == "0.5"


# -- in the browser -------------------------------------------------------------------------


@pytest.mark.browser
def test_the_report_renders_in_chromium_and_its_links_land(made):
    from tests.support import browser

    with browser.session() as b:
        page = b.open(made["page"])
        page.set_viewport_size({"width": 1200, "height": 1240})  # the tables and the plots
        png = made["folder"] / "report.png"
        b.screenshot(page, png, full_page=False)
        assert b.problems == []
        assert browser.non_blank(png.read_bytes())
        # Every in-page link has its target in the document.
        missing = page.evaluate(
            "[...document.querySelectorAll('a[href^=\"#\"]')]"
            ".map(a => a.getAttribute('href').slice(1)).filter(id => !document.getElementById(id))"
        )
        assert missing == []
        count = page.evaluate("document.querySelectorAll('svg.dphil-timeline').length")
        assert count == 2 * len(MODELS) * len(SIZES)
        # Following a cell's link scrolls its timelines into view.
        page.click("a[href='#cell-4']")
        assert page.evaluate("location.hash") == "#cell-4"
        top = page.evaluate("document.getElementById('cell-4').getBoundingClientRect().top")
        assert abs(top) < 5
        page.click("#cell-4 a[href='#cell-4-ep-1']")
        top = page.evaluate("document.getElementById('cell-4-ep-1').getBoundingClientRect().top")
        assert abs(top) < 5
        page.set_viewport_size({"width": 1200, "height": 760})
        page.evaluate("document.getElementById('timelines').scrollIntoView()")
        shot = made["folder"] / "report-timelines.png"
        b.screenshot(page, shot, full_page=False)
        assert browser.non_blank(shot.read_bytes())
        # The plots drew: the inline SVG has a real size on the page.
        box = page.evaluate(
            "(() => { const r = document.querySelector('figure.plot svg')"
            ".getBoundingClientRect(); return [r.width, r.height]; })()"
        )
        assert box[0] > 600 and box[1] > 200
        assert b.problems == []
    keep_picture(png, "stats-report.png")
    keep_picture(shot, "stats-report-timelines.png")
