"""The study's evaluation grid at small scale, on the models dphil serves itself, resumable.

Every episode comes from `dphil-rollout` run as a user runs it (`-o FILE --resume`, one
journal per part, `--tag part=NAME`), every number from `dphil-score` and `dphil-stats`:

  baselines   scripted:random, naive, hierarchy and idle
  q05-tools   qwen2.5-0.5b (six tools, tool_choice auto)      q05-text   qwen2.5-0.5b-text
  q15-tools   qwen2.5-1.5b                                     q15-text   qwen2.5-1.5b-text
  gemma-text  gemma-3-270m (the base model, text only)
  ablations   on the better 0.5B mode at N=5 (by mean shaped reward): --prompt
              resource-ordering, --prompt symmetry-breaking, --talk 1

at N = 5, 10, 15, 5 rounds, --episodes per cell (default 10), seeds 0..E-1 everywhere. Steps
run cheapest first (see `steps`), each skipped when its journal
is complete, so a stopped run resumes where it stopped: `--budget MINUTES` stops starting
new steps after that long. Wall time per step is appended to timings.jsonl. `--report` scores
everything under both rewards and writes the cells and comparisons (each model against
scripted:random, 1.5B against 0.5B, each ablation against its base) as markdown.

    python bench/grid_small.py [--episodes 10] [--budget 120] [--only q05-text] [--sizes 5] [--report]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from dphil.io.console_scripts import locate

OUT = Path(__file__).resolve().parent / "results" / "grid_small"
SIZES = (5, 10, 15)
BASELINES = {
    "random": "scripted:random",
    "naive": "scripted:naive",
    "hierarchy": "scripted:hierarchy",
    "idle": "scripted:idle",
}
MODELS = {
    "q05-tools": ("qwen2.5-0.5b", ()),
    "q05-text": ("qwen2.5-0.5b-text", ()),
    "gemma-text": ("gemma-3-270m", ()),
    "q15-tools": ("qwen2.5-1.5b", ()),
    "q15-text": ("qwen2.5-1.5b-text", ()),
}
ABLATIONS = {
    "resource-ordering": ("--prompt", "resource-ordering"),
    "symmetry-breaking": ("--prompt", "symmetry-breaking"),
    "talk1": ("--talk", "1"),
}


def tool(name: str) -> str:
    found = locate(name)
    if found is None:
        sys.exit(f"grid_small: {name} is not installed (pip install -e '.[local]')")
    return found


def better_05b() -> str:
    """q05-tools or q05-text, whichever has the higher mean shaped reward at N = 5 so far."""
    best, best_mean = "q05-text", float("-inf")
    for part in ("q05-tools", "q05-text"):
        journal = OUT / "episodes" / f"{part}.jsonl"
        if not journal.exists():
            continue
        scored = subprocess.run(
            [tool("dphil-score"), "--shaped", str(journal)], capture_output=True, check=True
        ).stdout.decode()
        rewards = [
            r["reward"]["total"] for r in map(json.loads, scored.splitlines()) if r.get("n") == 5 and r.get("reward")
        ]
        if rewards and sum(rewards) / len(rewards) > best_mean:
            best, best_mean = part, sum(rewards) / len(rewards)
    return best


def steps(episodes: int) -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(part, model, N, extra args) in the order they run, cheapest first.

    The baselines, then the text modes (a reply of a few tokens) at every N with the
    ablations and the 1.5B's text mode at N = 5, then the tool modes (about ten times the
    decoding) from N = 5 up, then the 1.5B at the larger tables: a budget that runs out
    leaves the widest table behind it.
    """
    out: list[tuple[str, str, int, tuple[str, ...]]] = []
    out += [(part, model, n, ()) for n in SIZES for part, model in BASELINES.items()]
    text = ("q05-text", "gemma-text")
    out += [(part, MODELS[part][0], 5, ()) for part in text]
    out.append(("ablations", "", 5, ()))  # expanded when reached: needs q05's results
    out.append(("q15-text", MODELS["q15-text"][0], 5, ()))
    out += [(part, MODELS[part][0], n, ()) for n in SIZES[1:] for part in text]
    out += [("q05-tools", MODELS["q05-tools"][0], n, ()) for n in SIZES[:1]]
    out.append(("q15-tools", MODELS["q15-tools"][0], 5, ()))
    out += [("q05-tools", MODELS["q05-tools"][0], n, ()) for n in SIZES[1:]]
    out += [(part, MODELS[part][0], n, ()) for n in SIZES[1:] for part in ("q15-text", "q15-tools")]
    return out


