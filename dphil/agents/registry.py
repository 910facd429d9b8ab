"""Model aliases: which litellm model, server and key env variable a name such as `qwen3-14b`
stands for.

Registries are TOML data, parsed with tomllib and checked field by field, never
executed. The package ships the study's aliases (`models.toml`); users merge
their own over them with `--models FILE` or `DPHIL_MODELS` (several files
separated by the path separator). A name that is not an alias but contains a
`/` is taken as a raw litellm model id (`openai/gpt-5.4`, `ollama/qwen3:8b`),
reaching its server through litellm's own environment variables.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
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
}
# `tool_choice` for the action calls (talk calls always send "none"): "required" makes a
# server that constrains its output to the tools (llama.cpp) always return a tool call.
_TOOL_CHOICES = ("auto", "required")
# Parameters that would let a registry change where keys or requests go behind the
# user's back, or that dphil sets itself; they are refused in `params`.
_RESERVED_PARAMS = {
    "api_key",
    "api_base",
    "base_url",
    "messages",
    "tools",
    "tool_choice",
    "model",
    "timeout",
    "num_retries",
    "max_retries",
    "stream",
    "extra_headers",
    "headers",
}


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

    def __post_init__(self) -> None:
        if isinstance(self.api_base, list):
            object.__setattr__(self, "api_base", tuple(self.api_base))

    @property
    def bases(self) -> tuple[str, ...]:
        """The server URLs: the env variable named by `api_base_env` when set (several separated
        by commas), else `api_base` (one URL, or a list of servers that share the calls)."""
        if self.api_base_env:
            value = os.environ.get(self.api_base_env, "").strip()
            if value:
                return tuple(u.strip() for u in value.split(",") if u.strip())
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
        if entry.get("tool_choice", "auto") not in _TOOL_CHOICES:
            raise ConfigError(f"{where}: tool_choice must be one of {', '.join(_TOOL_CHOICES)}")
        bad = _RESERVED_PARAMS & set(entry.get("params", {}))
        if bad:
            raise ConfigError(f"{where}: params may not set {', '.join(sorted(bad))}")
        out[alias] = dict(entry)
    return out


def _check_bases(bases: list[Any], where: str) -> None:
    """A list of servers for one model: at least one, each an http(s) URL (exit 78 otherwise)."""
    if not bases:
        raise ConfigError(f"{where}: api_base is an empty list; give one URL or several")
    for k, url in enumerate(bases):
        if not is_url(url):
            raise ConfigError(f"{where}: api_base[{k}] = {url!r} is not an http(s) URL")


def is_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


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
            return ModelSpec(name=name, **entry)
        if "/" in name:
            return ModelSpec(name=name, model=name)
        known = ", ".join(sorted(self.entries))
        raise ConfigError(
            f"unknown model {name!r}: not an alias (known: {known}) nor a litellm id such as openai/gpt-5.4"
        )

    def __contains__(self, name: str) -> bool:
        return name in self.entries
