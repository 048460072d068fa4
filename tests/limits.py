"""Rate limiters as servers have them, on any clock: the test server's, and the simulations'.

Each `admit(now, cost)` either takes the call (None) or says how many seconds until it would
fit, which is what a 429's Retry-After says.
"""

from __future__ import annotations

from collections import deque


class SlidingWindow:
    """At most `limit` units (calls, or tokens) in any `window` seconds."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self._admitted: deque[tuple[float, int]] = deque()  # (when, units) inside the window
        self._used = 0

    def admit(self, now: float, cost: int = 1) -> float | None:
        """Take `cost` units, or the seconds until they would fit."""
        while self._admitted and self._admitted[0][0] <= now - self.window:
            self._used -= self._admitted.popleft()[1]
        if self._used + cost <= self.limit:
            self._admitted.append((now, cost))
            self._used += cost
            return None
        used = self._used
        for at, units in self._admitted:  # the oldest leave the window first
            used -= units
            if used + cost <= self.limit:
                return at + self.window - now
        return self.window  # larger than the whole limit: never admitted


class Bucket:
    """A token bucket refilled continuously (as OpenAI's limiter is): it holds `size` calls
    and gains `rate` a second; full at first, so a burst goes through."""

    def __init__(self, rate: float, size: int) -> None:
        self.rate, self.size = rate, size
        self._state: tuple[float, float] | None = None  # (calls it holds, when)

    def admit(self, now: float, cost: int = 1) -> float | None:
        """Take a call, or the seconds until the bucket holds one."""
        held, then = self._state or (float(self.size), now)
        held = min(float(self.size), held + (now - then) * self.rate)
        if held >= cost:
            self._state = (held - cost, now)
            return None
        self._state = (held, now)
        return (cost - held) / self.rate
