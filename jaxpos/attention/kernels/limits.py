"""The offsets j - i a kernel's query may see under its causal limit and local window, shared by the kernels' specs."""

from __future__ import annotations


class VisibleOffsets:
    """For a spec with `causal`, `q_offset` (query i sits at i + q_offset among the keys) and `half_window` (None:
    no window): the bounds of the visible j - i."""

    causal: bool
    q_offset: int
    half_window: int | None

    @property
    def upper(self) -> int | None:
        """The largest visible j - i (None: no limit): the causal limit or the window's far side, the nearer."""
        limits = ([self.q_offset] if self.causal else []) + (
            [] if self.half_window is None else [self.q_offset + self.half_window])
        return min(limits) if limits else None

    @property
    def lower(self) -> int | None:
        """The smallest visible j - i (None: no limit): the window's near side."""
        return None if self.half_window is None else self.q_offset - self.half_window
