"""Before the first episode: a missing key or a server that is not there fails in a second, with advice."""

from __future__ import annotations

import json
import os

import pytest

from dphil.serving.processes import free_port
from tests.support.commands import run
from tests.support.openai_server import OpenAIServer, text


@pytest.fixture
def env():
    e = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("DPHIL_")}
    return e


def test_the_headline_usage_without_a_server_says_what_to_do_and_writes_nothing(env):
    port = free_port()  # nothing listens there
    env["DPHIL_QWEN3_14B_URL"] = f"http://127.0.0.1:{port}/v1"
    p = run(["dphil-rollout", "-m", "qwen3-14b", "-n", "5"], env=env)
    err = p.stderr.decode()
    assert p.returncode == 69, err
    assert p.stdout == b""
    assert err.count("\n") == 1
    assert f"http://127.0.0.1:{port}/v1" in err and "DPHIL_QWEN3_14B_URL" in err
    assert "ssl:" not in err and "--resume" not in err


def test_an_openai_client_on_a_local_server_still_needs_a_key(tmp_path, env):
    with OpenAIServer() as server:
        reg = tmp_path / "m.toml"
        reg.write_text(f'[models.local]\nmodel = "openai/local"\napi_base = "{server.url}"\n')
        p = run(["dphil-rollout", "-m", "local", "--models", str(reg), "-n", "2"], env=env)
    assert p.returncode == 78 and p.stdout == b"" and b"export OPENAI_API_KEY=" in p.stderr


def test_a_hosted_model_without_its_key_is_a_configuration_error(env):
    p = run(["dphil-rollout", "-m", "gpt-5.4", "-n", "5"], env=env)
    assert p.returncode == 78 and p.stdout == b""
    assert "export OPENAI_API_KEY=" in p.stderr.decode()
    raw = run(["dphil-rollout", "-m", "anthropic/claude-x", "-n", "5"], env=env)
    assert raw.returncode == 78 and b"ANTHROPIC_API_KEY" in raw.stderr


def test_a_running_server_passes_and_no_check_skips_the_probe(tmp_path, env):
    with OpenAIServer() as server:
        server.default = lambda body: text("ACTION: think")
        reg = tmp_path / "m.toml"
        reg.write_text(f'[models.local]\nmodel = "hosted_vllm/local"\napi_base = "{server.url}"\n')
        ok = run(
            ["dphil-rollout", "-m", "local", "--models", str(reg), "-n", "2", "--rounds", "1", "--episodes", "1"],
            env=env,
        )
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["status"] == "complete"
    # The server is gone: with --no-check the calls are made (and fail as errors), as before.
    args = ["-m", "local", "--models", str(reg), "-n", "2", "--rounds", "1", "--episodes", "1", "--retries", "0"]
    late = run(["dphil-rollout", *args, "--no-check"], env=env)
    assert late.returncode == 75 and json.loads(late.stdout)["status"] == "error"
    assert b"rerun with -o FILE (then --resume)" in late.stderr


def test_list_models_shows_every_alias_with_its_key_and_server(tmp_path, env):
    with OpenAIServer() as server:
        reg = tmp_path / "m.toml"
        reg.write_text(
            f'[models.up]\nmodel = "openai/up"\napi_base = "{server.url}"\n'
            f'[models.down]\nmodel = "openai/down"\napi_base = "http://127.0.0.1:{free_port()}/v1"\n'
        )
        env["OPENAI_API_KEY"] = "sk-listed-SECRET"
        p = run(["dphil-rollout", "--list-models", "--models", str(reg)], env=env)
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in map(json.loads, p.stdout.splitlines())}
    assert rows["up"]["answering"] == [True] and rows["down"]["answering"] == [False]
    assert rows["gpt-5.4"]["key_env"] == "OPENAI_API_KEY" and rows["gpt-5.4"]["key_set"] is True
    assert rows["claude-opus-4.7"]["key_set"] is False
    assert rows["qwen3-14b"]["url_env"] == "DPHIL_QWEN3_14B_URL"
    assert b"sk-listed-SECRET" not in p.stdout
    unchecked = run(["dphil-rollout", "--list-models", "--no-check", "--models", str(reg)], env=env)
    assert all(json.loads(r)["answering"] is None for r in unchecked.stdout.splitlines())
