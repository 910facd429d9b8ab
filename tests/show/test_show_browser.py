"""dphil-show's pictures in a real headless Chromium: no console errors, no network, filters and turns work.

With DPHIL_SCREENSHOTS=DIR set, the screenshots these tests take are also
written to DIR (the README's pictures come from `DPHIL_SCREENSHOTS=docs/img`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import browser, episodes
from tests.support.commands import run

pytestmark = pytest.mark.browser


def keep(png: Path, name: str) -> None:
    """Save a screenshot for the README, in 256 colours to keep the repository light."""
    target = os.environ.get("DPHIL_SCREENSHOTS")
    if target:
        from PIL import Image

        Path(target).mkdir(parents=True, exist_ok=True)
        with Image.open(png) as im:
            im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
                Path(target) / name, optimize=True
            )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    browser.require()
    folder = tmp_path_factory.mktemp("show-browser")
    scripted = episodes.scripted(folder / "scripted.jsonl")
    model = episodes.model_run(folder)
    both = folder / "episodes.jsonl"
    both.write_bytes(scripted.read_bytes() + model.read_bytes())
    page = folder / "episodes.html"
    p = run(["dphil-show", both.name, "-o", page.name], cwd=folder)
    assert p.returncode == 0, p.stderr
    return {"folder": folder, "scripted": scripted, "model": model, "page": page}


@pytest.fixture(scope="module")
def chrome(files):
    with browser.session() as session:
        yield session


@pytest.fixture
def b(chrome):
    """The module's browser, with this test's problems only."""
    chrome.problems.clear()
    return chrome


def test_blank_pages_are_told_apart(files, b):
    blank = files["folder"] / "blank.html"
    blank.write_text("<!doctype html><html><body style='background:#fff'></body></html>")
    png = b.screenshot(b.open(blank))
    assert not browser.non_blank(png)


def test_the_page_renders_offline_without_errors(files, b):
    page = b.open(files["page"])
    shot = files["folder"] / "viewer.png"
    png = b.screenshot(page, shot, full_page=False)
    sections = page.locator("section.episode")
    assert sections.count() == 8
    assert page.locator("#count").inner_text() == "8 of 8 episodes"
    # Every mark is drawn: one per philosopher and round played.
    assert page.locator("section.episode .mark").count() == sum(
        int(s.get_attribute("data-n")) * int(s.locator("svg").get_attribute("data-rounds")) for s in sections.all()
    )
    assert page.evaluate("window.pwned === undefined")  # a model's reply is shown, never run
    assert b.problems == []
    assert browser.non_blank(png)
    keep(shot, "show-viewer.png")


def test_filters_show_only_matching_episodes(files, b):
    page = b.open(files["page"])
    page.select_option("#f-model", "scripted:naive")
    assert page.locator("#count").inner_text() == "2 of 8 episodes"
    assert page.locator("#tally").inner_text() == "2 deadlocked"
    visible = page.locator("section.episode:visible")
    assert visible.count() == 2
    assert {s.get_attribute("data-model") for s in visible.all()} == {"scripted:naive"}
    page.select_option("#f-model", "")
    page.select_option("#f-n", "3")
    assert page.locator("#count").inner_text() == "3 of 8 episodes"  # idle, chatty, flaky
    page.select_option("#f-status", "error")
    assert page.locator("#count").inner_text() == "1 of 8 episodes"
    assert page.locator("section.episode:visible").get_attribute("data-model") == "flaky"
    page.select_option("#f-n", "5")
    assert page.locator("#count").inner_text() == "0 of 8 episodes"
    assert b.problems == []


def test_clicking_a_cell_shows_that_turn(files, b):
    page = b.open(files["page"])
    page.select_option("#f-model", "chatty")
    section = page.locator("section.episode:visible")
    section.locator('.mark[data-p="0"][data-r="1"]').click()
    panel = section.locator(".turn")
    assert "P0 · round 1: no action" in panel.inner_text()
    assert episodes.HOSTILE in panel.locator("pre").first.inner_text()  # the raw reply, as text
    section.locator('.mark[data-p="2"][data-r="1"]').press("Enter")  # keyboard too
    assert "P2 · round 1: pick-up-right" in panel.inner_text()
    section.locator('.mark[data-p="1"][data-r="1"]').click()
    text = panel.inner_text()
    assert "pick-up-left" in text and "tool call" in text and '"name": "pick-up-left"' in text
    assert section.locator(".mark.sel").count() == 1
    assert page.evaluate("window.pwned === undefined")
    page.mouse.move(0, 0)  # no hover outline in the picture
    shot = files["folder"] / "turn.png"
    png = b.screenshot(page, shot, selector="section.episode:visible")
    assert b.problems == []
    assert browser.non_blank(png)
    keep(shot, "show-turn.png")


def test_a_standalone_svg_renders(files, b):
    svg = files["folder"] / "greedy.svg"
    p = run(["dphil-show", "-e", "1", str(files["scripted"]), "-o", str(svg)])
    assert p.returncode == 0, p.stderr
    page = b.open(svg)
    assert page.locator(".mark").count() == 25
    shot = files["folder"] / "svg.png"
    png = b.screenshot(page, shot, selector="svg")
    assert b.problems == []
    assert browser.non_blank(png)
    keep(shot, "show-timeline.png")
