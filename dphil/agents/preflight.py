"""Checking every model of a run before its first episode: fail in a second, with advice that works.

Without it a missing key or a server that is not running surfaces only after the
retries of the first calls (30 s), as error records in the output and a "try again
later" exit. Here each `-m` is resolved, the key an entry needs is looked up in the
environment, and every server URL is asked for `/models`; a configuration problem
exits 78 and an unreachable server 69, each with one line saying what to do, and
nothing is written. `dphil-rollout --list-models [--check]` shows the same facts for
every alias.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from dphil.agents.registry import ModelSpec, Registry, public_url
from dphil.io.errors import EX_UNAVAILABLE, ConfigError, DphilError
from dphil.io.safe import for_terminal

PROBE_TIMEOUT = 2.0  # seconds per server: a local server answers /models in milliseconds


@dataclass(frozen=True)
class ModelCheck:
    """What is known about one model before a call: where it is, whether its key and server are there."""

    name: str
    litellm_model: str
    urls: tuple[str, ...]  # public URLs (no credentials)
    url_env: str | None  # the variable that moves it to another server
    key_env: str | None  # the variable its key is read from
    key_set: bool | None  # None: the entry needs no key of its own
    answering: tuple[bool, ...] | None  # per URL; None: not probed
    description: str | None = None

    @property
    def problem(self) -> DphilError | None:
        """The first thing that would make every call of this model fail, as the error to raise."""
        if self.key_set is False:
            return ConfigError(
                f"{self.name}: the key is not set: export {self.key_env}=... "
                f"(the model is {self.litellm_model}; `dphil-rollout --list-models --check` shows every alias)"
            )
        if self.answering is not None and not any(self.answering):
            tried = ", ".join(self.urls)
            move = f", or point {self.url_env} at one that is" if self.url_env else ""
            what = f" ({self.description})" if self.description else ""
            return DphilError(
                f"{self.name}: no server answers at {tried}{what}: start it{move}; "
                f"`dphil-rollout --list-models --check` shows every alias",
                exit_code=EX_UNAVAILABLE,
            )
        return None

    def as_record(self) -> dict:
        return {
            "kind": "model",
            "name": self.name,
            "litellm_model": self.litellm_model,
            "urls": list(self.urls),
            "url_env": self.url_env,
            "key_env": self.key_env,
            "key_set": self.key_set,
            "answering": list(self.answering) if self.answering is not None else None,
            "description": self.description,
        }


def check_model(spec: ModelSpec, *, probe: bool = True) -> ModelCheck:
    """The facts about one resolved model; with `probe`, each of its server URLs is asked for /models."""
    urls = spec.bases
    provider_env = _provider_key_env(spec.model)
    key_env = spec.api_key_env or provider_env
    # A server of one's own (an api_base) may take no key; a hosted provider always needs one, and
    # so does a provider's client pointed at one's own server (litellm's `openai/` refuses to call
    # without a key, any value will do).
    required = key_env is not None and (not urls or spec.api_key_env is None)
    key_set = bool(os.environ.get(key_env, "").strip()) if required and key_env else None
    answering = None
    if probe and urls:
        key = spec.api_key()
        with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
            answering = tuple(pool.map(lambda u: answers(u, key), urls))
    return ModelCheck(
        name=spec.name,
        litellm_model=spec.model,
        urls=tuple(public_url(u) or "" for u in urls),
        url_env=spec.api_base_env,
        key_env=key_env,
        key_set=key_set,
        answering=answering,
        description=spec.description,
    )


def preflight(specs: Iterable[ModelSpec]) -> list[ModelCheck]:
    """Check every model of a run; raise the first problem (exit 78 before 69), else return the checks."""
    checks = [check_model(spec) for spec in specs]
    problems = [c.problem for c in checks if c.problem is not None]
    problems.sort(key=lambda e: e.exit_code != ConfigError.exit_code)
    if problems:
        raise problems[0]
    return checks


def list_models(registry: Registry, *, probe: bool) -> list[ModelCheck]:
    """Every alias of the registry in effect, checked (`--list-models [--check]`)."""
    return [check_model(registry.resolve(name), probe=probe) for name in sorted(registry.entries)]


def answers(url: str, key: str | None = None, *, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether an OpenAI-compatible server answers `GET {url}/models` (any HTTP reply counts:
    a 401 is a server that is up and wants a key, which the call itself will report)."""
    request = urllib.request.Request(url.rstrip("/") + "/models", method="GET")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read(1 << 16)
        return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _provider_key_env(model: str) -> str | None:
    """The key variable litellm reads for a raw provider id (`openai/gpt-5.4` -> OPENAI_API_KEY)."""
    provider = model.split("/", 1)[0] if "/" in model else ""
    return _PROVIDER_KEYS.get(provider)


# The hosted providers' own key variables (litellm's names), for raw ids given with -m.
_PROVIDER_KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "mistral": "MISTRAL_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "groq": "GROQ_API_KEY",
    "together_ai": "TOGETHERAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "xai": "XAI_API_KEY",
    "fireworks_ai": "FIREWORKS_AI_API_KEY",
}


@dataclass(frozen=True)
class ListRequest:
    """`dphil-rollout --list-models [--no-check]`: the registry in effect, each alias checked."""

    registries: tuple[str, ...] = ()
    probe: bool = True


def run_list(req: ListRequest, console: Any, stdout: IO[str] | None = None) -> int:
    """Write every alias: a table on a terminal, `kind: "model"` records in a pipe."""
    out = stdout if stdout is not None else sys.stdout
    checks = list_models(Registry.load(req.registries), probe=req.probe)
    if out.isatty():
        out.write(table(checks))
    else:
        out.writelines(json.dumps(c.as_record()) + "\n" for c in checks)
    out.flush()
    return 0


def table(checks: Iterable[ModelCheck]) -> str:
    """One line per alias: name, litellm id, where it runs, its key, whether it answers."""
    rows = [("alias", "litellm model", "server (variable)", "key", "answers")]
    for c in checks:
        where = ", ".join(c.urls) or "provider"
        if c.url_env:
            where += f" (${c.url_env})"
        key = "-"
        if c.key_env is not None:
            key = f"${c.key_env} " + ("set" if os.environ.get(c.key_env, "").strip() else "unset")
            if c.key_set is None and key.endswith("unset"):
                key += " (optional)"
        answers = "-" if c.answering is None else ("yes" if any(c.answering) else "no")
        rows.append((for_terminal(c.name), for_terminal(c.litellm_model), for_terminal(where), key, answers))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)
