"""The self-contained HTML viewer of episodes: a filterable list of timelines, each turn a click away.

Everything the page needs (style, script, pictures, turn data) is inline, so
it opens offline, from a mail attachment or a cluster's scratch directory.
The page is written episode by episode (`EpisodePage.add`), so a file of any
size is shown without holding more than one record. `STYLE`, `SCRIPT` and
`episode_section` are public so other pages (dphil-stats' report) can embed
the same timelines.
"""

from __future__ import annotations

from typing import IO, Any

import orjson

from dphil.io.safe import csp_meta
from dphil.io.safe import for_html as escape
from dphil.show.svg import CELL, episode_svg, legend_svg
from dphil.show.timeline import Timeline, describe, outcome_text, reward_terms, timeline

STYLE = """
:root{--ink:#1f2328;--muted:#636c76;--line:#d8dee4;--bg:#f6f8fa;--bad:#d62728}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI","DejaVu Sans",Helvetica,Arial,sans-serif;
  color:var(--ink);background:var(--bg)}
header.page{position:sticky;top:0;z-index:2;background:#fff;border-bottom:1px solid var(--line);
  padding:10px 20px;display:flex;flex-wrap:wrap;gap:8px 20px;align-items:center}
header.page h1{font-size:17px;margin:0}
header.page .src{color:var(--muted)}
.filters{display:flex;gap:12px;align-items:center;flex-wrap:wrap}
.filters label{color:var(--muted)}
.filters select{font:inherit;padding:2px 4px;margin-left:4px}
#count{font-weight:600}
#tally{color:var(--muted)}
main{padding:16px 20px;display:grid;gap:14px;max-width:1200px}
section.episode{background:#fff;border:1px solid var(--line);border-radius:8px;padding:12px 14px}
section.episode h2{font-size:15px;margin:0 0 2px}
section.episode h2 .id{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;color:var(--muted);
  font-weight:normal;margin-right:6px}
.outcome{margin:0 0 8px;color:var(--muted)}
.outcome.bad{color:var(--bad)}
.timeline{overflow-x:auto}
.timeline svg{display:block}
.mark{cursor:pointer;outline:none}
.mark:hover>rect:first-of-type,.mark:focus>rect:first-of-type{stroke:var(--ink);stroke-width:2}
.mark.sel>rect:first-of-type{stroke:#000;stroke-width:3}
.cols{display:flex;gap:18px;flex-wrap:wrap;align-items:flex-start}
.side{flex:1;min-width:300px;display:flex;flex-direction:column;align-items:flex-start;gap:8px}
.side .turn{align-self:stretch}
header.page svg.legend{flex:0 0 auto}
table.terms{border-collapse:collapse;font-variant-numeric:tabular-nums}
table.terms th,table.terms td{padding:2px 8px;border-bottom:1px solid var(--line);text-align:right}
table.terms th:first-child,table.terms td:first-child{text-align:left}
table.terms tr.total td{font-weight:600;border-bottom:none}
.turn{border-left:3px solid var(--line);padding:2px 10px}
.turn .hint{color:var(--muted);margin:0}
.turn h3{font-size:14px;margin:0 0 4px}
.turn dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;margin:4px 0}
.turn dt{color:var(--muted)}
.turn dd{margin:0}
.turn pre{white-space:pre-wrap;word-break:break-word;background:var(--bg);border:1px solid var(--line);
  border-radius:4px;padding:6px 8px;margin:2px 0 6px;max-height:18em;overflow:auto;font-size:12px}
footer{padding:0 20px 20px;color:var(--muted)}
"""

