"""Batches made ahead of the step that takes them: a background thread reads the data iterator (host-side packing
and masking), places each batch on the devices and queues it with the iterator's state after it, so that the
training step never waits for the host.

The state travels with its batch: a checkpoint saves the position after the last batch the loop took, not after
the ones made ahead, so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

_DONE = object()  # the thread's last item once it stops


class Prefetcher:
    """Iterates (device batch, data state after it) of `data` (an iterator with `get_state`), `depth` batches
    ahead, each placed by `place` (host arrays -> device arrays). depth=0 makes each batch when it is asked for, in
    the caller's thread, with None for its state (the iterator's own is then current: reading it can be a
    collective, which a step need not wait for). `close()` stops the thread; an error in it is raised where the
    batch is taken."""

    def __init__(self, data, place: Callable[[dict], dict], depth: int = 2):
        self.data, self.place = data, place
        self.closed = threading.Event()
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.thread = None
        if depth > 0:
            self.thread = threading.Thread(target=self._fill, name="jaxpos-prefetch", daemon=True)
            self.thread.start()

    def _make(self) -> tuple[dict, dict]:
        batch = self.place(next(self.data))
        return batch, self.data.get_state()  # on the thread, right after the batch it belongs to

    def _fill(self) -> None:
        try:
            while not self.closed.is_set():
                self._put(self._make())
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put(error)
        self._put(_DONE)

    def _put(self, item) -> None:
        while not self.closed.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        return self

    def __next__(self) -> tuple[dict, dict | None]:
        if self.thread is None:
            return self.place(next(self.data)), None
        item = self.queue.get()
        if item is _DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stops the thread (a batch it is making is finished and dropped)."""
        self.closed.set()
        if self.thread is not None:
            self.thread.join()
