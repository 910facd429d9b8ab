"""dphil-rollout against real OpenAI-compatible servers running a real model (Gemma 3 270M base):
llama.cpp (xllamacpp, `python -m dphil.serving.llamacpp`) and `transformers serve`, with tools and
without; and what happens when no server answers at the registry's URL.

Only invariants are asserted, never what the model chose: every turn is one of the protocol's
actions or null with the raw reply kept, tokens and latency are recorded, episodes complete,
and dphil-score's replay agrees with the recorded outcomes.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import threading
from importlib.util import find_spec

import pytest

from dphil.core.protocols import PROTOCOLS
from dphil.serving.processes import free_port, llamacpp_server, transformers_server
from tests.support.commands import need_system_part, run

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
    need_system_part(
        find_spec("fastapi") is not None and find_spec("uvicorn") is not None,
        "transformers serve (pip install -e '.[real]': transformers[serving])",
    )
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
    p = run(
        [
            "dphil-rollout",
            "-m",
            tools,
            "-m",
            text,
            "-n",
            "3",
            "--episodes",
            "1",
            "--rounds",
            "2",
            *LEAN,
            "--concurrency",
            "3",
        ],
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr.decode()
    episodes = records(p.stdout)
    check_played(episodes, expected=2, tools={tools: True, text: False})
    tool_turns = [t for ep in episodes if ep["model"] == tools for t in ep["turns"]]
    # A constrained tool call always names a tool, so every tools-on turn is a legal action.
    assert all(t["parsed_via"] == "tool" and t["action"] in ACTIONS for t in tool_turns)
    assert {ep["tool_choice"] for ep in episodes if ep["model"] == tools} == {"required"}
    check_scored(p.stdout, env)


@pytest.mark.real_model
def test_transformers_serve_grid_with_tools_and_without(transformers_serve, tmp_path, env):
    # `transformers serve` answers only to the name it was started with: the directory's path.
    model = f"hosted_vllm/{transformers_serve.model}"
    reg = write_registry(
        tmp_path / "models.toml",
        {
            "ts-tools": f'model = "{model}"\napi_base = "{transformers_serve.url}"\nparams = {TEXT_PARAMS}',
            "ts-text": f'model = "{model}"\napi_base = "{transformers_serve.url}"\ntools = false\n'
            f"params = {TEXT_PARAMS}",
        },
    )
    p = run(
        [
            "dphil-rollout",
            "--models",
            reg,
            "-m",
            "ts-tools",
            "-m",
            "ts-text",
            "-n",
            "3",
            "--episodes",
            "1",
            "--rounds",
            "1",
            *LEAN,
            "--concurrency",
            "3",
        ],
        env=env,
        timeout=900,
    )
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
def test_no_server_at_the_url_errors_naming_it_exits_75_and_is_never_scored(where, tmp_path, env, request):
    url = f"http://127.0.0.1:{free_port()}/v1" if where == "not-running" else request.getfixturevalue("wrong_server")
    reg = write_registry(
        tmp_path / "models.toml",
        {
            "gone": f'model = "hosted_vllm/gemma-3-270m-q4_k_m"\napi_base = "{url}"\nparams = {TEXT_PARAMS}',
        },
    )
    args = ["dphil-rollout", "--models", reg, "-m", "gone", "-n", "3", "--episodes", "2", "--rounds", "2"]
    if where == "not-running":
        # Checked before the first episode: exit 69 at once, naming the URL, nothing written.
        checked = run(args, env=env)
        assert checked.returncode == 69 and checked.stdout == b"", checked.stderr.decode()
        assert url in checked.stderr.decode() and checked.stderr.count(b"\n") == 1
        args.append("--no-check")  # and without the check, the calls fail as errors, as before
    p = run([*args, "--retries", "1", "-q"], env=env)
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


# -- the pieces a real server run relies on, without one ---------------------------------------


def test_tool_choice_required_goes_to_action_calls_and_none_to_talk(monkeypatch):
    import asyncio

    from dphil.agents.agent import AgentSettings
    from dphil.agents.limits import Limits
    from dphil.agents.llm import Gateway
    from dphil.agents.prompts import builtin_prompt
    from dphil.agents.registry import ModelSpec
    from dphil.agents.runner import model_variant, play_episode
    from dphil.core.records import EpisodeConfig
    from tests.support.openai_server import OpenAIServer

    settings = AgentSettings(builtin_prompt(), talk=1)
    with OpenAIServer() as server:
        spec = ModelSpec(name="req", model="hosted_vllm/req", api_base=server.url, tool_choice="required")
        config = EpisodeConfig("req", 3, rounds=1, seed=0, variant=model_variant(spec, settings))
        record = asyncio.run(play_episode(config, spec, settings, Gateway(Limits(retries=0))))
        bodies = [r["body"] for r in server.requests]
    assert record["status"] == "complete" and record["tool_choice"] == "required"
    choices = sorted(b.get("tool_choice") for b in bodies)
    assert choices == ["none"] * 3 + ["required"] * 3  # one talk and one action call per seat
    plain = ModelSpec(name="req", model="hosted_vllm/req", api_base="http://x/v1")
    assert "tool_choice" not in plain.identity()  # ids of entries without the field are unchanged


def test_registry_refuses_an_unknown_tool_choice(tmp_path):
    from dphil.agents.registry import Registry
    from dphil.io.errors import ConfigError

    path = tmp_path / "m.toml"
    path.write_text('[models.x]\nmodel = "hosted_vllm/x"\ntool_choice = "always"\n')
    with pytest.raises(ConfigError, match="tool_choice must be one of auto, required"):
        Registry.load([path], use_env=False)
    assert Registry.load(use_env=False).resolve("gemma-3-270m-llamacpp").tool_choice == "required"


def gguf_header(arch: str, template: bool) -> bytes:
    """A GGUF file's start: magic, version 3, no tensors, then key/value pairs."""

    def string(s: str) -> bytes:
        return len(s.encode()).to_bytes(8, "little") + s.encode()

    kvs = [
        string("general.architecture") + (8).to_bytes(4, "little") + string(arch),
        string("tokenizer.ggml.scores")
        + (9).to_bytes(4, "little")
        + (6).to_bytes(4, "little")
        + (3).to_bytes(8, "little")
        + b"\0" * 12,
        string("tokenizer.ggml.tokens")
        + (9).to_bytes(4, "little")
        + (8).to_bytes(4, "little")
        + (2).to_bytes(8, "little")
        + string("<bos>")
        + string("hi"),
    ]
    if template:
        kvs.append(string("tokenizer.chat_template") + (8).to_bytes(4, "little") + string("{{ x }}"))
    return (
        b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + len(kvs).to_bytes(8, "little") + b"".join(kvs)
    )