SCRIPT = r"""
(function () {
  "use strict";
  var filters = document.querySelector("form.filters");
  if (filters) filters.addEventListener("submit", function (e) { e.preventDefault(); });
  var episodes = Array.prototype.slice.call(document.querySelectorAll("section.episode"));
  var keys = ["model", "n", "status"];
  var selects = {};
  keys.forEach(function (key) {
    var select = document.getElementById("f-" + key);
    if (!select) return;
    selects[key] = select;
    var seen = {};
    episodes.forEach(function (e) { seen[e.dataset[key]] = true; });
    var values = Object.keys(seen);
    values.sort(key === "n" ? function (a, b) { return a - b; } : undefined);
    values.forEach(function (v) {
      var option = document.createElement("option");
      option.value = v;
      option.textContent = key === "n" ? "N=" + v : v;
      select.appendChild(option);
    });
    select.addEventListener("change", filter);
  });
  function filter() {
    var shown = 0, deadlocked = 0, errors = 0;
    episodes.forEach(function (e) {
      var ok = keys.every(function (k) {
        return !selects[k] || !selects[k].value || e.dataset[k] === selects[k].value;
      });
      e.hidden = !ok;
      if (!ok) return;
      shown++;
      if (e.dataset.deadlock === "yes") deadlocked++;
      if (e.dataset.status === "error") errors++;
    });
    var count = document.getElementById("count");
    if (count) count.textContent = shown + " of " + episodes.length + " episode" + (episodes.length === 1 ? "" : "s");
    var tally = document.getElementById("tally");
    if (tally) tally.textContent = shown ? deadlocked + " deadlocked" + (errors ? ", " + errors + " errored" : "") : "";
  }
  filter();

  var cache = new WeakMap();
  function turnsOf(section) {
    if (!cache.has(section)) {
      var data = section.querySelector("script.turns");
      cache.set(section, data ? JSON.parse(data.textContent) : []);
    }
    return cache.get(section);
  }
  function add(parent, tag, text, cls) {
    var el = document.createElement(tag);
    if (text !== undefined) el.textContent = text;
    if (cls) el.className = cls;
    parent.appendChild(el);
    return el;
  }
  var SHOWN = ["action", "ok", "reason"];
  // "reply": the raw text of a local model's turn in schema-1 records (now "raw").
  var BLOCKS = ["raw", "reply", "tool_call", "ignored_tool_calls", "reasoning", "talk"];
  function show(mark) {
    var section = mark.closest("section.episode");
    var panel = section.querySelector(".turn");
    section.querySelectorAll(".mark.sel").forEach(function (m) { m.classList.remove("sel"); });
    mark.classList.add("sel");
    panel.textContent = "";
    var title = mark.querySelector("title");
    add(panel, "h3", title ? title.textContent : "");
    var t = mark.dataset.t === undefined ? null : turnsOf(section)[+mark.dataset.t];
    if (!t) { add(panel, "p", "No turn was recorded here.", "hint"); return; }
    var dl = add(panel, "dl");
    var rest = Object.keys(t).filter(function (k) {
      return k !== "round" && k !== "philosopher" && SHOWN.indexOf(k) < 0 && BLOCKS.indexOf(k) < 0;
    });
    SHOWN.concat(rest).forEach(function (k) {
      if (!(k in t)) return;
      add(dl, "dt", k);
      var v = t[k];
      add(dl, "dd", v !== null && typeof v === "object" ? JSON.stringify(v) : String(v));
    });
    function present(v) { return v !== undefined && v !== null && !(Array.isArray(v) && v.length === 0); }
    BLOCKS.forEach(function (k) {
      if (!present(t[k])) return;
      add(panel, "div", k === "raw" || k === "reply" ? "raw reply" : k.replace(/_/g, " "), "hint");
      add(panel, "pre", typeof t[k] === "string" ? t[k] : JSON.stringify(t[k], null, 2));
    });
    if (!BLOCKS.some(function (k) { return present(t[k]); }))
      add(panel, "p", "A scripted turn: no reply or tool call recorded.", "hint");
  }
  document.addEventListener("click", function (ev) {
    var mark = ev.target.closest && ev.target.closest(".mark");
    if (mark) show(mark);
  });
  document.addEventListener("keydown", function (ev) {
    if ((ev.key === "Enter" || ev.key === " ") && ev.target.classList && ev.target.classList.contains("mark")) {
      ev.preventDefault();
      show(ev.target);
    }
  });
  document.querySelectorAll(".mark").forEach(function (m) { m.setAttribute("tabindex", "0"); });
})();
"""


