"""dphil-rollout with language models, as a real process against a real local server:
grids, errors and resume, kill and resume, sharding, secrets, option errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.core.test_samples import validator
from tests.support.commands import command_path, run
from tests.support.memory import measured
from tests.support.openai_server import OpenAIServer, big, status, text

KEY = "sk-cli-SECRET-0123456789abcdef"


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["DPHIL_CLI_KEY"] = KEY
    e.pop("DPHIL_MODELS", None)
    return e


def registry(tmp_path, server, name="local"):
    path = tmp_path / "models.toml"
    path.write_text(
        f'[models.{name}]\nmodel = "openai/{name}"\napi_base = "{server.url}"\napi_key_env = "DPHIL_CLI_KEY"\n'
    )
    return str(path)


def lines(path):
    return [json.loads(x) for x in open(path, encoding="utf-8").read().splitlines()]


def test_grid_of_models_and_sizes_with_variant_in_the_id(tmp_path, server, env):
    models = registry(tmp_path, server)
    p = run(
        [
            "dphil-rollout",
            "-m",
            "local",
            "-m",
            "scripted:hierarchy",
            "-n",
            "3,4",
            "--episodes",
            "2",
            "--rounds",
            "2",
            "--models",
            models,
            "-q",
        ],
        env=env,
    )
    assert p.returncode == 0, p.stderr
    records = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert len(records) == 8
    local = [r for r in records if r["model"] == "local"]
    assert sorted((r["n"], r["seed"]) for r in local) == [(3, 0), (3, 1), (4, 0), (4, 1)]
    for r in local:
        assert r["status"] == "complete" and r["prompt"] == "default" and r["memory"] == "full"
        assert r["usage"]["calls"] == r["n"] * r["rounds_played"]
        assert all("raw" in t and "usage" in t for t in r["turns"])
    p2 = run(
        [
            "dphil-rollout",
            "-m",
            "local",
            "-n",
            "3,4",
            "--episodes",
            "2",
            "--rounds",
            "2",
            "--models",
            models,
            "--prompt",
            "minimal",
            "-q",
        ],
        env=env,
    )
    ids2 = {json.loads(x)["episode_id"] for x in p2.stdout.decode().splitlines()}
    assert ids2.isdisjoint({r["episode_id"] for r in local})
    scored = run(["dphil-score", "--shaped"], input=p.stdout, env=env)
    assert scored.returncode == 0, scored.stderr


def test_errored_episodes_exit_75_and_resume_retries_only_them(tmp_path, server, env):
    models = registry(tmp_path, server)
    out = tmp_path / "out.jsonl"
    server.script("local", status(500))  # the very first call fails: one episode errors
    args = [
        "dphil-rollout",
        "-m",
        "local",
        "-n",
        "2",
        "--episodes",
        "3",
        "--rounds",
        "1",
        "--models",
        models,
        "--retries",
        "0",
        "--concurrency",
        "1",
        "-o",
        str(out),
    ]
    p = run(args, env=env)
    assert p.returncode == 75, p.stderr
    assert b"1 episode(s) ended in error" in p.stderr
    first = lines(out)
    assert [r["status"] for r in first].count("error") == 1
    err = next(r for r in first if r["status"] == "error")
    assert "500" in err["error"] and err["turns"] == []
    p = run([*args, "--resume"], env=env)
    assert p.returncode == 0, p.stderr
    after = lines(out)
    assert after[: len(first)] == first  # appended, nothing rewritten
    complete = [r["episode_id"] for r in after if r["status"] == "complete"]
    assert len(complete) == len(set(complete)) == 3
    assert after[-1]["episode_id"] == err["episode_id"]
    p = run([*args, "--resume"], env=env)
    assert p.returncode == 0 and len(lines(out)) == len(after)  # nothing left to do


def test_sigterm_leaves_whole_lines_and_resume_completes_the_grid(tmp_path, env):
    with OpenAIServer() as server:
        models = registry(tmp_path, server)
        out = tmp_path / "out.jsonl"
        args = [
            command_path("dphil-rollout"),
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "12",
            "--rounds",
            "2",
            "--models",
            models,
            "--concurrency",
            "2",
            "-o",
            str(out),
        ]
        # Answer the calls of a few episodes, then hold the rest: the run is stopped mid-grid
        # whatever the machine's speed.
        server.hold_after(12)
        proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE)
        assert server.wait_arrived(13), "the run never reached the held call"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 143 and b"terminated" in err
        data = out.read_bytes()
        assert data.endswith(b"\n")
        partial = lines(out)
        assert 1 <= len(partial) < 12
        server.release()
        p = run([*args[:1], *args[1:], "--resume"], env=env)
        assert p.returncode == 0, p.stderr
    ids = [r["episode_id"] for r in lines(out) if r["status"] == "complete"]
    assert len(ids) == len(set(ids)) == 12


def test_shards_partition_the_grid_with_the_same_ids(tmp_path, server, env):
    models = registry(tmp_path, server)
    base = ["dphil-rollout", "-m", "local", "-n", "2,3", "--episodes", "3", "--rounds", "1", "--models", models, "-q"]

    def ids(extra):
        p = run([*base, *extra], env=env)
        assert p.returncode == 0, p.stderr
        return [json.loads(x)["episode_id"] for x in p.stdout.decode().splitlines()]

    whole = ids([])
    parts = [ids(["--shard", f"{i}/3"]) for i in range(3)]
    assert sorted(i for part in parts for i in part) == sorted(whole) and len(set(whole)) == 6
    assert all(parts)


def test_api_key_never_reaches_records_or_messages(tmp_path, server, env):
    models = registry(tmp_path, server)
    server.script("local", status(401))
    p = run(
        [
            "dphil-rollout",
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "1",
            "--rounds",
            "1",
            "--models",
            models,
            "--retries",
            "0",
        ],
        env=env,
    )
    assert p.returncode == 75
    assert KEY.encode() not in p.stdout and KEY.encode() not in p.stderr
    assert json.loads(p.stdout)["status"] == "error"
    assert any(r["authorization"] == f"Bearer {KEY}" for r in server.requests)


def test_max_errors_aborts(tmp_path, server, env):
    models = registry(tmp_path, server)
    server.default = lambda body: status(503)
    p = run(
        [
            "dphil-rollout",
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "10",
            "--rounds",
            "1",
            "--models",
            models,
            "--retries",
            "0",
            "--concurrency",
            "1",
            "--max-errors",
            "2",
        ],
        env=env,
    )
    assert p.returncode == 69
    assert b"--max-errors 2" in p.stderr
    assert len(p.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["-m", "no-such-alias"], 78, b"unknown model 'no-such-alias'"),
        (["-m", "gpt-5.4", "--memory", "some"], 64, b"--memory"),
        (["-m", "gpt-5.4", "--prompt-file", "/nonexistent/p.txt"], 66, b"no such prompt file"),
    ],
)
def test_option_errors(extra, code, message, env):
    p = run(["dphil-rollout", "-n", "2", "--episodes", "1", *extra], env=env)
    assert p.returncode == code, p.stderr
    assert message in p.stderr and p.stdout == b""


def test_scripted_runs_do_not_import_litellm(env):
    code = (
        "import sys\nfrom dphil.commands.rollout import main\n"
        "rc = main(['-m', 'scripted:naive', '-n', '3', '--episodes', '1', '-q'], "
        "standalone_mode=False)\n"
        "assert rc == 0, rc\nassert 'litellm' not in sys.modules, 'litellm imported'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 1


def test_the_servers_reason_reaches_the_record_and_stderr(tmp_path, server, env):
    models = registry(tmp_path, server)
    server.script("local", status(400, body={"detail": "Server is pinned to '/models/x'; requested 'x'"}))
    p = run(
        [
            "dphil-rollout",
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "1",
            "--rounds",
            "1",
            "--models",
            models,
            "--concurrency",
            "1",
        ],
        env=env,
    )
    assert p.returncode == 75, p.stderr
    said = "Server is pinned to '/models/x'; requested 'x'"
    record = json.loads(p.stdout)
    assert record["status"] == "error" and said in record["error"] and "HTTP 400" in record["error"]
    assert said.encode() in p.stderr


def _peak_rss_mb(args, env, tmp_path):
    """Run a command and return (exit code, stdout, stderr, its own peak RSS in MiB)."""
    peak_file = tmp_path / "peak_rss_kb"
    with open(tmp_path / "stderr", "w+b") as err:
        proc = subprocess.run(
            measured(peak_file, list(args)),
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=600,
        )
        err.seek(0)
        return proc.returncode, proc.stdout, err.read(), int(peak_file.read_text()) / 1024  # KiB -> MiB


def test_a_200_mb_reply_is_an_error_and_memory_stays_bounded(tmp_path, server, env):
    models = registry(tmp_path, server)
    server.script("local", *[big(200_000_000)] * 4)  # two seats, each tried twice
    code, out, err, peak = _peak_rss_mb(
        [
            command_path("dphil-rollout"),
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "1",
            "--rounds",
            "1",
            "--models",
            models,
            "--retries",
            "1",
            "--concurrency",
            "2",
        ],
        env,
        tmp_path,
    )
    assert code == 75, err
    record = json.loads(out)
    assert record["status"] == "error" and record["turns"] == []
    assert "reply too large: more than 4,194,304 bytes" in record["error"]
    assert len(out) < 10_000  # nothing of the reply was kept
    # Holding the reply whole took about 2 GB; capped, the process stays near its idle size
    # (about 160 MB with litellm loaded).
    assert peak < 400, f"peak RSS {peak:.0f} MiB"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_reply_bytes_must_be_positive(value, env):
    p = run(["dphil-rollout", "-m", "gpt-5.4", "--max-reply-bytes", value], env=env)
    assert p.returncode == 64 and b"--max-reply-bytes" in p.stderr


def test_raw_replies_are_capped_in_records_with_a_flag(tmp_path, server, env):
    models = registry(tmp_path, server)
    long_reply = "x" * 100_000 + "\nACTION: think"
    server.script("local", text(long_reply, reasoning="r" * 70_000))
    p = run(
        [
            "dphil-rollout",
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "1",
            "--rounds",
            "1",
            "--models",
            models,
            "--concurrency",
            "1",
            "-q",
        ],
        env=env,
    )
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout)
    assert not list(validator("episode.schema.json").iter_errors(record))
    first, second = record["turns"]
    cut = first if first.get("raw_truncated") else second
    assert cut["raw"] == long_reply[:65536] and cut["raw_truncated"] is True
    assert cut["action"] == "think"  # parsed from the whole reply, not the kept part
    assert len(cut["reasoning"]) == 65536 and cut["reasoning_truncated"] is True
    other = second if cut is first else first
    assert "raw_truncated" not in other
