"""A small, real OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benches.

It speaks HTTP (aiohttp) on a background thread, so litellm and the openai
client talk to it exactly as to a provider: nothing is mocked. What it answers
is scripted: a queue of `Reply` objects per model name (or for any model),
then a default that picks a tool deterministically from the request's
content, so an episode is reproducible whatever order concurrent calls
arrive in. It records every request and the peak number in flight.

    with OpenAIServer(latency=0.01) as server:
        server.script("m", tool("eat"), status(429, retry_after="1"), text("ACTION: think"))
        ... litellm.acompletion(model="openai/m", api_base=server.url, api_key="sk-test", ...)

Run as a program (`python tests/openai_server.py --latency 0.1`) it serves in
the foreground and prints its URL, for benchmarks in a separate process.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    kind: `ok` (a completion with `text` and/or `tools`), `status` (an HTTP
    error with `code`, optional `retry_after` header), `hang` (never answer),
    `drop` (close the connection without answering).
    """

    kind: str = "ok"
    text: str | None = None
    tools: tuple[tuple[str, str], ...] = ()
    reasoning: str | None = None
    code: int = 200
    retry_after: str | None = None
    latency: float | None = None
    usage: tuple[int, int] | None = None


def tool(*names: str, arguments: str = "{}", text: str | None = None) -> Reply:
    """A reply calling the named tools in order (all with the same raw `arguments`)."""
    return Reply(text=text, tools=tuple((n, arguments) for n in names))


def text(content: str, reasoning: str | None = None) -> Reply:
    """A plain-text reply; `reasoning` goes in the `reasoning_content` field."""
    return Reply(text=content, reasoning=reasoning)


def status(code: int, retry_after: str | None = None) -> Reply:
    return Reply(kind="status", code=code, retry_after=retry_after)


HANG = Reply(kind="hang")
DROP = Reply(kind="drop")


def content_policy(body: dict[str, Any]) -> Reply:
    """The default: a tool chosen by a hash of the messages, or a short message when no tool
    may be called (`tool_choice: none` or no tools), so replies depend only on the request."""
    digest = hashlib.sha256(json.dumps(body.get("messages"), sort_keys=True).encode()).digest()
    tools = body.get("tools") or []
    if tools and body.get("tool_choice") != "none":
        name = tools[digest[0] % len(tools)]["function"]["name"]
        return tool(name)
    return text(f"note {digest[:3].hex()}")


@dataclass
class OpenAIServer:
    """The server; use as a context manager (or start()/stop())."""

    latency: float = 0.0
    default: Callable[[dict[str, Any]], Reply] = content_policy
    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    keep_requests: bool = True

    def __post_init__(self) -> None:
        self._scripts: dict[str | None, deque[Reply]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()

    # -- scripting --------------------------------------------------------------
    def script(self, model: str | None, *replies: Reply) -> None:
        """Queue replies for requests naming `model` (None: any model without its own queue)."""
        with self._lock:
            self._scripts.setdefault(model, deque()).extend(replies)

    def _next(self, body: dict[str, Any]) -> Reply:
        model = body.get("model")
        with self._lock:
            for key in (model, None):
                queue = self._scripts.get(key)
                if queue:
                    return queue.popleft()
        return self.default(body)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- HTTP -------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.keep_requests:
                self.requests.append(
                    {"body": body, "authorization": request.headers.get("Authorization"),
                     "time": time.monotonic()}
                )
        try:
            reply = self._next(body)
            delay = self.latency if reply.latency is None else reply.latency
            if reply.kind == "hang":
                await asyncio.sleep(3600)
            if delay:
                await asyncio.sleep(delay)
            if reply.kind == "drop":
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)  # never reaches the client
            if reply.kind == "status":
                headers = {"Retry-After": reply.retry_after} if reply.retry_after else {}
                err = {"error": {"message": f"scripted {reply.code}", "type": "server_error",
                                 "code": str(reply.code)}}
                return web.json_response(err, status=reply.code, headers=headers)
            return web.json_response(_completion(body, reply))
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        """Close the listener and connections, then cancel handlers still hanging."""
        await self._runner.cleanup()  # type: ignore[union-attr]
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def start(self) -> OpenAIServer:
        def main() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            self._started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._shutdown())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="openai-server", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("test OpenAI server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tools:
        message["tool_calls"] = [
            {"id": f"call_{k}", "type": "function",
             "function": {"name": name, "arguments": arguments}}
            for k, (name, arguments) in enumerate(reply.tools)
        ]
    if reply.usage is not None:
        prompt, completion = reply.usage
    else:
        prompt = len(json.dumps(body.get("messages", []))) // 4 + 1
        completion = len(reply.text or "") // 4 + 1 + 5 * len(reply.tools)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "test"),
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if reply.tools else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = OpenAIServer(latency=args.latency, port=args.port, keep_requests=False).start()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