def test_llamacpp_reads_the_architecture_and_supplies_a_template_only_when_missing(tmp_path):
    from dphil.serving.llamacpp import default_template, gguf_architecture

    bare, own = tmp_path / "bare.gguf", tmp_path / "own.gguf"
    bare.write_bytes(gguf_header("gemma3", template=False))
    own.write_bytes(gguf_header("gemma3", template=True))
    assert gguf_architecture(bare) == ("gemma3", False)
    assert gguf_architecture(own) == ("gemma3", True)
    assert "<start_of_turn>" in default_template(bare)
    assert default_template(own) is None


@pytest.mark.parametrize(
    ("content", "code", "says"),
    [
        (None, 66, "no such GGUF file"),
        (b"not a gguf at all", 65, "not a readable GGUF file (no GGUF magic)"),
        (b"GGUF\x03\x00\x00\x00" + b"\xff" * 40, 65, "not a readable GGUF file"),
    ],
)
def test_llamacpp_refuses_a_missing_or_broken_file_in_one_line(tmp_path, content, code, says):
    import subprocess
    import sys

    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    p = subprocess.run(
        [sys.executable, "-m", "dphil.serving.llamacpp", "-m", str(path), "--port", str(free_port())],
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == code
    err = p.stderr.decode()
    assert err.count("\n") == 1 and says in err and str(path) in err


def test_a_server_that_dies_before_answering_is_reported_with_its_log():
    import sys

    from dphil.serving.processes import LocalServer, ServerError

    s = LocalServer(
        [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"], "m", free_port(), name="dying"
    )
    with pytest.raises(
        ServerError,
        match=r"dying exited with status 3 before answering on http://127\.0\.0\.1:\d+/v1: "
        r"no model here",
    ):
        s.start(timeout=60)
    assert s.process.poll() == 3 and s.log_path is None  # stopped, its log removed


STUBBORN_SERVER = """
import json, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a server busy finishing a request: only SIGKILL stops it
class Models(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), Models).serve_forever()
"""

HOLDER = """
import sys, time
from dphil.serving.processes import LocalServer, free_port
port = free_port()
server = LocalServer([sys.executable, "-c", sys.argv[1], str(port)], "m", port, name="stubborn", grace=1.0)
if sys.argv[2] == "with":
    with server:
        print(server.process.pid, flush=True)
        time.sleep(600)
else:  # started and never stopped by the caller
    server.start(timeout=60)
    print(server.process.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["with", "bare"])
def test_sigterm_to_the_process_holding_a_server_stops_the_server_even_one_that_ignores_sigterm(how):
    import signal
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, STUBBORN_SERVER, how], stdout=subprocess.PIPE)
    pid = None
    try:
        pid = int(holder.stdout.readline())
        os.kill(pid, 0)  # the server is up, in its own process group
        assert os.getpgid(pid) == pid != os.getpgid(holder.pid)
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # stopped (SIGKILL after the grace) and reaped by the holder
            os.kill(pid, 0)
    finally:
        holder.kill()
        holder.wait()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
