"""One HTTP request's run in the engine: its engine requests (prompts x n choices), their events delivered on the
event loop, its deadline, and the client going away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request

from fullband.data.tokenizer import Tokenizer
from fullband.serve.engine import Engine, FinishEvent, GenerationRequest
from fullband.serve.schema import APIError
from fullband.serve.text import TextStream


class RequestRun:
    """The engine requests behind one HTTP request (prompts x n choices) and their events on this event loop."""

    def __init__(self, engine: Engine, requests: list[GenerationRequest], tokenizer: Tokenizer | None,
                 stops: list[str], timeout: float = 0.0) -> None:
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout > 0 else None
        loop = asyncio.get_running_loop()
        self.texts = [TextStream(tokenizer, stops) for _ in requests]
        self.finish: list[str | None] = [None] * len(requests)
        self.completion_tokens = 0

        def listener(index: int) -> Callable[[Any], None]:
            return lambda event: loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

        self.handles = engine.submit(requests, [listener(i) for i in range(len(requests))])

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()

    async def events(self, request: Request) -> AsyncIterator[tuple[int, str, Any]]:
        """(choice, text piece, token event or None) as they come, then (choice, text, finish reason) at the end
        of each choice. Raises APIError on an engine error (500), at the deadline (504) and when the engine
        cancelled the request itself (503, shutting down): a cut-short choice never gets a finish reason. Cancels
        everything if the client goes away."""
        watcher = asyncio.create_task(self._watch(request))
        try:
            while any(f is None for f in self.finish):
                index, event = await self._next()
                if index < 0:
                    return  # the client left
                if self.finish[index] is not None:
                    continue  # what comes after a stop string
                text = self.texts[index]
                if isinstance(event, FinishEvent):
                    if event.reason == "error":
                        raise APIError(500, event.error or "generation failed", None, "server_error")
                    if event.reason == "cancelled":  # not by us (we stop listening first): the engine shut down
                        raise APIError(503, "the server shut down before this request finished: retry it", None,
                                       "server_error", "server_shutting_down")
                    self.finish[index] = event.reason
                    yield index, text.flush(), None
                    yield index, "", self.finish[index]
                    continue
                self.completion_tokens += 1
                piece = text.add(event.token_id)
                yield index, piece, event
                if text.stopped:
                    self.handles[index].cancel()
                    self.finish[index] = "stop"
                    yield index, "", "stop"
        finally:
            watcher.cancel()
            self.cancel()  # no-op for finished sequences; frees the slots of a client that left

    async def _next(self) -> tuple[int, Any]:
        """The next event, or APIError 504 once the deadline has passed (the engine frees the slots)."""
        if self.deadline is None:
            return await self.queue.get()
        try:
            return await asyncio.wait_for(self.queue.get(), max(self.deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            self.cancel()
            raise APIError(504, f"the request did not finish within this server's limit of {self.timeout:g} s "
                                "(fullband serve --request_timeout): ask for fewer tokens or retry later", None,
                           "timeout", "request_timeout") from None

    async def _watch(self, request: Request) -> None:
        """Wait for the client to disconnect (the body is already read, so the next ASGI message says so)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.cancel()
        self.queue.put_nowait((-1, None))
