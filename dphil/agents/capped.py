"""Bounded replies: a model reply larger than `--max-reply-bytes` is abandoned while it is read.

litellm reads every HTTP body whole (httpx `send` without streaming), so a server that
answers with 200 MB would be held in memory, several times over while it is decoded. The
cap sits in the HTTP transport, below litellm: a reply whose Content-Length says it is too
big is refused before its body is read, and one without (chunked) is cut off as soon as the
bytes read pass the cap, so memory stays bounded whatever the server sends.

litellm has no public setting for the transport of its async clients, but both of its
factories (its own `AsyncHTTPHandler`, used by `hosted_vllm/` and most providers, and the
httpx client it hands the openai SDK) take it from `AsyncHTTPHandler._create_async_transport`;
`install` wraps that one function. The cap of the call in progress travels in a context
variable set by the gateway, so calls made by anything else are left alone.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_MAX_REPLY_BYTES = 4 * 1024 * 1024


@dataclass
class ReplyGuard:
    """The cap of one call, and whether its reply went over it."""

    limit: int
    exceeded: int | None = None  # bytes seen (or announced) when the reply was abandoned

    def describe(self) -> str:
        return (
            f"reply too large: more than {self.limit:,} bytes (read {self.exceeded:,} "
            f"before abandoning it; raise --max-reply-bytes to accept more)"
        )


class ReplyTooLarge(httpx.ReadError):
    """Raised inside the transport; litellm wraps it, so the gateway reads the guard instead."""


_guard: contextvars.ContextVar[ReplyGuard | None] = contextvars.ContextVar("dphil_reply_guard", default=None)


@contextlib.contextmanager
def guarded(limit: int) -> Iterator[ReplyGuard]:
    """Cap the replies of the calls made inside this block (and the tasks it starts)."""
    guard = ReplyGuard(limit)
    token = _guard.set(guard)
    try:
        yield guard
    finally:
        _guard.reset(token)


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, guard: ReplyGuard) -> None:
        self._inner = inner
        self._guard = guard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._guard.limit:
                self._guard.exceeded = seen
                raise ReplyTooLarge(self._guard.describe())
            yield chunk

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class CappedTransport(httpx.AsyncBaseTransport):
    """Wraps a transport so that reply bodies stop at the current call's cap."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        guard = _guard.get()
        if guard is None:
            return response
        announced = response.headers.get("content-length", "")
        if announced.isdigit() and int(announced) > guard.limit:
            guard.exceeded = int(announced)
            await response.aclose()
            raise ReplyTooLarge(guard.describe())
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, guard),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


_installed = False


def install() -> None:
    """Wrap the transport of every async HTTP client litellm creates from now on (once)."""
    global _installed
    if _installed:
        return
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    original = AsyncHTTPHandler._create_async_transport

    def capped_transport(ssl_context=None, ssl_verify=None, shared_session=None):
        inner = original(ssl_context=ssl_context, ssl_verify=ssl_verify, shared_session=shared_session)
        if inner is None:  # litellm's "let httpx choose": httpx's own transport, same TLS
            verify: Any = ssl_context if ssl_context is not None else (True if ssl_verify is None else ssl_verify)
            inner = httpx.AsyncHTTPTransport(verify=verify)
        return CappedTransport(inner)

    AsyncHTTPHandler._create_async_transport = staticmethod(capped_transport)
    _installed = True
