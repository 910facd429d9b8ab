"""dphil-rollout against real OpenAI-compatible servers running a real model (Gemma 3 270M base):
llama.cpp (xllamacpp, `python -m dphil.llamacpp`) and `transformers serve`, with tools and
without; and what happens when no server answers at the registry's URL.

Only invariants are asserted, never what the model chose: every turn is one of the protocol's
actions or null with the raw reply kept, tokens and latency are recorded, episodes complete,
and dphil-score's replay agrees with the recorded outcomes.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from importlib.util import find_spec

import pytest

from dphil.servers import free_port, llamacpp_server, transformers_server
from dphil.table import PROTOCOLS
from tests.conftest import need_system_part, run

ACTIONS = set(PROTOCOLS["paper"])
# The turn format's end and a new line end a text reply: `ACTION: eat` needs a handful of tokens.
# Lean: the short prompt (half the default's ~500 tokens, which a CPU must read every call).
LEAN = ["--prompt", "minimal", "--timeout", "600", "-q"]
TEXT_PARAMS = '{ max_tokens = 16, stop = ["<end_of_turn>", "\\n"], temperature = 1.0 }'


@pytest.fixture
def env():
    e = dict(os.environ)
    e.pop("DPHIL_MODELS", None)
    return e


def write_registry(path, entries: dict[str, str]) -> str:
    path.write_text("".join(f"[models.{name}]\n{body}\n" for name, body in entries.items()))
    return str(path)


def records(text: bytes) -> list[dict]:
    return [json.loads(line) for line in text.decode().splitlines()]


def check_played(episodes: list[dict], *, expected: int, tools: dict[str, bool]) -> None:
    """The invariants of a grid played by a real model, whatever it chose."""
    assert len(episodes) == expected
    for ep in episodes:
        assert ep["status"] == "complete", ep.get("error")
        assert ep["tools"] is tools[ep["model"]]
        assert ep["usage"]["prompt_tokens"] > 0 and ep["usage"]["completion_tokens"] > 0
        assert ep["usage"]["calls"] == len(ep["turns"]) == ep["n"] * ep["rounds_played"]
        for t in ep["turns"]:
            assert t["action"] is None or t["action"] in ACTIONS, t
            assert "raw" in t and t["usage"]["prompt_tokens"] > 0 and t["latency_s"] > 0
            if t["action"] is None:
                assert t["reason"] == "no-action" and t["parsed_via"] is None
            else:
                assert t["parsed_via"] is not None
            if t["tool_call"] is not None:
                assert tools[ep["model"]]
                assert t["parsed_via"] == "tool" or t["action"] is None


def check_scored(stdout: bytes, env) -> None:
    """dphil-score replays every turn through the engine and refuses a disagreeing record."""
    for reward in ("paper", "shaped"):
        scored = run(["dphil-score", "--reward", reward], input=stdout, env=env)
        assert scored.returncode == 0, scored.stderr.decode()
        for ep in records(scored.stdout):
            assert ep["reward"]["variant"] == reward and isinstance(ep["reward"]["total"], float)


@pytest.fixture(scope="module")
def llamacpp(real_model):
    need_system_part(find_spec("xllamacpp") is not None, "llama.cpp's server (pip install -e '.[real]': xllamacpp)")
    gguf, _ = real_model
    with llamacpp_server(gguf, parallel=3, threads=2) as server:
        yield server


@pytest.fixture(scope="module")
def transformers_serve(real_model):
    need_system_part(find_spec("fastapi") is not None and find_spec("uvicorn") is not None,
                     "transformers serve (pip install -e '.[real]': transformers[serving])")
    _, hf_dir = real_model
    with transformers_server(hf_dir, threads=2) as server:
        yield server


@pytest.mark.real_model
def test_llamacpp_grid_with_tools_and_without(llamacpp, env):
    # The shipped registry entries, pointed at this server by their URL variable.
    # Tools on: tool_choice "required" makes llama.cpp constrain the reply to one tool call.
    # Tools off: the base model writes text and dphil's text fallback reads what it can.
    env["DPHIL_GEMMA_LLAMACPP_URL"] = llamacpp.url
    tools, text = "gemma-3-270m-llamacpp", "gemma-3-270m-llamacpp-text"
    p = run(["dphil-rollout", "-m", tools, "-m", text, "-n", "3", "--episodes", "2", "--rounds", "2",
             *LEAN, "--concurrency", "3"], env=env, timeout=900)
    assert p.returncode == 0, p.stderr.decode()
    episodes = records(p.stdout)
    check_played(episodes, expected=4, tools={tools: True, text: False})
    tool_turns = [t for ep in episodes if ep["model"] == tools for t in ep["turns"]]
    # A constrained tool call always names a tool, so every tools-on turn is a legal action.
    assert all(t["parsed_via"] == "tool" and t["action"] in ACTIONS for t in tool_turns)
    assert {ep["tool_choice"] for ep in episodes if ep["model"] == tools} == {"required"}
    check_scored(p.stdout, env)


@pytest.mark.real_model
def test_transformers_serve_grid_with_tools_and_without(transformers_serve, tmp_path, env):
    # `transformers serve` answers only to the name it was started with: the directory's path.
    model = f"hosted_vllm/{transformers_serve.model}"
    reg = write_registry(tmp_path / "models.toml", {
        "ts-tools": f'model = "{model}"\napi_base = "{transformers_serve.url}"\n'
                    f"params = {TEXT_PARAMS}",
        "ts-text": f'model = "{model}"\napi_base = "{transformers_serve.url}"\ntools = false\n'
                   f"params = {TEXT_PARAMS}",
    })
    p = run(["dphil-rollout", "--models", reg, "-m", "ts-tools", "-m", "ts-text", "-n", "3",
             "--episodes", "1", "--rounds", "2", *LEAN, "--concurrency", "3"], env=env, timeout=900)
    assert p.returncode == 0, p.stderr.decode()
    check_played(records(p.stdout), expected=2, tools={"ts-tools": True, "ts-text": False})
    check_scored(p.stdout, env)


# -- no server at the URL: errors, never a model's inaction -----------------------------------


class _NotOpenAI(http.server.BaseHTTPRequestHandler):
    """Something else listening on the port: every request gets a 404 page."""

    def do_POST(self):
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>not here</html>")

    def log_message(self, *args):
        pass


@pytest.fixture
def wrong_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotOpenAI)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("where", ["not-running", "wrong-server"])
def test_no_server_at_the_url_errors_naming_it_exits_75_and_is_never_scored(where, tmp_path, env,
                                                                             request):
    url = f"http://127.0.0.1:{free_port()}/v1" if where == "not-running" else request.getfixturevalue("wrong_server")
    reg = write_registry(tmp_path / "models.toml", {
        "gone": f'model = "hosted_vllm/gemma-3-270m-q4_k_m"\napi_base = "{url}"\nparams = {TEXT_PARAMS}',
    })
    p = run(["dphil-rollout", "--models", reg, "-m", "gone", "-n", "3", "--episodes", "2",
             "--rounds", "2", "--retries", "1", "-q"], env=env)
    assert p.returncode == 75, p.stderr.decode()
    episodes = records(p.stdout)
    assert len(episodes) == 2
    for ep in episodes:
        assert ep["status"] == "error" and url in ep["error"], ep["error"]
        assert ep["turns"] == [] and ep["meals"] == [0, 0, 0]
    assert url in p.stderr.decode()
    scored = run(["dphil-score", "--shaped"], input=p.stdout, env=env)
    assert scored.returncode == 0, scored.stderr.decode()
    assert [ep["reward"] for ep in records(scored.stdout)] == [None, None]
