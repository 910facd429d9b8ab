"""A hostile model registry: data is accepted, behaviour is refused (exit 78, one line naming file and key).

`params` may set only sampling and length parameters (`ALLOWED_PARAMS`), each checked for
type and range; litellm's `mock_response` (episodes "played" with no server), cost overrides
(a free model gets round `--cost-limit`) and anything else are refused. Every server URL is
http(s), whether the registry gives one, a list, or the environment variable `api_base_env`
names. Each case runs the installed command, with no server listening anywhere it names.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from dphil.agents.registry import ALLOWED_PARAMS, ModelSpec, Registry, parse_registry
from dphil.io.errors import ConfigError
from dphil.serving.processes import free_port
from tests.support.commands import run

ROLLOUT = ["-n", "2", "--rounds", "1", "--episodes", "1", "--no-check"]


@pytest.fixture
def env():
    return {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("DPHIL_")}


def registry(tmp_path, body: str, *, base: str | None = None) -> str:
    """A registry file with one alias `evil` on a port where nothing listens (unless `base`)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    api_base = "" if base == "" else f'api_base = "{base or url}"\n'
    path = tmp_path / "evil.toml"
    path.write_text(f'[models.evil]\nmodel = "hosted_vllm/evil"\n{api_base}{body}\n')
    return str(path)


def refused(proc, path: str, *words: str) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == 78, err
    assert proc.stdout == b""
    (line,) = err.splitlines()
    assert path in line and "models.'evil'" in line, line
    for word in words:
        assert word in line, line
    return line


@pytest.mark.parametrize(
    "params, key",
    [
        ('{ mock_response = "ACTION: eat" }', "mock_response"),  # complete episodes, tokens, no server
        ("{ input_cost_per_token = 0 }", "input_cost_per_token"),  # a free model gets round --cost-limit
        ("{ output_cost_per_token = 0.0, temperature = 0.5 }", "output_cost_per_token"),
        ('{ custom_llm_provider = "openai" }', "custom_llm_provider"),
        ('{ extra_headers = { Authorization = "x" } }', "extra_headers"),
        ("{ n = 5 }", "n"),
        ('{ api_base = "http://attacker.example/v1" }', "api_base"),
    ],
)
def test_params_that_change_behaviour_are_refused(tmp_path, env, params, key):
    path = registry(tmp_path, f"params = {params}")
    proc = run(["dphil-rollout", "-m", "evil", "--models", path, *ROLLOUT], env=env)
    refused(proc, path, f"params.{key}", "refused")


def test_mock_response_alone_is_refused_even_without_a_server(tmp_path, env):
    # As found: no api_base at all, and litellm "answered" every call itself.
    path = registry(tmp_path, 'params = { mock_response = "ACTION: eat" }', base="")
    proc = run(
        ["dphil-rollout", "-m", "evil", "--models", path, "-n", "2", "--rounds", "1", "--episodes", "1"], env=env
    )
    refused(proc, path, "params.mock_response", "without calling any server")


@pytest.mark.parametrize(
    "params, key",
    [
        ("{ max_tokens = 1000000000000000000000 }", "max_tokens"),  # exited 70
        ("{ max_tokens = 0 }", "max_tokens"),
        ("{ max_tokens = 1.5 }", "max_tokens"),
        ("{ temperature = nan }", "temperature"),
        ("{ temperature = inf }", "temperature"),
        ("{ temperature = true }", "temperature"),
        ("{ top_p = 2 }", "top_p"),
        ("{ stop = [] }", "stop"),
        ("{ stop = [1] }", "stop"),
        ('{ reasoning_effort = "maximal" }', "reasoning_effort"),
        ("{ logit_bias = { hello = 5 } }", "logit_bias"),
        ('{ thinking = { type = "enabled", budget_tokens = 0 } }', "thinking"),
    ],
)
def test_allowed_params_are_checked_for_type_and_range(tmp_path, env, params, key):
    path = registry(tmp_path, f"params = {params}")
    proc = run(["dphil-rollout", "-m", "evil", "--models", path, *ROLLOUT], env=env)
    refused(proc, path, f"params.{key}", "must be")


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "http+unix://%2Fvar%2Frun%2Fdocker.sock/v1", "/v1", "ftp://host/v1", "http://host:port/v1"],
)
def test_a_single_api_base_is_checked_like_a_list(tmp_path, env, url):
    path = registry(tmp_path, "", base=url)
    proc = run(["dphil-rollout", "-m", "evil", "--models", path, *ROLLOUT], env=env)
    refused(proc, path, "api_base", "not an http(s) URL")
    listed = tmp_path / "listed.toml"
    listed.write_text(f'[models.evil]\nmodel = "hosted_vllm/evil"\napi_base = ["{url}"]\n')
    assert run(["dphil-rollout", "-m", "evil", "--models", str(listed), *ROLLOUT], env=env).returncode == 78


