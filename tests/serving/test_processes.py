"""Several servers for one model: a registry entry with a list of api_base URLs, spread by
litellm's Router, one server killed mid-run; and bad lists refused with the file and key."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dphil.agents.registry import ModelSpec, public_url
from tests.core.test_samples import validator
from tests.support.commands import command_path, run
from tests.support.openai_server import OpenAIServer

KEY = "sk-servers-SECRET-0123456789"


@pytest.fixture
def env():
    e = {**os.environ, "DPHIL_SERVERS_KEY": KEY}
    e.pop("DPHIL_MODELS", None)
    return e


def registry(tmp_path, bases):
    path = tmp_path / "models.toml"
    listed = ", ".join(json.dumps(b) for b in bases)
    path.write_text(
        f'[models.multi]\nmodel = "openai/multi"\napi_base = [{listed}]\napi_key_env = "DPHIL_SERVERS_KEY"\n'
    )
    return str(path)


def test_every_episode_completes_when_one_of_three_servers_dies(tmp_path, env):
    out = tmp_path / "out.jsonl"
    with OpenAIServer() as a, OpenAIServer() as b, OpenAIServer() as c:
        served_by_a = 5
        a.hold_after(served_by_a)  # a answers five calls, holds the sixth, then is killed
        proc = subprocess.Popen(
            [
                command_path("dphil-rollout"),
                "-m",
                "multi",
                "-n",
                "3",
                "--episodes",
                "8",
                "--rounds",
                "2",
                "--models",
                registry(tmp_path, [a.url, b.url, c.url]),
                "--concurrency",
                "4",
                "--retries",
                "4",
                "-o",
                str(out),
            ],
            env=env,
            stderr=subprocess.PIPE,
        )
        try:
            assert a.wait_arrived(served_by_a + 1), "the Router never used server a"
            a.stop()  # the held call's connection drops; later ones are refused
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        answered = {s.url: s.served for s in (a, b, c)}
    data = out.read_bytes()
    assert KEY.encode() not in data and KEY.encode() not in err
    records = [json.loads(x) for x in data.splitlines()]
    ids = [r["episode_id"] for r in records]
    assert len(ids) == len(set(ids)) == 8 and all(r["status"] == "complete" for r in records)
    schema = validator("episode.schema.json")
    assert not [e for r in records for e in schema.iter_errors(r)]
    turns = [t for r in records for t in r["turns"]]
    by_server = {url: sum(t["server"] == url for t in turns) for url in answered}
    assert sum(by_server.values()) == len(turns) == 8 * 3 * 2  # every turn says who answered
    assert by_server == answered  # each server's answers are in the records, once
    assert by_server[a.url] == served_by_a
    assert by_server[b.url] > 0 and by_server[c.url] > 0
    assert any(t["retries"] >= 1 for t in turns)  # the killed server's call was retried elsewhere


@pytest.mark.parametrize(
    ("bases", "message"),
    [
        ("[]", "api_base is an empty list"),
        ('["http://gpu1:8000/v1", "gpu2:8000"]', "api_base[1] = 'gpu2:8000' is not an http(s) URL"),
        ('["http://gpu1:8000/v1", 8000]', "api_base[1] = 8000 is not an http(s) URL"),
    ],
)
def test_a_bad_list_of_servers_is_exit_78_naming_file_and_key(tmp_path, env, bases, message):
    path = tmp_path / "bad.toml"
    path.write_text(f'[models.multi]\nmodel = "openai/multi"\napi_base = {bases}\n')
    p = run(["dphil-rollout", "-m", "multi", "-n", "2", "--models", str(path)], env=env)
    assert p.returncode == 78, p.stderr
    (line,) = p.stderr.decode().splitlines()
    assert str(path) in line and "models.'multi'" in line and message in line


def test_servers_from_the_environment_and_urls_fit_for_records(monkeypatch):
    monkeypatch.setenv("DPHIL_MULTI_URL", "http://gpu1:8000/v1, http://gpu2:8000/v1")
    spec = ModelSpec(name="m", model="hosted_vllm/m", api_base="http://x/v1", api_base_env="DPHIL_MULTI_URL")
    assert spec.bases == ("http://gpu1:8000/v1", "http://gpu2:8000/v1") and spec.base_url is None
    assert ModelSpec(name="m", model="m", api_base=["http://a/v1"]).bases == ("http://a/v1",)
    assert public_url("https://user:sk-secret@gpu1:8443/v1?key=abc#x") == "https://gpu1:8443/v1"
