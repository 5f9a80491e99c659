"""The request-body cap of ``fullband serve`` (``--max_body_bytes``) as ASGI middleware, answered so clients read it.

A server that answers 413 and closes before the client has sent its body makes a client that sends the whole body
before reading (Python's urllib, many others) see a connection reset instead. So the body of a refused request is
read and dropped first, up to :data:`DRAIN_LIMIT` bytes (a body declared larger than that is refused at once). A body
without a declared length (chunked) is read before the app sees it, at most one byte past the limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

DRAIN_LIMIT = 256 << 20  # bytes of a refused body read and dropped so the client can read the answer

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# refuse(scope, receive, send, size): send the 413 (size: the declared or counted bytes)
Refuse = Callable[[Scope, Receive, Send, int], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: a request whose body is over ``limit`` bytes gets ``refuse``'s answer instead of the app's."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int, refuse: Refuse) -> None:
        self.app, self.limit, self.refuse = app, limit, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared <= self.limit:
                await self.app(scope, receive, send)
                return
            if declared <= DRAIN_LIMIT:
                await drain(receive)
            await self.refuse(scope, receive, send, declared)
            return
        # No declared length (a chunked body): read it first, at most limit + 1 bytes, then hand it to the app.
        chunks, size, message = [], 0, {"more_body": True}
        while size <= self.limit and message.get("more_body", False):
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)  # the client left before its body ended
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
        if size > self.limit:
            await drain(receive)
            await self.refuse(scope, receive, send, size)
            return
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives back ``messages``."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


async def drain(receive: Receive, limit: int = DRAIN_LIMIT) -> None:
    """Read and drop what is left of the request body, up to ``limit`` bytes."""
    read = 0
    while read <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