@pytest.mark.parametrize("value", ["file:///etc/passwd", "http://127.0.0.1:9/v1, http+unix://%2Fsock/v1"])
def test_a_server_url_from_the_environment_is_checked_and_the_variable_named(tmp_path, env, value):
    path = registry(tmp_path, 'api_base_env = "DPHIL_EVIL_URL"')
    env["DPHIL_EVIL_URL"] = value
    for args in (["-m", "evil", *ROLLOUT], ["-m", "evil", "-n", "2"], ["--list-models", "--no-check"]):
        proc = run(["dphil-rollout", "--models", path, *args], env=env)
        err = proc.stderr.decode()
        assert proc.returncode == 78, (args, err)
        (line,) = err.splitlines()
        assert "DPHIL_EVIL_URL" in line and "not an http(s) URL" in line and "evil" in line


def test_a_built_in_alias_moved_by_its_variable_is_checked_too(env):
    env["DPHIL_QWEN3_14B_URL"] = "file:///etc/passwd"
    proc = run(["dphil-rollout", "-m", "qwen3-14b", *ROLLOUT], env=env)
    err = proc.stderr.decode()
    assert proc.returncode == 78 and proc.stdout == b"", err
    (line,) = err.splitlines()
    assert "DPHIL_QWEN3_14B_URL" in line and "file:///etc/passwd" in line


def test_a_password_in_a_refused_url_is_not_printed(tmp_path, env):
    path = registry(tmp_path, "", base="htp://user:hunter2-secret@host/v1?key=sk-abc")
    proc = run(["dphil-rollout", "-m", "evil", "--models", path, *ROLLOUT], env=env)
    line = refused(proc, path, "api_base", "htp://host/v1")
    assert "hunter2" not in line and "sk-abc" not in line


def test_the_shipped_registry_and_every_allowed_param_are_accepted():
    registry = Registry.load(use_env=False)
    for name in registry.entries:
        assert set(registry.resolve(name).params) <= set(ALLOWED_PARAMS)
    text = """
[models.all]
model = "hosted_vllm/all"
api_base = "https://gpu1.example:8443/v1"
params = { temperature = 0.6, top_p = 0.95, top_k = 20, min_p = 0.05, seed = 7, presence_penalty = 0.1, \
frequency_penalty = -0.1, repetition_penalty = 1.05, stop = ["<end_of_turn>", "\\n"], max_tokens = 1000000, \
max_completion_tokens = 64, logit_bias = { "50256" = -100 }, reasoning_effort = "low", verbosity = "low", \
thinking = { type = "enabled", budget_tokens = 1024 } }
"""
    entry = parse_registry(text, "all.toml")["all"]
    assert set(entry["params"]) == set(ALLOWED_PARAMS)
    assert parse_registry('[models.s]\nmodel = "m/s"\nparams = { stop = "\\n" }\n', "s.toml")["s"]["params"]


def test_a_spec_made_in_code_cannot_smuggle_behaviour_to_litellm():
    # Not from a registry file: the gateway checks the keys before anything reaches litellm.
    from dphil.agents.llm import Gateway

    spec = ModelSpec(
        name="coded",
        model="hosted_vllm/coded",
        api_base=f"http://127.0.0.1:{free_port()}/v1",
        params={"mock_response": "ACTION: eat"},
    )
    with pytest.raises(ConfigError, match=r"params\.mock_response"):
        asyncio.run(Gateway().complete(spec, [{"role": "user", "content": "hi"}]))


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", '"60"', "true"])
def test_a_model_timeout_must_be_seconds_above_zero(value):
    with pytest.raises(ConfigError, match="timeout"):
        parse_registry(f'[models.x]\nmodel = "openai/x"\ntimeout = {value}\n', "r.toml")


def test_the_offline_models_wait_longer_than_an_api_call():
    reg = Registry.load()
    assert reg.resolve("qwen2.5-0.5b").timeout == 900 and reg.resolve("gpt-5.4").timeout is None
