"""Episode files for the viewer tests, made by the real commands.

`scripted` pipes dphil-rollout into dphil-score; `model_run` plays episodes
against the scripted OpenAI-compatible server (tests/support/openai_server.py), so the
turns carry real raw replies and tool calls, a reply with no readable action,
markup that a page must not execute, and one episode that ends in an error in
the middle of a sequential round.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.commands import run
from tests.support.openai_server import OpenAIServer, status, text, tool

# Episodes with every state: greedy (eating, starvation, a deadlock), naive (a
# round-1 deadlock), idle (null actions), dpbench under the sequential schedule.
SCRIPTED = [
    ["-m", "scripted:greedy", "-m", "scripted:naive", "-n", "5", "--episodes", "2", "--seed", "0"],
    ["-m", "scripted:idle", "-n", "3", "--episodes", "1", "--rounds", "3", "--seed", "0"],
    [
        "-m",
        "scripted:hierarchy",
        "-n",
        "4",
        "--rounds",
        "6",
        "--episodes",
        "1",
        "--protocol",
        "dpbench",
        "--schedule",
        "sequential",
        "--seed",
        "3",
    ],
]
HOSTILE = 'I am not sure </script><script>window.pwned = 1</script><img src=x onerror="window.pwned=1">'


def scripted(path: Path) -> Path:
    """The scripted episodes, scored under the paper reward, written to `path`."""
    rollouts = b""
    for args in SCRIPTED:
        p = run(["dphil-rollout", "-q", *args])
        assert p.returncode == 0, p.stderr
        rollouts += p.stdout
    p = run(["dphil-score", "-q"], input=rollouts)
    assert p.returncode == 0, p.stderr
    path.write_bytes(p.stdout)
    return path


def model_run(folder: Path) -> Path:
    """Two model episodes from a real local server (one complete, one errored), scored: folder/model.jsonl."""
    registry = folder / "models.toml"
    env = {k: v for k, v in os.environ.items() if k != "DPHIL_MODELS"}
    env["DPHIL_SHOW_KEY"] = "sk-show-test"
    with OpenAIServer() as server:
        registry.write_text(
            f'[models.chatty]\nmodel = "openai/chatty"\napi_base = "{server.url}"\napi_key_env = "DPHIL_SHOW_KEY"\n'
            f'[models.flaky]\nmodel = "openai/flaky"\napi_base = "{server.url}"\napi_key_env = "DPHIL_SHOW_KEY"\n'
        )
        server.script(
            "chatty", text(HOSTILE), tool("pick-up-left"), text("ACTION: pick-up-right"), tool("think", "eat")
        )
        server.script(
            "flaky", tool("pick-up-left"), tool("pick-up-left"), tool("think"), tool("think"), *[status(500)] * 8
        )
        p = run(
            [
                "dphil-rollout",
                "-q",
                "-m",
                "chatty",
                "-m",
                "flaky",
                "-n",
                "3",
                "--rounds",
                "3",
                "--episodes",
                "1",
                "--schedule",
                "sequential",
                "--retries",
                "0",
                "--models",
                str(registry),
            ],
            env=env,
        )
    assert p.returncode == 75, p.stderr  # the flaky episode ended in an error
    scored = run(["dphil-score", "-q"], input=p.stdout)
    assert scored.returncode == 0, scored.stderr
    out = folder / "model.jsonl"
    out.write_bytes(scored.stdout)
    return out
