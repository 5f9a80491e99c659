"""Ctrl-C during training: the first one finishes the running step and saves a checkpoint (Trainer.fit)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from tqdm.auto import tqdm


class Interrupted:
    """Within this block the first SIGINT only sets ``requested`` (the loop checks it between steps); the second
    raises KeyboardInterrupt as usual. Outside the main thread, where no handler can be set, it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> Interrupted:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to stop at once)")

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
