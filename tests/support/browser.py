"""A real headless Chromium for the tests: Debian's /usr/bin/chromium driven by Playwright for Python.

Playwright's own browser download is never used (`playwright install` needs
the network): the pip package ships only its driver, and `launch` is pointed
at the distribution's Chromium, installed by `.ci/setup.d/30-chromium.sh`.
Every page opened records console errors, uncaught exceptions and any request
that leaves the file (a self-contained page makes none), so a test can assert
that a page rendered cleanly and offline.

    from tests.support import browser

    @pytest.mark.browser
    def test_page(tmp_path):
        with browser.session() as b:
            page = b.open(tmp_path / "page.html")
            png = b.screenshot(page, tmp_path / "page.png")
            assert b.problems == []
            assert browser.non_blank(png)
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from tests.support.commands import need_system_part

CHROMIUM = os.environ.get("DPHIL_CHROMIUM", "/usr/bin/chromium")
# What this machine's closed network needs (see the project notes): no background
# connections, no sync, no component updates, no QUIC; root needs --no-sandbox.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def available() -> bool:
    """Chromium is installed and Playwright for Python imports."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return False
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Skip the calling test without a browser; fail it under CI (tests.conftest.need_system_part)."""
    need_system_part(available(), "headless Chromium (Debian's chromium) with Playwright for Python")


class Session:
    """One Chromium process with a fresh profile; `problems` collects what went wrong on its pages."""

    def __init__(self, browser, profile: Path) -> None:
        self.browser = browser
        self.profile = profile
        self.problems: list[str] = []
        self.context = browser.new_context(viewport={"width": 1200, "height": 900}, device_scale_factor=1)

    def open(self, path: str | os.PathLike, *, allow_requests: bool = False):
        """Open a local file and wait until it has loaded; console errors and outside requests become problems."""
        url = Path(path).resolve().as_uri()
        page = self.context.new_page()
        page.on("console", lambda msg: msg.type == "error" and self.problems.append(f"console: {msg.text}"))
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))

        def request(req) -> None:
            if not allow_requests and not req.url.startswith(("file:", "data:", "about:")):
                self.problems.append(f"request: {req.url}")

        page.on("request", request)
        page.goto(url, wait_until="load")
        return page

    def screenshot(
        self, page, path: str | os.PathLike | None = None, *, full_page: bool = True, selector: str | None = None
    ) -> bytes:
        """A PNG of the page (or of one element), also saved to `path` when given."""
        target = page.locator(selector).first if selector else page
        kwargs = {"path": str(path)} if path is not None else {}
        if selector:
            return target.screenshot(**kwargs)
        return page.screenshot(full_page=full_page, **kwargs)


@contextlib.contextmanager
def session(profile: str | os.PathLike | None = None) -> Iterator[Session]:
    """A headless Chromium for one test; skips (or fails under CI) when there is none."""
    require()
    import tempfile

    from playwright.sync_api import sync_playwright

    with contextlib.ExitStack() as stack:
        folder = Path(profile) if profile else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        pw = stack.enter_context(sync_playwright())
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=FLAGS, env={**os.environ, "HOME": str(folder)}
        )
        stack.callback(browser.close)
        yield Session(browser, folder)


def pixel_spread(png: bytes) -> float:
    """The standard deviation of the grey levels of a PNG: 0 for a blank picture."""
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(png)) as im:
        return ImageStat.Stat(im.convert("L")).stddev[0]


def non_blank(png: bytes, *, threshold: float = 5.0) -> bool:
    """A screenshot with real content: its grey levels vary (a blank page gives 0)."""
    return pixel_spread(png) > threshold