def _json_for_script(value: Any) -> str:
    """JSON that cannot end its <script> element early."""
    return orjson.dumps(value).decode().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _terms_table(record: dict[str, Any]) -> str:
    terms = reward_terms(record)
    if terms is None:
        return '<p class="hint">Not scored: pipe through dphil-score to see the reward.</p>'
    reward = record["reward"]
    rows = ['<table class="terms"><tr><th>reward term</th><th>value</th><th>weight</th><th>contribution</th></tr>']
    for name, w, v in terms:
        rows.append(f"<tr><td>{escape(name)}</td><td>{v:.3f}</td><td>{w:+g}</td><td>{w * v + 0.0:+.3f}</td></tr>")
    total = reward.get("total")
    total_text = f"{total:.3f}" if isinstance(total, int | float) else "null"
    rows.append(
        f'<tr class="total"><td>total ({escape(str(reward.get("variant", "?")))})</td><td></td><td></td>'
        f"<td>{total_text}</td></tr></table>"
    )
    return "".join(rows)


def episode_section(record: dict[str, Any], index: int, *, tl: Timeline | None = None) -> str:
    """One episode as an HTML <section>: heading, timeline, reward terms, turn panel and turn data.

    `id="e{index}"`, so other pages can link to `viewer.html#e3`; data-model,
    data-n and data-status drive the page's filters.
    """
    tl = tl or timeline(record)
    bad = bool(tl.deadlock_rounds) or record.get("status") == "error"
    attrs = (
        f'id="e{index}" data-model="{escape(str(record.get("model", "")))}" data-n="{tl.n}" '
        f'data-status="{escape(str(record.get("status", "")))}" '
        f'data-deadlock="{"yes" if tl.deadlock_rounds else "no"}" '
        f'data-episode="{escape(str(record.get("episode_id", "")))}"'
    )
    return (
        f'<section class="episode" {attrs}>'
        f'<h2><span class="id">{escape(str(record.get("episode_id", "")))}</span>{escape(describe(record))}</h2>'
        f'<p class="outcome{" bad" if bad else ""}">{escape(outcome_text(tl))}</p>'
        f'<div class="cols"><div class="timeline">{episode_svg(record, tl=tl, standalone=False)}</div>'
        f'<div class="side">{_terms_table(record)}'
        '<div class="turn"><p class="hint">Click a cell to see that turn: its action and outcome, and for '
        "model runs the raw reply and tool call.</p></div></div></div>"
        f'<script type="application/json" class="turns">{_json_for_script(record.get("turns", []))}</script>'
        "</section>\n"
    )


def legend_html() -> str:
    """The timeline legend as an inline SVG, once per page."""
    return (
        f'<svg class="legend" width="620" height="{CELL + 4}" viewBox="0 0 620 {CELL + 4}" '
        f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">{legend_svg(0, 2)}</svg>'
    )


def source_label(sources: list[str]) -> str:
    """What the page header says it shows: the file, a few files, or how many."""
    if not sources or sources == ["-"]:
        return "<stdin>"
    if len(sources) <= 2:
        return ", ".join("<stdin>" if s == "-" else s for s in sources)
    return f"{sources[0]} and {len(sources) - 1} more files"


class EpisodePage:
    """Write the viewer page to a binary stream, one episode at a time."""

    def __init__(self, out: IO[bytes], *, source: str) -> None:
        self.out = out
        self.count = 0
        title = f"dphil-show: {source}"
        out.write(
            (
                '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"{csp_meta(scripts=(SCRIPT,), styles=(STYLE,))}"
                f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
                '<header class="page"><h1>Episodes</h1>'
                f'<span class="src">{escape(source)}</span>'
                '<form class="filters">'
                '<label>model <select id="f-model"><option value="">all</option></select></label>'
                '<label>table <select id="f-n"><option value="">all</option></select></label>'
                '<label>status <select id="f-status"><option value="">all</option></select></label>'
                f'<span id="count"></span><span id="tally"></span></form>{legend_html()}</header>\n<main>\n'
            ).encode()
        )

    def add(self, record: dict[str, Any], tl: Timeline | None = None) -> None:
        self.out.write(episode_section(record, self.count, tl=tl).encode())
        self.count += 1

    def close(self, note: str | None = None) -> None:
        foot = f"<footer><p>{escape(note)}</p></footer>" if note else ""
        self.out.write(f"</main>\n{foot}<script>{SCRIPT}</script>\n</body></html>\n".encode())
