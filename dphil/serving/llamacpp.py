"""llama.cpp's OpenAI-compatible server, from a prebuilt wheel: `python -m dphil.serving.llamacpp`.

`llama-cpp-python[server]` builds llama.cpp from source on install (about 14
minutes on two cores) and its build crashed here on the first completion;
`xllamacpp` ships prebuilt CPU wheels of llama.cpp together with its HTTP
server, so `pip install 'dphil[real]'` gives a working server in seconds. This
module is the missing command line: it maps llama-server's usual flags onto
xllamacpp's parameters, serves until SIGTERM or SIGINT, and exits.

The model answers to `--alias` (default: the file name without `.gguf`), so a
registry entry can name it without knowing where the file lives. A GGUF without
a chat template (a base model) gets dphil's template for its family
(`agents/chat_templates.toml`), found from the file's `general.architecture`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from dphil.io.errors import EX_DATAERR, EX_NOINPUT, EX_UNAVAILABLE, EX_USAGE


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dphil.serving.llamacpp",
        description="Serve a GGUF model with llama.cpp (xllamacpp) on an OpenAI-compatible HTTP API.",
    )
    p.add_argument("-m", "--model", required=True, metavar="FILE.gguf", help="the GGUF model file")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="listen port (default: %(default)s)")
    p.add_argument(
        "-a",
        "--alias",
        default=None,
        metavar="NAME",
        help="the model name clients send (default: the file name without .gguf)",
    )
    p.add_argument(
        "-np",
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="parallel slots: requests decoded together in one batch (default: %(default)s)",
    )
    p.add_argument(
        "-c", "--ctx-size", type=int, default=4096, metavar="TOKENS", help="context per slot (default: %(default)s)"
    )
    p.add_argument(
        "-t", "--threads", type=int, default=None, metavar="N", help="CPU threads (default: llama.cpp's choice)"
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="JINJA",
        help="a Jinja chat template (default: the file's own, else dphil's for its family)",
    )
    p.add_argument(
        "--jinja",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="render chat templates with llama.cpp's Jinja engine, which tool calling needs "
        "(default: on; --no-jinja uses its built-in formats)",
    )
    p.add_argument(
        "--lora",
        default=None,
        metavar="FILE.gguf",
        help="a LoRA adapter in llama.cpp's format, applied to every request (dphil writes one from a "
        "peft adapter: dphil.serving.lora_gguf)",
    )
    p.add_argument("--seed", type=int, default=None, help="sampling seed for requests that set none")
    p.add_argument("-v", "--verbose", action="store_true", help="llama.cpp's informational log on stderr")
    return p


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF type -> bytes
_STRING, _ARRAY = 8, 9
_MAX_FIELD = 1 << 26  # no key or string of a sane header is longer


def gguf_architecture(path: Path) -> tuple[str | None, bool]:
    """(general.architecture, whether the file carries a chat template), from the GGUF header.

    Only the key/value header is walked (values other than the architecture are skipped
    unread), which takes milliseconds where `gguf.GGUFReader` maps every tensor.
    """
    with open(path, "rb") as fh:

        def read(n: int) -> bytes:
            if n > _MAX_FIELD:
                raise ValueError(f"a header field claims {n} bytes")
            data = fh.read(n)
            if len(data) < n:
                raise ValueError("header ends early (truncated file?)")
            return data

        def u(n: int) -> int:
            return int.from_bytes(read(n), "little")

        def skip(kind: int) -> None:
            if kind == _STRING:
                fh.seek(u(8), 1)
            elif kind == _ARRAY:
                inner, count = u(4), u(8)
                if inner in _SCALAR:
                    fh.seek(_SCALAR[inner] * count, 1)
                else:
                    for _ in range(count):
                        skip(inner)
            else:
                fh.seek(_SCALAR[kind], 1)

        if fh.read(4) != b"GGUF":
            raise ValueError("no GGUF magic")
        u(4)  # version
        u(8)  # tensor count
        arch, has_template = None, False
        for _ in range(u(8)):
            key = read(u(8)).decode("utf-8", "replace")
            kind = u(4)
            if key == "general.architecture" and kind == _STRING:
                arch = read(u(8)).decode("utf-8", "replace")
                continue
            has_template = has_template or key == "tokenizer.chat_template"
            skip(kind)
    return arch, has_template


def default_template(path: Path) -> str | None:
    """dphil's chat template for a GGUF that has none of its own, else None."""
    from dphil.agents.chat_templates import for_family

    arch, has_template = gguf_architecture(path)
    if has_template:
        return None
    t = for_family(arch)
    return t.template if t is not None else None


_serving: list[object] = []  # the running server, never destroyed before os._exit


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    path = Path(args.model)
    name = "python -m dphil.serving.llamacpp"
    if not path.is_file():
        print(f"{name}: {path}: no such GGUF file", file=sys.stderr)
        return EX_NOINPUT
    if args.lora is not None and not Path(args.lora).is_file():
        print(f"{name}: {args.lora}: no such LoRA file", file=sys.stderr)
        return EX_NOINPUT
    if args.parallel < 1 or args.ctx_size < 64:
        print(f"{name}: --parallel must be >= 1 and --ctx-size >= 64", file=sys.stderr)
        return EX_USAGE
    try:
        template = args.chat_template or default_template(path)
    except (ValueError, KeyError, OSError, OverflowError, MemoryError) as e:
        print(f"{name}: {path}: not a readable GGUF file ({e})", file=sys.stderr)
        return EX_DATAERR
    try:
        import xllamacpp
    except ImportError:
        print(f"{name}: needs xllamacpp: pip install 'dphil[real]'", file=sys.stderr)
        return EX_UNAVAILABLE
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.hostnames = [args.host]
    params.port = args.port
    params.model_alias = {args.alias or path.name.removesuffix(".gguf")}
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size * args.parallel  # llama.cpp splits the context among the slots
    if args.threads:
        params.cpuparams.n_threads = args.threads
        params.cpuparams_batch.n_threads = args.threads
    params.use_jinja = args.jinja  # set, not left to the wheel's default: tool calls need it
    if template:
        params.chat_template = template
    if args.lora is not None:
        params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(str(args.lora), 1.0)]
    if args.seed is not None:
        params.sampling.seed = args.seed
    params.ui = False
    if not args.verbose:
        params.verbosity = 0
    # Block the stop signals before the server's threads start, so they inherit the mask
    # and the signal is taken here, by sigwait, and not by a thread that ignores it.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        server = xllamacpp.Server(params)  # loads the model and starts listening
    except Exception as e:  # xllamacpp raises RuntimeError/ValueError with llama.cpp's reason
        what = f"{path} with {args.lora}" if args.lora else str(path)
        print(f"{name}: {what}: cannot serve it: {e}", file=sys.stderr)
        return EX_DATAERR
    print(
        f"{name}: serving {path.name} as {sorted(params.model_alias)[0]!r} on "
        f"{server.listening_address}/v1 ({args.parallel} slot(s)"
        f"{', adapter ' + Path(args.lora).name if args.lora else ''})",
        file=sys.stderr,
        flush=True,
    )
    signal.sigwait(stop)
    # No graceful drain: with busy slots llama.cpp's shutdown waits for their replies (tens of
    # seconds on a CPU), and nothing here needs saving. The server is kept referenced so that
    # returning does not run its destructor; the caller's os._exit then ends every thread at once.
    _serving.append(server)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    os._exit(code)  # xllamacpp's threads must not keep a stopped server alive
