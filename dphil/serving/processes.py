"""Local OpenAI-compatible model servers as child processes: started, awaited, stopped by pid.

The real-model tests and `bench/bench_servers.py` run a real server the way a
user would (llama.cpp through `python -m dphil.serving.llamacpp`, or `transformers
serve`) on a free loopback port. `LocalServer` starts one in its own process
group, waits until `/v1/models` lists the model (failing with the log's tail
if the process dies first), and always stops it again, by its pid, never by
name. Nothing here imports litellm, torch or the servers themselves.

A server in its own group does not get the signals its parent gets, and
Python's default SIGTERM ends a process without running `finally` blocks, so a
bench stopped with `kill` (or a Slurm job at its time limit) used to leave its
server running. While a server is up, a SIGTERM to the process that started it
raises SystemExit instead (only over the default handler, only from the main
thread), and servers still up at exit are stopped.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dphil.io.errors import EX_UNAVAILABLE, DphilError

HOST = "127.0.0.1"


class ServerError(DphilError):
    """A local server did not start or did not answer in time (exit 69)."""

    exit_code = EX_UNAVAILABLE


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class LocalServer:
    """One server process: `argv` must make it listen on `host:port` and serve `model`."""

    argv: list[str]
    model: str
    port: int
    host: str = HOST
    env: dict[str, str] = field(default_factory=dict)
    name: str = "server"
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL when stopping

    @property
    def url(self) -> str:
        """The OpenAI base URL (what a registry's `api_base` holds)."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 600.0) -> LocalServer:
        """Start the process and wait until it lists its model; ServerError when it cannot."""
        fd, log = tempfile.mkstemp(prefix=f"dphil-{self.name}-", suffix=".log")
        self.log_path = Path(log)
        with os.fdopen(fd, "wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        _track(self)
        try:
            self._await(timeout)
        except BaseException:  # a failed start, or Ctrl-C while waiting: never leave it running
            self.stop()
            raise
        return self

    def _await(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while not self.models_listed():
            if self.process.poll() is not None:
                raise ServerError(
                    f"{self.name} exited with status {self.process.returncode} "
                    f"before answering on {self.url}: {self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name} did not answer on {self.url} within {timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.5)

    def models_listed(self) -> bool:
        """Whether GET /v1/models answers and names this server's model."""
        try:
            with urllib.request.urlopen(f"{self.url}/models", timeout=5) as r:
                data = json.loads(r.read())
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return any(m.get("id") == self.model for m in data.get("data", []))

    def log_tail(self, lines: int = 5) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log)"

    def stop(self) -> None:
        """SIGTERM to the server's own process group (its pid), SIGKILL after `self.grace` seconds."""
        p = self.process
        if p is not None and p.poll() is None:
            for sig, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(p.pid, sig)  # the group this server leads: it and its children only
                except ProcessLookupError:
                    break
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None
        _untrack(self)

    def __enter__(self) -> LocalServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_live: list[LocalServer] = []  # servers started and not yet stopped, in this process


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through `with` and `finally`, which stop the servers


def _track(server: LocalServer) -> None:
    if (
        not _live
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if not any(s is server for s in _live):
        _live.append(server)


def _untrack(server: LocalServer) -> None:
    _live[:] = [s for s in _live if s is not server]
    if (
        not _live
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm
    ):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@atexit.register
def _stop_live() -> None:
    """Servers started without `with` or `stop()` are not left behind when Python exits."""
    for server in list(_live):
        server.stop()


def llamacpp_server(
    gguf: str | os.PathLike,
    *,
    port: int | None = None,
    parallel: int = 1,
    threads: int | None = None,
    ctx_size: int = 4096,
    alias: str | None = None,
    seed: int | None = 0,
    jinja: bool = True,
    lora: str | os.PathLike | None = None,
) -> LocalServer:
    """llama.cpp's server (xllamacpp, `python -m dphil.serving.llamacpp`) for a GGUF file, and an adapter."""
    path = Path(gguf)
    model = alias or path.name.removesuffix(".gguf")
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "dphil.serving.llamacpp",
        "-m",
        str(path),
        "--host",
        HOST,
        "--port",
        str(port),
        "--alias",
        model,
        "-np",
        str(parallel),
        "-c",
        str(ctx_size),
        "--jinja" if jinja else "--no-jinja",
    ]
    if threads:
        argv += ["-t", str(threads)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if lora is not None:
        argv += ["--lora", str(lora)]
    return LocalServer(argv, model, port, name="llama.cpp")


def transformers_server(
    model_dir: str | os.PathLike, *, port: int | None = None, threads: int | None = None, seed: int | None = 0
) -> LocalServer:
    """`transformers serve DIR` on the CPU. It answers only to the name it was started with,
    so the model name clients send is `str(model_dir)` exactly."""
    model = str(model_dir)
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--log-level",
        "warning",
    ]
    if seed is not None:
        argv += ["--default-seed", str(seed)]
    env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    return LocalServer(argv, model, port, env=env, name="transformers serve")


@dataclass(frozen=True)
class ServerKind:
    """A local server dphil can start: which weights it serves and how to start it."""

    name: str  # the key (`bench/bench_servers.py --servers NAME`)
    label: str  # as reports print it
    weights: str  # "gguf" (`dphil-weights --gguf-only`) or "hf" (a transformers directory)
    start: Callable[..., LocalServer]  # (weights path, *, parallel, threads) -> a server not yet started


def _start_llamacpp(weights: str | os.PathLike, *, parallel: int = 1, threads: int | None = None) -> LocalServer:
    return llamacpp_server(weights, parallel=parallel, threads=threads)


def _start_transformers(weights: str | os.PathLike, *, parallel: int = 1, threads: int | None = None) -> LocalServer:
    return transformers_server(weights, threads=threads)  # one request at a time: no slots to set


# The one table of local servers: the benches and the real-server tests start them from here.
SERVERS: dict[str, ServerKind] = {
    "llamacpp": ServerKind("llamacpp", "llama.cpp", "gguf", _start_llamacpp),
    "transformers": ServerKind("transformers", "transformers serve", "hf", _start_transformers),
}
