"""Model aliases: which litellm model, server and key env variable a name such as `qwen3-14b`
stands for.

Registries are TOML data, parsed with tomllib and checked field by field, never
executed. They hold data, not behaviour: `params` may set only the sampling and
length parameters of `ALLOWED_PARAMS` (each type- and range-checked), so a registry
cannot make litellm fake replies (`mock_response`), price calls its own way
(`input_cost_per_token`) or send requests elsewhere; every server URL, whether from
`api_base` or the variable `api_base_env` names, must be http(s). The package
ships the study's aliases (`models.toml`); users merge their own over them with
`--models FILE` or `DPHIL_MODELS` (several files separated by the path separator).
A name that is not an alias but contains a `/` is taken as a raw litellm model id
(`openai/gpt-5.4`, `ollama/qwen3:8b`), reaching its server through litellm's own
environment variables.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dphil.io.errors import ConfigError, NoInputError

REGISTRY_ENV = "DPHIL_MODELS"

# Field name -> accepted types (bool is checked before int, as it is a subclass).
_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "api_base": (str, list),
    "api_base_env": (str,),
    "api_key_env": (str,),
    "tools": (bool,),
    "tool_choice": (str,),
    "params": (dict,),
    "description": (str,),
    "local": (str,),
    "timeout": (int, float),
}
# `tool_choice` for the action calls (talk calls always send "none"): "required" makes a
# server that constrains its output to the tools (llama.cpp) always return a tool call.
_TOOL_CHOICES = ("auto", "required")
# `local` names a model of dphil's offline catalogue (`dphil-weights --list`), served by llama.cpp.
_LOCAL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
# Upper bound on max_tokens / max_completion_tokens (and thinking budgets): far above any
# model's context, far below what overflows a server's integer parsing.
MAX_TOKENS_LIMIT = 1_000_000
_REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_VERBOSITIES = ("low", "medium", "high")
_MAX_STOPS = 16
_MAX_STOP_CHARS = 1_000
_MAX_LOGIT_BIAS = 1_000


def _number(low: float, high: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not low <= v <= high:
            return f"must be a number from {low:g} to {high:g}"
        return None

    return check


def _integer(low: int, high: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            return f"must be a whole number from {low:,} to {high:,}"
        return None

    return check


def _choice(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


def _stop(v: Any) -> str | None:
    stops = [v] if isinstance(v, str) else v
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= _MAX_STOPS
        or not all(isinstance(x, str) and 0 < len(x) <= _MAX_STOP_CHARS for x in stops)
    ):
        return f"must be a string or a list of 1 to {_MAX_STOPS} strings of 1 to {_MAX_STOP_CHARS:,} characters"
    return None


def _logit_bias(v: Any) -> str | None:
    bias = _number(-100, 100)
    if (
        not isinstance(v, dict)
        or len(v) > _MAX_LOGIT_BIAS
        or not all(k.isdigit() and bias(x) is None for k, x in v.items())
    ):
        return f"must be a table of at most {_MAX_LOGIT_BIAS:,} token ids (as keys) to numbers from -100 to 100"
    return None


def _thinking(v: Any) -> str | None:
    if v == {"type": "disabled"}:
        return None
    budget = _integer(1, MAX_TOKENS_LIMIT)
    if (
        isinstance(v, dict)
        and v.keys() == {"type", "budget_tokens"}
        and v["type"] == "enabled"
        and budget(v["budget_tokens"]) is None
    ):
        return None
    return f'must be {{ type = "enabled", budget_tokens = 1..{MAX_TOKENS_LIMIT:,} }} or {{ type = "disabled" }}'


# The `params` a registry entry may pass to litellm on every call, each with its check: sampling
# and reply length only (the list and the providers that read each are in docs/models.md). Anything
# else is behaviour, not data (litellm's `mock_response` answers without any server, the
# `*_cost_per_token` fields change the accounting `--cost-limit` relies on, `api_base`,
# `custom_llm_provider` or headers move requests, `n` buys replies nobody reads) and is refused
# with the file, alias and key (exit 78).
ALLOWED_PARAMS: dict[str, Callable[[Any], str | None]] = {
    "temperature": _number(0, 100),
    "top_p": _number(0, 1),
    "top_k": _integer(-1, 1_000_000),
    "min_p": _number(0, 1),
    "seed": _integer(-(2**63), 2**63 - 1),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "repetition_penalty": _number(0, 10),
    "stop": _stop,
    "max_tokens": _integer(1, MAX_TOKENS_LIMIT),
    "max_completion_tokens": _integer(1, MAX_TOKENS_LIMIT),
    "logit_bias": _logit_bias,
    "reasoning_effort": _choice(*_REASONING_EFFORTS),
    "verbosity": _choice(*_VERBOSITIES),
    "thinking": _thinking,
}
# Why some keys people reach for are refused (the rest get the list of what is allowed).
_REFUSED_WHY = {
    "mock_response": "it makes litellm answer without calling any server",
    "api_key": "keys come from the variable api_key_env names",
    "api_base": "servers are the entry's api_base field",
    "base_url": "servers are the entry's api_base field",
    "custom_llm_provider": "the provider is the model id's prefix",
    "n": "dphil reads one reply per call",
}


def check_params(params: Mapping[str, Any], where: str) -> None:
    """Every key of `params` allowed and its value in range; ConfigError (exit 78) naming `where`."""
    for key, value in params.items():
        check = ALLOWED_PARAMS.get(key)
        if check is None:
            if "cost" in key or key in ("input_cost_per_second", "output_cost_per_second"):
                why = "cost fields would change the accounting --cost-limit relies on"
            else:
                why = _REFUSED_WHY.get(key) or f"allowed: {', '.join(ALLOWED_PARAMS)}"
            raise ConfigError(f"{where}: params.{key} is refused ({why})")
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"{where}: params.{key} {problem}")


@dataclass(frozen=True)
class ModelSpec:
    """How to call one model. The API key itself is never stored, only where to read it."""

    name: str
    model: str
    api_base: str | tuple[str, ...] | None = None
    api_base_env: str | None = None
    api_key_env: str | None = None
    tools: bool = True
    tool_choice: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    local: str | None = None  # a catalogue model dphil serves itself when no server URL is given
    # Seconds before one call is abandoned, unless the run sets --timeout: a CPU model's first
    # round evaluates every seat's whole prompt at once and takes minutes, an API call seconds.
    timeout: float | None = None
    # Set by a run for a server it started (never read from a registry): each episode in flight
    # owns this many consecutive slots, one per seat, so every conversation keeps its cache.
    lane_slots: int | None = None

    @property
    def embedded(self) -> bool:
        """Whether dphil starts this model's server itself (a `local` entry with no URL set)."""
        return self.local is not None and not self.bases

    def __post_init__(self) -> None:
        if isinstance(self.api_base, list):
            object.__setattr__(self, "api_base", tuple(self.api_base))

    @property
    def bases(self) -> tuple[str, ...]:
        """The server URLs: the env variable named by `api_base_env` when set (several separated
        by commas), else `api_base` (one URL, or a list of servers that share the calls).

        Each URL from the variable must be http(s), like the registry's own: ConfigError
        (exit 78) naming the variable otherwise."""
        if self.api_base_env:
            value = os.environ.get(self.api_base_env, "").strip()
            if value:
                urls = tuple(u.strip() for u in value.split(",") if u.strip())
                for url in urls:
                    if not is_url(url):
                        raise ConfigError(
                            f"{self.api_base_env}: {_shown(url)} is not an http(s) URL "
                            f"(the server of model {self.name!r})"
                        )
                return urls
        if isinstance(self.api_base, tuple):
            return self.api_base
        return (self.api_base,) if self.api_base else ()

    @property
    def base_url(self) -> str | None:
        """The server URL of a single-server entry (None when there is none, or several)."""
        bases = self.bases
        return bases[0] if len(bases) == 1 else None

    def api_key(self) -> str | None:
        """The key from the environment at call time (None: litellm's own lookup applies)."""
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        return None

    def identity(self) -> dict[str, Any]:
        """What of this spec changes the measurement, for the episode id: the model id,
        the tool mode and the sampling parameters (not the server URL, which moves)."""
        out: dict[str, Any] = {"litellm_model": self.model, "tools": self.tools}
        if self.tool_choice:
            out["tool_choice"] = self.tool_choice
        if self.params:
            out["sampling"] = dict(sorted(self.params.items()))
        return out


