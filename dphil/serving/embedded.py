"""Models dphil serves itself: `-m qwen2.5-0.5b` starts llama.cpp for the run and stops it after.

A registry entry with `local = "CATALOGUE NAME"` and no server URL (neither `api_base` nor
the variable its `api_base_env` names) is *embedded*: before the first episode the run
assembles the catalogued GGUF from its installed parts (verified by sha256, once, into
dphil's cache), starts `python -m dphil.serving.llamacpp` on a free loopback port with one
slot per conversation the run keeps open, the model's own chat template and the catalogue's
context size, waits until it answers, and points the entry at it. The server is a child in its
own process group (`LocalServer`), stopped by pid when the run ends for any reason: normally,
on an error, on Ctrl-C or on SIGTERM. Setting the entry's URL variable uses your own running
server instead, as for any other entry.

The server answers to the model id's name after the provider (`hosted_vllm/NAME`), so the
litellm calls need nothing else.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from dphil.agents.registry import ModelSpec
from dphil.io.errors import ConfigError, DataError
from dphil.serving import catalogue, weights
from dphil.serving.processes import LocalServer, llamacpp_server

STARTUP_TIMEOUT = 300.0  # seconds to load a model and answer: a 1.5B GGUF loads in seconds
MAX_SLOTS = 64  # llama.cpp decodes all busy slots in one batch; more only costs memory

Warn = Callable[[str], None]


def slots_for(sizes: list[int], concurrency: int) -> tuple[int, int]:
    """(server slots, episodes in flight): one slot per philosopher of every episode in flight.

    As many episodes run at once as fit `concurrency` calls (at least one), so that every
    conversation keeps its own slot, and with it its cached prompt, from round to round.
    """
    n = max(sizes)
    episodes = max(1, min(concurrency, MAX_SLOTS) // n)
    return n * episodes, episodes


def served_name(spec: ModelSpec) -> str:
    """The name the server answers to: the model id after its provider prefix."""
    _provider, sep, name = spec.model.partition("/")
    if not sep or not name:
        raise ConfigError(
            f"model {spec.name!r}: local = {spec.local!r} needs a model id such as hosted_vllm/{spec.local}"
        )
    return name


@contextmanager
def embedded_servers(
    specs: Mapping[str, ModelSpec],
    *,
    slots: int,
    stride: int,
    warn: Warn,
    threads: int | None = None,
    cache: str | os.PathLike | None = None,
    adapter: str | os.PathLike | None = None,
) -> Iterator[dict[str, ModelSpec]]:
    """The specs with every embedded model pointed at a server started for it, stopped on exit.

    Entries that name the same catalogue model and served name share one server. Each
    episode in flight owns `stride` consecutive slots (`ModelSpec.lane_slots`). With
    `adapter` (a peft directory trained on a catalogue model), every server applies it,
    written for llama.cpp into a directory that lives as long as the servers.
    """
    with ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="dphil-lora-")) if adapter else None
        out = dict(specs)
        started: dict[tuple[str, str], LocalServer] = {}
        for alias, spec in specs.items():
            if not spec.embedded:
                continue
            assert spec.local is not None  # embedded implies a catalogue name
            key = (spec.local, served_name(spec))
            server = started.get(key)
            if server is None:
                model = catalogue.find(spec.local)
                base = weights.cache_dir() if cache is None else cache
                gguf = catalogue.assemble(
                    model,
                    os.path.join(base, model.file),
                    on_build=lambda p: warn(f"assembling {p} from the installed parts (once)"),
                )
                lora = None
                if adapter is not None:
                    assert scratch is not None
                    lora = adapter_for(model, gguf, adapter, Path(scratch) / f"{len(started)}.gguf")
                    warn(f"applying the adapter {adapter} to {model.name}")
                server = llamacpp_server(
                    gguf,
                    parallel=slots,
                    threads=threads,
                    ctx_size=int(model.server.get("ctx_size", 4096)),
                    alias=key[1],
                    jinja=bool(model.server.get("jinja", True)),
                    lora=lora,
                )
                warn(f"starting llama.cpp for {model.name} ({slots} slot(s)) on {server.url}")
                stack.enter_context(server)
                started[key] = server
            out[alias] = replace(spec, api_base=server.url, lane_slots=stride)
        yield out


def adapter_for(model: catalogue.Model, gguf: Path, adapter: str | os.PathLike, dest: Path) -> Path:
    """`adapter` written for llama.cpp over `gguf`; exit 65 when it was trained on another model.

    A peft adapter names its base directory; when that is a `dphil-weights --hf` conversion
    (it records the GGUF's sha256) it must be this catalogue model's.
    """
    from dphil.core.adapter_files import ADAPTER_CONFIG
    from dphil.serving.llamacpp import gguf_architecture
    from dphil.serving.lora_gguf import write_lora_gguf

    try:
        base = json.loads((Path(adapter) / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        base = None  # write_lora_gguf names what is wrong with the directory
    if isinstance(base, str):
        try:
            trained_on = json.loads((Path(base) / weights.MARKER).read_text(encoding="utf-8")).get("gguf_sha256")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            trained_on = None  # not a dphil conversion, or not on this machine: llama.cpp checks the shapes
        if trained_on is not None and trained_on != model.sha256:
            raise DataError(f"{adapter}: trained on {base}, which is not {model.name} (GGUF sha256 differs)")
    architecture, _ = gguf_architecture(gguf)
    if architecture is None:
        raise DataError(f"{gguf}: the GGUF names no architecture")
    return write_lora_gguf(adapter, dest, architecture=architecture)
