"""How long a call may take: sized to what the endpoint measurably does, not one fixed number.

A CPU server (llama.cpp) writes some tokens a second, one call at a time, and keeps writing
for a caller that gave up; a 60 s timeout on a reply of 2048 tokens then fails every call,
and each retry queues behind the abandoned one. So every successful call's speed (tokens a
second) is kept for its endpoint and model (the session's EndpointMemory, across stages),
and a call may take RAGEXAM_TIMEOUT, or SLACK times what its reply bound needs at that
speed, whichever is longer. A call that timed out doubles the allowance for the calls after
it (up to MAX_STRETCH), so a retry outlasts the abandoned call it queues behind.
"""

from __future__ import annotations

from ragexam.llm.endpoint import EndpointMemory

SLACK = 3.0  # times the measured time a bounded reply needs
MAX_STRETCH = 8.0
MIN_TOKENS = 16  # replies shorter than this say little about speed


class CallClock:
    """The timeout of each call of one model at one endpoint."""

    def __init__(self, floor: float, key: str, memory: EndpointMemory) -> None:
        self.floor, self.key, self.memory = floor, key, memory
        self.stretch = 1.0

    def timeout(self, limit: int) -> float:
        """Seconds a call whose reply is bounded by `limit` tokens may take."""
        speed = self.memory.speeds.get(self.key)
        needed = SLACK * limit / speed if speed else 0.0
        return max(self.floor, needed) * self.stretch

    def succeeded(self, tokens: int, seconds: float) -> None:
        """A reply of `tokens` took `seconds`: the endpoint's speed, smoothed."""
        if tokens >= MIN_TOKENS and seconds > 0:
            speed, known = tokens / seconds, self.memory.speeds.get(self.key)
            self.memory.speeds[self.key] = speed if known is None else 0.7 * known + 0.3 * speed

    def timed_out(self) -> None:
        """A call ran out of time: the calls after it get twice as long."""
        self.stretch = min(self.stretch * 2, MAX_STRETCH)
