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

Run as a program (`python tests/support/openai_server.py --latency 0.1`) it serves in
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
    error with `code`, optional `retry_after` header and JSON `body`), `hang`
    (never answer), `drop` (close the connection without answering), `big` (a
    completion whose content is `size` bytes, streamed in 1 MiB chunks without a
    Content-Length, so the server never holds it whole).
    """

    kind: str = "ok"
    text: str | None = None
    tools: tuple[tuple[str, str], ...] = ()
    reasoning: str | None = None
    code: int = 200
    retry_after: str | None = None
    latency: float | None = None
    usage: tuple[int, int] | None = None
    body: Any = None
    size: int = 0


def tool(*names: str, arguments: str = "{}", text: str | None = None) -> Reply:
    """A reply calling the named tools in order (all with the same raw `arguments`)."""
    return Reply(text=text, tools=tuple((n, arguments) for n in names))


def text(content: str, reasoning: str | None = None) -> Reply:
    """A plain-text reply; `reasoning` goes in the `reasoning_content` field."""
    return Reply(text=content, reasoning=reasoning)


def status(code: int, retry_after: str | None = None, body: Any = None) -> Reply:
    """An HTTP error; `body` (JSON) replaces the default `{"error": {"message": ...}}`."""
    return Reply(kind="status", code=code, retry_after=retry_after, body=body)


def big(size: int) -> Reply:
    """A completion whose message content is `size` bytes of text."""
    return Reply(kind="big", size=size)


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
    capacity: int | None = None  # requests handled at once (a GPU's batch); None: unbounded
    arrived: int = 0
    served: int = 0

    def __post_init__(self) -> None:
        self._scripts: dict[str | None, deque[Reply]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._hold_from: int | None = None
        self._released: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
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

    # -- synchronising tests on events, not sleeps ---------------------------------
    def hold_after(self, count: int) -> None:
        """Answer the first `count` requests (from now on counting all so far), hold the rest
        until `release()`: a run can be stopped at a known point."""
        with self._lock:
            self._hold_from = count
        if self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.clear)

    def release(self) -> None:
        """Let held requests (and later ones) through."""
        with self._lock:
            self._hold_from = None
        if self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)

    def wait_arrived(self, count: int, timeout: float = 300.0) -> bool:
        """Block until `count` requests have arrived in all (True) or `timeout` passed (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.arrived >= count, timeout)

    def wait_served(self, count: int, timeout: float = 300.0) -> bool:
        """Block until `count` requests have been answered in all."""
        with self._changed:
            return self._changed.wait_for(lambda: self.served >= count, timeout)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- HTTP -------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        with self._changed:
            index = self.arrived
            self.arrived += 1
            held = self._hold_from is not None and index >= self._hold_from
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.keep_requests:
                self.requests.append(
                    {"body": body, "authorization": request.headers.get("Authorization"), "time": time.monotonic()}
                )
            self._changed.notify_all()
        try:
            if held:
                assert self._released is not None
                await self._released.wait()
            if self._slots is not None:
                async with self._slots:
                    return await self._answer(request, body)
            return await self._answer(request, body)
        finally:
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = await self._respond(request, body)
        with self._changed:
            self.served += 1
            self._changed.notify_all()
        return response

    async def _respond(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
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
            err = (
                reply.body
                if reply.body is not None
                else {"error": {"message": f"scripted {reply.code}", "type": "server_error", "code": str(reply.code)}}
            )
            return web.json_response(err, status=reply.code, headers=headers)
        if reply.kind == "big":
            return await _stream_big(request, body, reply.size)
        return web.json_response(_completion(body, reply))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._released = asyncio.Event()
        self._slots = asyncio.Semaphore(self.capacity) if self.capacity else None
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
        """Close the listener and every connection (held requests are dropped); idempotent."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _stream_big(request: web.Request, body: dict[str, Any], size: int) -> web.StreamResponse:
    """A valid completion of `size` bytes of content, written chunk by chunk (chunked encoding)."""
    marker = "@@CONTENT@@"
    head, tail = json.dumps(_completion(body, text(marker))).encode().split(marker.encode())
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(head)
    chunk = b"a" * (1 << 20)
    left = size
    try:
        while left > 0:
            await response.write(chunk[:left])
            left -= len(chunk)
        await response.write(tail)
        await response.write_eof()
    except ConnectionError:
        pass  # the client gave up reading, as it should
    return response


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tools:
        message["tool_calls"] = [
            {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": arguments}}
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
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tools else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument(
        "--capacity", type=int, default=None, help="requests handled at once (like a GPU server's batch)"
    )
    args = parser.parse_args()
    server = OpenAIServer(latency=args.latency, port=args.port, keep_requests=False, capacity=args.capacity).start()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
