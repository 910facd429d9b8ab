"""A training run's curve picture from checkpoint records, with the chosen step marked.

The records are real `dphil-train` output (the CPU experiment committed under
bench/results/train_curve) and the selection is made by the real
`dphil-ckpt-select`; the pictures are parsed back (SVG as XML, PNG as pixels).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dphil.checkpoints.curve import curve_image, run_curve
from dphil.checkpoints.record import located
from dphil.io.errors import DataError
from dphil.io.jsonl import RecordReader
from tests.support.commands import command_path, keep_picture, run

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "bench" / "results" / "train_curve" / "ckpts-shaped.jsonl"
SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"


def one_run(tmp_path: Path, name: str = "shaped-s0") -> Path:
    path = tmp_path / f"{name}.jsonl"
    lines = [line for line in RUNS.read_text().splitlines() if json.loads(line)["run"] == name]
    path.write_text("\n".join(lines) + "\n")
    return path


def select(ckpts: Path, *args: str) -> Path:
    proc = subprocess.run(
        [command_path("dphil-ckpt-select"), str(ckpts), "--no-check-path", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = ckpts.with_suffix(".best.jsonl")
    out.write_text(proc.stdout)
    return out


def curve_of(*paths: Path, **kw):
    return run_curve(located(RecordReader([str(p) for p in paths])), **kw)


def points(group: ET.Element) -> list[tuple[float, float]]:
    """The marker positions of a matplotlib line (one <use> per data point)."""
    return [(float(u.get("x")), float(u.get("y"))) for u in group.iter(f"{SVG}use")]


def ring_centre(group: ET.Element) -> tuple[float, float]:
    numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", group.find(f"{SVG}path").get("d"))]
    xs, ys = numbers[0::2], numbers[1::2]
    return ((min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2)


def groups(svg: bytes) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {g.get("id"): g for g in root.iter(f"{SVG}g") if g.get("id")}


def test_svg_has_a_point_per_step_and_the_chosen_step_ringed(tmp_path):
    ckpts = one_run(tmp_path)
    best = select(ckpts, "--by", "train")
    chosen = json.loads(best.read_text())
    records = [json.loads(line) for line in ckpts.read_text().splitlines()]
    steps = [r["step"] for r in records]
    val_steps = [r["step"] for r in records if "val_reward" in r]

    svg = curve_image(curve_of(ckpts, best), "svg")
    g = groups(svg)
    train, val = points(g["curve-train-0"]), points(g["curve-val-0"])
    assert len(train) == len(steps) == 16
    assert len(val) == len(val_steps) == 8
    # x grows with the step; y is the reward upside down (SVG's y points down).
    assert [x for x, _ in train] == sorted(x for x, _ in train)
    best_step = chosen["step"]
    top = max(range(16), key=lambda i: records[i]["train_reward"])
    assert best_step == steps[top] != 16
    assert min(train, key=lambda p: p[1]) == train[top]
    # The ring sits on the chosen step's training point.
    cx, cy = ring_centre(g[f"chosen-{best_step}"])
    assert cx == pytest.approx(train[top][0], abs=0.01)
    assert cy == pytest.approx(train[top][1], abs=0.01)
    text = svg.decode()
    assert f"chosen step {best_step}" in text and "last step (16)" in text
    # Text stays text, and the same input draws the same bytes.
    assert "reward (higher is better)" in text
    assert curve_image(curve_of(ckpts, best), "svg") == svg
    keep_picture(curve_image(curve_of(ckpts, best), "png"), "train-curve.png")


def test_without_a_selection_nothing_is_marked_and_runs_get_their_own_curves(tmp_path):
    svg = curve_image(curve_of(RUNS), "svg")
    g = groups(svg)
    assert not [k for k in g if k.startswith("chosen-")]
    for k in range(3):
        assert len(points(g[f"curve-train-{k}"])) == 16
        assert len(points(g[f"curve-val-{k}"])) == 8
    assert all(f"val (shaped-s{k})" in svg.decode() for k in range(3))


def test_the_selection_metric_is_the_one_drawn(tmp_path):
    ckpts = one_run(tmp_path, "shaped-s1")
    best = select(ckpts, "--by", "val", "--metric", "deadlock_rate")
    curve = curve_of(ckpts, best)
    assert curve.metric == "deadlock_rate"
    svg = curve_image(curve, "svg")
    chosen = json.loads(best.read_text())
    g = groups(svg)
    val = points(g["curve-val-0"])
    val_steps = [r["step"] for r in map(json.loads, ckpts.read_text().splitlines()) if "val_reward" in r]
    cx, cy = ring_centre(g[f"chosen-{chosen['step']}"])
    assert (cx, cy) == pytest.approx(val[val_steps.index(chosen["step"])], abs=0.01)
    assert "deadlock_rate (lower is better)" in svg.decode()


def test_png_is_a_real_picture():
    import matplotlib.image

    png = curve_image(curve_of(RUNS), "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")
    height, width = pixels.shape[:2]
    assert (width, height) == (900, 540)
    flat = pixels.reshape(-1, pixels.shape[2])
    colours = {tuple(p) for p in (flat[::7] * 255).astype(int).tolist()}
    assert len(colours) > 50  # lines, bands, text: not a blank canvas
    white = (flat[:, :3] > 0.98).all(axis=1).mean()
    assert 0.3 < white < 0.97


def test_records_that_are_not_checkpoints_name_their_line(tmp_path):
    bad = tmp_path / "mixed.jsonl"
    bad.write_text(RUNS.read_text().splitlines()[0] + '\n{"kind": "episode", "turns": []}\n')
    with pytest.raises(DataError, match=r"mixed.jsonl:2: expected a checkpoint record"):
        curve_of(bad)


# -- through dphil-show ----------------------------------------------------------------------


def test_dphil_show_draws_the_curve_from_files_and_a_pipe(tmp_path):
    ckpts = one_run(tmp_path)
    best = select(ckpts, "--by", "train")
    step = json.loads(best.read_text())["step"]
    svg_path = tmp_path / "curve.svg"
    p = run(["dphil-show", str(ckpts), str(best), "-o", str(svg_path)])
    assert p.returncode == 0, p.stderr
    g = groups(svg_path.read_bytes())
    assert len(points(g["curve-train-0"])) == 16 and f"chosen-{step}" in g
    # The selection from stdin, next to the run's records; PNG by the -o suffix.
    png_path = tmp_path / "curve.png"
    p = run(["dphil-show", str(ckpts), "-", "-o", str(png_path)], input=best.read_bytes())
    assert p.returncode == 0, p.stderr
    assert png_path.read_bytes() == curve_image(curve_of(ckpts, best), "png")
    # -f png to stdout (redirected) gives the same picture.
    p = run(["dphil-show", str(ckpts), str(best), "-f", "png"])
    assert p.returncode == 0 and p.stdout == png_path.read_bytes()


def test_dphil_show_curve_skips_other_records_and_refuses_what_cannot_be_drawn(tmp_path):
    ckpts = one_run(tmp_path)
    lines = ckpts.read_text().splitlines()
    episode = (ROOT / "samples" / "naive.scored.jsonl").read_text().splitlines()[0]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([lines[0], episode, *lines[1:]]) + "\n")
    p = run(["dphil-show", str(mixed), "-f", "svg"])
    assert p.returncode == 0, p.stderr
    assert f"{mixed}:2: not a checkpoint record (kind 'episode')" in p.stderr.decode()
    assert len(points(groups(p.stdout)["curve-train-0"])) == 16
    for args, words in (
        (["-o", str(tmp_path / "dir") + "/"], b"-o FILE.svg or FILE.png"),
        (["-f", "svg", "-e", "0"], b"make one curve"),
    ):
        p = run(["dphil-show", str(ckpts), *args])
        assert p.returncode == 64 and words in p.stderr, (args, p.stderr)
    # Text shows episodes: checkpoint records alone leave nothing to show (exit 65).
    p = run(["dphil-show", str(ckpts)])
    assert p.returncode == 65 and b"no episode to show" in p.stderr
    # png is for checkpoint records only.
    p = run(["dphil-show", str(ROOT / "samples" / "naive.jsonl"), "-f", "png"])
    assert p.returncode == 64 and b"checkpoint records" in p.stderr
    # A checkpoint record with a broken field is a data error naming its line.
    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[0] + "\n" + lines[1].replace('"step":2', '"step":"two"') + "\n")
    p = run(["dphil-show", str(broken), "-f", "svg"])
    assert p.returncode == 65 and f"{broken}:2: field 'step'".encode() in p.stderr
    assert not p.stdout