def run_step(part: str, model: str, n: int, args: tuple[str, ...], episodes: int) -> None:
    journal = OUT / "episodes" / f"{part}.jsonl"
    journal.parent.mkdir(parents=True, exist_ok=True)
    cmd = [tool("dphil-rollout"), "-m", model, "-n", str(n), "--rounds", "5", "--episodes", str(episodes)]
    cmd += [*args, "--tag", f"part={part}", "-o", str(journal), "--resume", "-q"]
    before = _count(journal, n)
    if before >= episodes:
        return
    print(f"grid_small: {part} N={n} ({before}/{episodes} done)", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(cmd)
    # SIGTERM (kill, scancel) goes on to the rollout, which stops its own llama.cpp server and
    # keeps its journal whole; then this script stops too, with the step's row written.
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    try:
        proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    wall = time.monotonic() - started
    written = _count(journal, n) - before
    with open(OUT / "timings.jsonl", "a", encoding="utf-8") as fh:
        row = {
            "part": part,
            "model": model,
            "n": n,
            "episodes": written,
            "wall_s": round(wall, 1),
            "rc": proc.returncode,
        }
        fh.write(json.dumps(row) + "\n")
    if proc.returncode in (-signal.SIGTERM, 143):
        sys.exit(f"grid_small: stopped during {part} N={n}; run it again to resume")
    if proc.returncode not in (0, 75):
        sys.exit(f"grid_small: {part} N={n} failed with exit status {proc.returncode}")


def _count(journal: Path, n: int) -> int:
    """Complete episodes of table size n in the journal."""
    if not journal.exists():
        return 0
    count = 0
    for line in journal.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        count += r.get("n") == n and r.get("status") == "complete"
    return count


def report() -> None:
    """Scored files under both rewards, then cells and comparisons as markdown."""
    journals = sorted((OUT / "episodes").glob("*.jsonl"))
    comparisons = [("part", "random", p) for p in (*MODELS, *(f"abl-{a}" for a in ABLATIONS))]
    comparisons += [("part", "q05-tools", "q15-tools"), ("part", "q05-text", "q15-text")]
    base = _ablation_base()
    comparisons += [("part", base, f"abl-{a}") for a in ABLATIONS]
    for reward, flag in (("shaped", ["--shaped"]), ("paper", [])):
        scored = OUT / f"scored-{reward}.jsonl"
        with open(scored, "wb") as fh:
            subprocess.run([tool("dphil-score"), *flag, *map(str, journals)], stdout=fh, check=True)
        present = {json.loads(line).get("part") for line in scored.read_text().splitlines()}
        args = [tool("dphil-stats"), str(scored), "--by", "part,n", "--format", "markdown", "-q"]
        for field, a, b in comparisons:
            if a in present and b in present:
                args += ["--compare", field, a, b]
        with open(OUT / f"report-{reward}.md", "wb") as fh:
            subprocess.run(args, stdout=fh, check=True)
        print(f"grid_small: wrote {OUT / f'report-{reward}.md'}", file=sys.stderr)
    (OUT / "timings.md").write_text(timings_table())


def timings_table() -> str:
    """Seconds per episode by part and N, from timings.jsonl (the steps that wrote episodes)."""
    rows: dict[tuple[str, int], list[float]] = {}
    path = OUT / "timings.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        t = json.loads(line)
        if t["episodes"] > 0 and not t["model"].startswith("scripted:"):
            w = rows.setdefault((t["part"], t["n"]), [0.0, 0.0])
            w[0] += t["wall_s"]
            w[1] += t["episodes"]
    out = ["| part | N | episodes | wall s | s per episode |", "| --- | ---: | ---: | ---: | ---: |"]
    for (part, n), (wall, eps) in sorted(rows.items()):
        out.append(f"| {part} | {n} | {int(eps)} | {wall:.0f} | {wall / eps:.1f} |")
    return "\n".join(out) + "\n"


def _ablation_base() -> str:
    chosen = OUT / "ablation_base.txt"
    return chosen.read_text().strip() if chosen.exists() else "q05-text"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--budget", type=float, default=None, metavar="MINUTES", help="start no step after this long")
    p.add_argument("--only", default=None, metavar="PART[,PART]", help="run only these parts")
    p.add_argument(
        "--sizes", default=None, metavar="N[,N]", help="run only these table sizes (e.g. 5, to take N = 5 to 30)"
    )
    p.add_argument("--report", action="store_true", help="score and compare what is there; run nothing")
    a = p.parse_args()
    if a.report:
        report()
        return 0
    only = set(a.only.split(",")) if a.only else None
    try:
        sizes = {int(x) for x in a.sizes.split(",")} if a.sizes else set(SIZES)
    except ValueError:
        p.error(f"--sizes: expected table sizes such as 5,10, got {a.sizes!r}")
    if not sizes <= set(SIZES):
        p.error(f"--sizes: the grid's sizes are {', '.join(map(str, SIZES))}")
    started = time.monotonic()
    for part, model, n, args in steps(a.episodes):
        if n not in sizes:
            continue
        if a.budget is not None and time.monotonic() - started > a.budget * 60:
            print("grid_small: budget spent; rerun to continue", file=sys.stderr)
            return 75
        if part == "ablations":
            chosen = OUT / "ablation_base.txt"
            if not chosen.exists():
                chosen.write_text(better_05b() + "\n")
            base = chosen.read_text().strip()
            for name, extra in ABLATIONS.items():
                if only is None or f"abl-{name}" in only:
                    run_step(f"abl-{name}", MODELS[base][0], 5, extra, a.episodes)
            continue
        if only is None or part in only:
            run_step(part, model, n, args, a.episodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
