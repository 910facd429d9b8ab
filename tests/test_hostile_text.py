"""Hostile text from records and servers never reaches a terminal raw, breaks an SVG, or runs as TeX."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET

import pytest

from tests.support.commands import run
from tests.support.openai_server import OpenAIServer, status

# A window-title OSC, a screen clear, an OSC 8 hyperlink, a C1 CSI, BEL, NUL, and TeX for mathtext.
HOSTILE = "m\x1b]0;owned\x07\x1b[2J\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\x9b31m\x00$\\href{http://x}{y}$"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def raw(data: bytes) -> list[str]:
    """The control characters (tab and newline aside) in a command's output."""
    return CONTROL.findall(data.decode("utf-8", "replace"))


@pytest.fixture(scope="module")
def hostile_file(tmp_path_factory) -> str:
    """Scored episodes whose every free-text field is hostile (as a doctored file would be)."""
    p = run(["dphil-rollout", "-m", "scripted:naive", "-m", "scripted:idle", "-n", "3", "--episodes", "2"])
    scored = run(["dphil-score"], input=p.stdout).stdout
    lines = []
    for line in scored.splitlines():
        r = json.loads(line)
        r["model"] = HOSTILE + r["model"]
        r["episode_id"] = r["episode_id"][:8] + HOSTILE
        r["run"] = HOSTILE
        r["prompt"] = HOSTILE
        lines.append(json.dumps(r))
    path = tmp_path_factory.mktemp("hostile") / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_stats_tables_and_warnings_show_control_characters(hostile_file, fmt):
    p = run(["dphil-stats", hostile_file, "--format", fmt])
    assert p.returncode == 0, p.stderr
    assert raw(p.stdout) == [] and raw(p.stderr) == []
    assert b"\\e]0;owned\\x07" in p.stdout and b"degenerate" in p.stderr


def test_show_text_prints_no_raw_control_character(hostile_file):
    p = run(["dphil-show", hostile_file, "--all", "--format", "text"])
    assert p.returncode == 0, p.stderr
    assert raw(p.stdout) == [] and b"\\e[2J" in p.stdout


def test_a_standalone_svg_of_a_hostile_record_is_well_formed_xml(hostile_file):
    p = run(["dphil-show", hostile_file, "--episode", "0", "--format", "svg"])
    assert p.returncode == 0, p.stderr
    root = ET.fromstring(p.stdout)
    assert "\x1b" not in "".join(root.itertext())


def test_tex_in_a_label_is_plain_text_in_the_report_and_the_plot(hostile_file, tmp_path):
    pytest.importorskip("matplotlib")
    html = run(["dphil-stats", hostile_file, "--format", "html", "-o", str(tmp_path / "r.html"), "-q"])
    assert html.returncode == 0, html.stderr
    plot = run(["dphil-stats", hostile_file, "--plot", str(tmp_path / "p.svg"), "-q"])
    assert plot.returncode == 0, plot.stderr
    svg = (tmp_path / "p.svg").read_text()
    ET.fromstring(svg)
    assert "\\href{http://x}{y}" in svg  # the dollar signs and the TeX stayed text


def test_both_html_pages_carry_a_content_security_policy(hostile_file, tmp_path):
    report = tmp_path / "r.html"
    viewer = tmp_path / "v.html"
    assert run(["dphil-stats", hostile_file, "--format", "html", "-o", str(report), "-q"]).returncode == 0
    assert run(["dphil-show", hostile_file, "--format", "html", "-o", str(viewer)]).returncode == 0
    for page in (report, viewer):
        text = page.read_text()
        csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', text)
        assert csp, page
        policy = csp.group(1)
        assert "default-src 'none'" in policy and "connect-src" not in policy
        assert re.search(r"script-src ('sha256-[^']+'|'none')(;|$)", policy)  # never an inline script of a record
        assert "\x1b" not in text and " on" + "submit=" not in text


def test_a_server_error_body_reaches_the_closing_line_defused(tmp_path):
    with OpenAIServer() as server:
        server.default = lambda body: status(400, body={"detail": HOSTILE})
        reg = tmp_path / "m.toml"
        reg.write_text(f'[models.local]\nmodel = "hosted_vllm/local"\napi_base = "{server.url}"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPHIL_")}
        p = run(
            ["dphil-rollout", "-m", "local", "--models", str(reg), "-n", "2", "--episodes", "1", "--retries", "0"],
            env=env,
        )
    assert p.returncode == 75
    assert raw(p.stderr) == []
    assert b"\\e]0;owned" in p.stderr