def default_registry_text() -> str:
    return resources.files(__package__).joinpath("models.toml").read_text(encoding="utf-8")


def parse_registry(text: str, source: str) -> dict[str, dict[str, Any]]:
    """Alias -> entry fields, from TOML text; ConfigError names the source and the alias."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: {e}") from None
    unknown_top = set(data) - {"models"}
    if unknown_top:
        raise ConfigError(f"{source}: unknown table(s) {sorted(unknown_top)}; expected [models.NAME]")
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{source}: 'models' must be a table of [models.NAME] tables")
    out: dict[str, dict[str, Any]] = {}
    for alias, entry in models.items():
        where = f"{source}: models.{alias!r}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a table")
        for key, value in entry.items():
            if key not in _FIELDS:
                raise ConfigError(f"{where}: unknown field {key!r} (known: {', '.join(_FIELDS)})")
            if not isinstance(value, _FIELDS[key]) or (key != "tools" and isinstance(value, bool)):
                raise ConfigError(f"{where}: field {key!r} has the wrong type")
        if isinstance(entry.get("api_base"), list):
            _check_bases(entry["api_base"], where)
        elif "api_base" in entry and not is_url(entry["api_base"]):
            raise ConfigError(f"{where}: api_base = {_shown(entry['api_base'])} is not an http(s) URL")
        if "local" in entry and not _LOCAL_NAME.fullmatch(entry["local"]):
            raise ConfigError(f"{where}: local = {entry['local']!r} is not a catalogue model name")
        if "timeout" in entry and not (math.isfinite(entry["timeout"]) and entry["timeout"] > 0):
            raise ConfigError(f"{where}: timeout must be a number of seconds > 0")
        if entry.get("tool_choice", "auto") not in _TOOL_CHOICES:
            raise ConfigError(f"{where}: tool_choice must be one of {', '.join(_TOOL_CHOICES)}")
        check_params(entry.get("params", {}), where)
        out[alias] = dict(entry)
    return out


def _check_bases(bases: list[Any], where: str) -> None:
    """A list of servers for one model: at least one, each an http(s) URL (exit 78 otherwise)."""
    if not bases:
        raise ConfigError(f"{where}: api_base is an empty list; give one URL or several")
    for k, url in enumerate(bases):
        if not is_url(url):
            raise ConfigError(f"{where}: api_base[{k}] = {_shown(url)} is not an http(s) URL")


def is_url(value: Any) -> bool:
    """An http(s) URL with a host (not file:, http+unix:, or a bare path)."""
    if not isinstance(value, str):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _shown(value: Any) -> str:
    """A refused server URL fit for a message: no user, password, query or fragment, cut short."""
    if not isinstance(value, str):
        return repr(value)
    scheme, sep, rest = value.partition("://")
    if sep:
        netloc, slash, path = rest.partition("/")
        value = f"{scheme}://{netloc.rsplit('@', 1)[-1]}{slash}{path}"
    value = value.split("?", 1)[0].split("#", 1)[0]
    return repr(value if len(value) <= 120 else value[:119] + "…")


def public_url(url: str | None) -> str | None:
    """A server URL fit for records and messages: no user, password, query or fragment."""
    if not url:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Registry:
    """The aliases in effect: the packaged ones with the user's files merged over them."""

    def __init__(self, entries: Mapping[str, dict[str, Any]]) -> None:
        self.entries = dict(entries)

    @classmethod
    def load(cls, files: Iterable[str | os.PathLike] = (), *, use_env: bool = True) -> Registry:
        """The default registry, then DPHIL_MODELS files, then `files`, each merged key by key."""
        entries = parse_registry(default_registry_text(), "dphil/agents/models.toml")
        paths: list[str | os.PathLike] = []
        if use_env and os.environ.get(REGISTRY_ENV):
            paths.extend(p for p in os.environ[REGISTRY_ENV].split(os.pathsep) if p)
        paths.extend(files)
        for path in paths:
            p = Path(path)
            try:
                text = p.read_text(encoding="utf-8-sig")
            except FileNotFoundError:
                raise NoInputError(f"{p}: no such model registry") from None
            except (OSError, UnicodeDecodeError) as e:
                raise NoInputError(f"{p}: cannot read model registry: {e}") from None
            for alias, entry in parse_registry(text, str(p)).items():
                merged = {**entries.get(alias, {}), **entry}
                if "params" in entry and "params" in entries.get(alias, {}):
                    merged["params"] = {**entries[alias]["params"], **entry["params"]}
                entries[alias] = merged
        for alias, entry in entries.items():
            if "model" not in entry:
                raise ConfigError(f"model alias {alias!r} has no 'model' (a litellm model id)")
        return cls(entries)

    def resolve(self, name: str) -> ModelSpec:
        """The spec for an alias, or for a raw litellm id (anything with a `/`)."""
        entry = self.entries.get(name)
        if entry is not None:
            spec = ModelSpec(name=name, **entry)
            spec.bases  # noqa: B018 - the server URLs from the environment are checked now (exit 78)
            return spec
        if "/" in name:
            return ModelSpec(name=name, model=name)
        known = ", ".join(sorted(self.entries))
        raise ConfigError(
            f"unknown model {name!r}: not an alias (known: {known}) nor a litellm id such as openai/gpt-5.4"
        )

    def __contains__(self, name: str) -> bool:
        return name in self.entries
