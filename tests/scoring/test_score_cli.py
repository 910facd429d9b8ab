"""dphil-score through CliRunner and through real processes and pipes: every bad-input class."""

from __future__ import annotations

import gzip
import json
import os
import subprocess

import jsonlines
import pytest
from click.testing import CliRunner
from dphil.commands.score import main as score_main

from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.jsonl import dumps
from tests.support.commands import command_path, run


def episode(policy="hierarchy", seed=0, **kw) -> dict:
    return play(EpisodeConfig(model=f"scripted:{policy}", n=kw.pop("n", 5), seed=seed, **kw), get_policy(policy))


def lines(*records) -> bytes:
    return b"".join(dumps(r) for r in records)


def write(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_rollout_pipe_score_example(tmp_path):
    """The README's main example, through real processes and a real pipe."""
    out = tmp_path / "ep.jsonl"
    rollout = subprocess.Popen(
        [command_path("dphil-rollout"), "-m", "scripted:naive", "-n", "5", "--episodes", "30"], stdout=subprocess.PIPE
    )
    with open(out, "wb") as fh:
        score = subprocess.run(
            [command_path("dphil-score"), "--shaped"], stdin=rollout.stdout, stdout=fh, stderr=subprocess.PIPE
        )
    rollout.stdout.close()
    assert rollout.wait() == 0 and score.returncode == 0, score.stderr
    with jsonlines.open(out) as reader:  # our output is ordinary JSONL for other tools too
        records = list(reader)
    assert len(records) == 30
    assert all(r["reward"]["variant"] == "shaped" and r["deadlock"] for r in records)
    assert {r["seed"] for r in records} == set(range(30))


def test_scores_and_is_idempotent(tmp_path):
    src = write(
        tmp_path, "ep.jsonl", lines(*(episode(p, s) for p in ("hierarchy", "random", "idle") for s in range(3)))
    )
    first = CliRunner().invoke(score_main, [src])
    assert first.exit_code == 0, first.output
    rescored = CliRunner().invoke(score_main, ["--shaped"], input=first.stdout_bytes)
    again = CliRunner().invoke(score_main, [], input=rescored.stdout_bytes)
    assert again.stdout_bytes == first.stdout_bytes  # reward and metrics replaced, never stacked
    recs = [json.loads(x) for x in first.stdout.splitlines()]
    assert recs[6]["reward"]["total"] == 1.0  # idle under the paper reward


def test_weights_are_recorded(tmp_path):
    src = write(tmp_path, "ep.jsonl", lines(episode("hierarchy")))
    res = CliRunner().invoke(score_main, [src, "--alpha", "2", "--beta", "1", "--gamma", "0", "--delta", "0"])
    rec = json.loads(res.stdout)
    assert rec["reward"]["weights"] == {"alpha": 2.0, "beta": 1.0, "gamma": 0.0, "delta": 0.0}
    c = rec["reward"]["components"]
    assert rec["reward"]["total"] == pytest.approx(2 * c["no_deadlock"] + c["throughput"])


def test_error_episodes_pass_through_unscored(tmp_path):
    rec = episode()
    rec.update(status="error", error="provider returned 500 three times", turns=rec["turns"][:3])
    res = CliRunner().invoke(score_main, [], input=lines(rec))
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["reward"] is None and out["metrics"] is None


def test_gzip_on_stdin_and_in_files(tmp_path):
    data = gzip.compress(lines(episode(seed=1), episode(seed=2)))
    res = CliRunner().invoke(score_main, [], input=data)
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2
    path = write(tmp_path, "ep.jsonl.gz", data)
    proc = run(["dphil-score", path])
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2


def test_blank_lines_and_bom_are_skipped():
    data = b"\xef\xbb\xbf" + dumps(episode(seed=1)) + b"\n   \n" + dumps(episode(seed=2))
    res = CliRunner().invoke(score_main, [], input=data)
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2


def test_last_line_without_newline_is_accepted_when_whole():
    res = CliRunner().invoke(score_main, [], input=dumps(episode()).rstrip(b"\n"))
    assert res.exit_code == 0 and res.stdout.endswith("\n")


BAD = [
    ("missing field", lambda r: r.pop("turns"), "missing field 'turns'"),
    ("wrong type", lambda r: r.update(n="5"), "field 'n' should be an integer, got a string"),
    ("bad status", lambda r: r.update(status="done"), "field 'status'"),
    ("unknown protocol", lambda r: r.update(protocol="tea"), "unknown protocol 'tea'"),
    ("lying meals", lambda r: r["meals"].__setitem__(0, 9), "recorded meals"),
    ("lying deadlock", lambda r: r.update(deadlock=True), "recorded deadlock"),
    ("flipped turn", lambda r: r["turns"][7].update(ok=not r["turns"][7]["ok"]), "turns[7] disagrees"),
    ("foreign action", lambda r: r["turns"][0].update(action="grab-left"), "not a paper action"),
    ("turn missing field", lambda r: r["turns"][2].pop("reason"), "turns[2] is missing field 'reason'"),
    ("missing philosopher", lambda r: r.update(turns=r["turns"][:4]), "no turn for philosopher(s) [4]"),
]


@pytest.mark.parametrize(("name", "mutate", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_records_name_file_and_line(tmp_path, name, mutate, message):
    good = [episode(seed=s) for s in range(3)]
    bad = episode(seed=3)
    mutate(bad)
    src = write(tmp_path, "ep.jsonl", lines(*good, bad, episode(seed=4)))
    proc = run(["dphil-score", src])
    assert proc.returncode == 65
    err = proc.stderr.decode()
    assert err.startswith(f"dphil-score: {src}:4: ") and message in err, err
    assert err.count("\n") == 1  # one line


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"kind": "episode", "n": 5,\n', "invalid JSON"),
        (b"[1, 2, 3]\n", "expected a JSON object, got an array"),
        (b'"episode"\n', "expected a JSON object, got a string"),
        (b'{"n": NaN}\n', "invalid JSON: NaN is not a JSON number"),
        (b'{"n": Infinity}\n', "invalid JSON: Infinity is not a JSON number"),
        (b'{"kind": "episode", "n": 5', "truncated last line"),
        (b"\xff\xfe\n", "invalid JSON"),
    ],
)
def test_malformed_json_is_a_data_error_with_line(data, message):
    res = CliRunner().invoke(score_main, [], input=lines(episode()) + data)
    assert res.exit_code == 65
    assert f"<stdin>:2: {message}" in res.stderr


def test_on_error_skip_counts(tmp_path):
    bad = episode(seed=9)
    bad["meals"][0] += 1
    data = lines(episode(seed=1)) + b"[]\n" + lines(bad, episode(seed=2))
    res = CliRunner().invoke(score_main, ["--on-error", "skip"], input=data)
    assert res.exit_code == 0
    assert len(res.stdout.splitlines()) == 2
    assert "skipped 2 bad record(s)" in res.stderr
    quiet = CliRunner().invoke(score_main, ["--on-error", "skip", "-q"], input=data)
    assert quiet.stderr.strip() == "dphil-score: skipped 2 bad record(s)"  # the count survives -q


def test_trust_outcome_scores_recorded_numbers():
    rec = episode("hierarchy")
    rec["meals"] = [3, 0, 0, 0, 0]
    res = CliRunner().invoke(score_main, ["--trust-outcome"], input=lines(rec))
    assert res.exit_code == 0
    assert json.loads(res.stdout)["reward"]["components"]["throughput"] == pytest.approx(3 / 25)


def test_huge_line_is_refused_without_reading_it_whole(monkeypatch):
    import dphil.io.jsonl

    monkeypatch.setattr(dphil.io.jsonl, "MAX_LINE", 3000)
    data = lines(episode()) + b'{"x": "' + b"a" * 50000 + b'"}\n' + lines(episode(seed=2))
    res = CliRunner().invoke(score_main, ["--on-error", "skip"], input=data)
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2
    assert "<stdin>:2: line longer than 3000 bytes" in res.stderr


def test_missing_input_is_66_and_usage_is_64(tmp_path):
    proc = run(["dphil-score", str(tmp_path / "nope.jsonl")])
    assert proc.returncode == 66
    assert proc.stderr.decode() == f"dphil-score: {tmp_path / 'nope.jsonl'}: no such file\n"
    assert run(["dphil-score", "--reward", "best"]).returncode == 64
    assert run(["dphil-score", "--bogus"]).returncode == 64
    assert run(["dphil-score", "--shaped", "--reward", "paper"]).returncode == 64
    assert run(["dphil-score", str(tmp_path)]).returncode == 66


def test_output_file_is_atomic(tmp_path):
    target = tmp_path / "scored.jsonl"
    target.write_text("previous contents\n")
    bad = lines(episode()) + b"not json\n"
    proc = run(["dphil-score", "-o", str(target)], input=bad)
    assert proc.returncode == 65
    assert target.read_text() == "previous contents\n"  # untouched on failure
    assert [p.name for p in tmp_path.iterdir()] == ["scored.jsonl"]  # no temporary left behind
    proc = run(["dphil-score", "-o", str(target)], input=lines(episode()))
    assert proc.returncode == 0 and proc.stdout == b""
    assert json.loads(target.read_text())["reward"]["variant"] == "paper"
    assert oct(os.stat(target).st_mode & 0o777) != oct(0o600)


def test_head_closes_the_pipe_quietly(tmp_path):
    src = write(tmp_path, "ep.jsonl", lines(*(episode(seed=s) for s in range(3000))))
    proc = subprocess.run(f"'{command_path('dphil-score')}' '{src}' | head -n 1", shell=True, capture_output=True)
    assert proc.returncode == 0
    assert proc.stderr == b""
    assert json.loads(proc.stdout)["seed"] == 0


def test_stdout_is_records_only_and_lines_are_whole(tmp_path):
    src = write(tmp_path, "ep.jsonl", lines(*(episode(p, s) for p in ("random", "naive") for s in range(50))))
    proc = run(["dphil-score", src])
    assert proc.returncode == 0 and proc.stderr == b""
    out = proc.stdout.split(b"\n")
    assert out[-1] == b"" and all(json.loads(x)["kind"] == "episode" for x in out[:-1])


def test_help_does_not_import_heavy_packages():
    code = (
        "import sys; from dphil.commands.score import main; "
        "from click.testing import CliRunner; CliRunner().invoke(main, ['--help']); "
        "heavy = [m for m in ('litellm', 'torch', 'transformers', 'art', 'polars', 'scipy', 'peft') "
        "if m in sys.modules]; print(heavy)"
    )
    proc = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stderr
