"""Pacing of one model's calls: an adaptive window of calls in flight, and optional rpm/tpm limits.

The window adapts the way TCP congestion control does (AIMD). Each call that succeeds widens
it by 1/window, so a window's worth of successes adds one call in flight (a quarter of one
once a 429 was seen: a sliding window remembers an overshoot, so growth is slow). A 429 shrinks it,
at most once per round trip and only for calls sent after the last cut (as TCP's fast
recovery treats the losses of one round trip as one), by the share of 429s among the calls
that ended since the last cut, and by at most 1 - MIN_DECREASE. It never goes above
--concurrency or below one call. Two more habits come from TCP: once a 429 was seen, sends
are spread over the round trip instead of going out in bursts (pacing), and STORM 429s in a
row (a limit reached, not bad luck) hold new calls until the server's Retry-After is over,
and cut the window once more, so that the calls let go after the hold are not a burst.

The first such storm also teaches the limit's rate (LearnedRate): from then on calls are
paced just under it, and that rate, not the window, is what later 429s cut. A window
alone meets a limit counted over seconds or a minute in waves: it learns of the limit
only when the window is full, and a window's worth of calls then meets 429s.

No maintained library adapts a concurrency limit to 429s (aimd-limiter and
adaptive-concurrency on PyPI are young single releases), so the window is written here;
the --rpm pacing is aiolimiter's leaky bucket, sized so it never bursts. --tpm books each
call's tokens on a schedule instead (GCRA): a bucket must hold the largest call, and that
much at once is a burst that a sliding-window limit shorter than a minute refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from math import ceil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

MIN_DECREASE = 0.7
STORM = 3  # 429s in a row: the limit is reached, not bad luck
GROWTH_AFTER_429 = 0.25  # once a limit was met, a round trip of successes adds 1/4 call
MARGIN = 0.95  # --rpm, --tpm and a learned rate pace at this share of the limit
HORIZON = 60.0  # seconds of sends kept to learn a rate from: the longest common limit window
GROWTH = 0.05  # a learned rate grows by this share per window of successes
DECREASE = 0.93  # a 429 cuts a learned rate to this share ...
CUT_EVERY = 1.0  # ... at most once in this many seconds
STORM_DECREASE = 0.7  # a later storm cuts it to this share at least
MIN_SPAN = 1.0  # seconds: no limit counts over less; a storm sooner follows a bucket's burst
GROWTH_PERIOD = 5.0  # the rate grows by GROWTH per window, but no faster than per these seconds


@dataclass
class Traffic:
    """What one model's calls did so far, for the progress bar and the manifest."""

    calls: int = 0
    retries: int = 0
    rate_limited: int = 0
    pause_until: float = 0.0  # monotonic time when the longest wait under way ends
    learned_rpm: int | None = None  # the server's limit, as learned here or carried in
    carried_rpm: int | None = None  # the rate an earlier stage or run learned, paced from
    first_sent: float = 0.0
    last_done: float = 0.0
    admitted: int = 0  # calls that were not answered 429

    def pause(self) -> float:
        """Seconds left of the longest wait under way (0 when none)."""
        return max(0.0, self.pause_until - time.monotonic())

    def wait(self, seconds: float) -> None:
        """A row starts waiting `seconds` before its next attempt."""
        self.pause_until = max(self.pause_until, time.monotonic() + seconds)

    def admitted_rpm(self) -> int | None:
        """Calls a minute the endpoint answered, other than with a 429, over the stage."""
        span = self.last_done - self.first_sent
        return round(self.admitted / span * 60) if self.admitted > 1 and span > 0 else None

    def advised_rpm(self) -> int | None:
        """The --rpm to advise: the limit learned, never below what the endpoint admitted."""
        if not self.learned_rpm:
            return None
        return max(self.learned_rpm, self.admitted_rpm() or 0)

    def record(self) -> dict[str, int | None]:
        """The counters that go into the manifest."""
        return {
            "retries": self.retries,
            "rate_limited": self.rate_limited,
            "learned_rpm": self.learned_rpm,
            "carried_rpm": self.carried_rpm,
            "admitted_rpm": self.admitted_rpm(),
        }


class Pacer:
    """Admits calls: at most `window` in flight, and no faster than --rpm and --tpm allow."""

    def __init__(
        self,
        ceiling: int,
        rpm: int | None = None,
        tpm: int | None = None,
        known: tuple[float, float] | None = None,
        sends: deque[float] | None = None,
    ) -> None:
        self.ceiling = ceiling
        self.window = float(ceiling)
        self.in_flight = 0
        self.traffic = Traffic()
        self._sent = 0
        self._cut_at = 0  # calls numbered up to here were sent before the last cut
        self._since_cut = [0, 0]  # calls that ended since the last cut: ok, 429
        self._sent_at: dict[int, float] = {}
        self._rtt = 0.0  # smoothed duration of a successful call
        self._spacing = _Schedule()  # after the first 429, sends are spread over a round trip
        self._cut_time = 0.0
        self._in_a_row = 0  # 429s since the last success
        self._hold_until = 0.0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._rpm = _bucket(rpm)
        self.learned = LearnedRate(self.traffic, sends)
        if known is not None:  # what an earlier stage, or run, learned of this endpoint
            self.learned.carry(*known)
        self._tokens = _Schedule()
        self._tpm = tpm * MARGIN / 60 if tpm else 0.0  # tokens a second

    async def acquire(self, tokens: int = 0) -> int:
        """Wait for room in the window and the rate limits; the call's number, for release."""
        if self._waiters or self.in_flight >= ceil(self.window):
            await self._queue()
        else:
            self.in_flight += 1
        try:
            while True:  # a storm's hold may begin while this call waits for its pace: wait again
                while (hold := self._hold_until - clock()) > 0:  # noqa: ASYNC110
                    await asyncio.sleep(hold)
                await self._pace(tokens)
                if self._hold_until <= clock():
                    break
        except BaseException:
            self.release(0, limited=False, counted=False)
            raise
        self._sent += 1
        self.traffic.calls += 1
        self._sent_at[self._sent] = now = clock()
        self.traffic.first_sent = self.traffic.first_sent or now
        self.learned.sent(now)
        return self._sent

    async def _pace(self, tokens: int) -> None:
        """Wait for the call's turn under --rpm (else the learned rate), --tpm and the spacing."""
        if self._rpm is not None:  # the user's word on the limit: what was learned is not
            await self._rpm.acquire()
        if self._tpm and tokens:
            await self._tokens.book(tokens / self._tpm)
        if self._rpm is None:
            await self.learned.pace()
        if self.learned.rate and self.window < self.ceiling:
            # Paced by the learned rate from now on: the window cut by the first storm, when
            # nothing else was known, no longer holds calls back (a few would come back slowly).
            self.window = float(self.ceiling)
            self._wake()
        await self._spread()

    async def _spread(self) -> None:
        """Once a 429 was seen, space sends RTT/window apart instead of sending in bursts.

        A window's worth of calls per round trip is the same rate either way, but a burst
        is what a sliding-window limit refuses (as TCP pacing avoids bursts into queues).
        """
        if self._cut_at and self._rtt and not self.learned.rate:
            await self._spacing.book(self._rtt / self.window)

    async def _queue(self) -> None:
        """Wait in line; the slot is taken on our behalf when we are woken."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # woken and cancelled at once
                self.release(0, limited=False, counted=False)
            raise

    def release(
        self,
        number: int,
        *,
        limited: bool,
        wait: float = 0.0,
        counted: bool = True,
        said: float | None = None,
    ) -> None:
        """A call ended: a 429 (`limited`, to retry after `wait` s) shrinks the window. Only
        a wait the server `said` (Retry-After) teaches a rate: ragexam's own backoff after a
        429 that says nothing is no limit's (`said` None: `wait` is the server's).

        The cut is as deep as the share of 429s among the calls that ended since the last
        cut, up to 1 - MIN_DECREASE: a lone 429 trims the window, a storm cuts it by 30%.
        """
        self.in_flight -= 1
        sent_at = self._sent_at.pop(number, None)
        if counted:
            self.traffic.last_done = clock()
            self.traffic.admitted += not limited
        if counted and not limited and sent_at is not None:
            took = clock() - sent_at
            self._rtt = took if not self._rtt else 0.8 * self._rtt + 0.2 * took
        if counted:
            self._since_cut[limited] += 1
        if counted and limited:
            self.traffic.rate_limited += 1
            self._in_a_row += 1
            now = clock()
            learned = self.learned.rate  # once learned, the rate is cut, not the window
            if sent_at is not None:
                self.learned.refused(sent_at, now)
            if self._in_a_row == STORM:  # no new call until the server has a free slot,
                self._hold_until = max(self._hold_until, now + wait)
                told = wait if said is None else said
                if told > 0:  # a limit says when a slot frees; random refusals say nothing
                    self.learned.storm(now, told)
                if not learned:
                    self.window = max(1.0, self.window * MIN_DECREASE)  # and fewer after it
            if not learned and number > self._cut_at and now - self._cut_time >= self._rtt:
                share = self._since_cut[1] / sum(self._since_cut)
                self.window = max(1.0, self.window * max(MIN_DECREASE, 1 - share))
                self._cut_at, self._since_cut, self._cut_time = self._sent, [0, 0], now
        elif counted:
            self._in_a_row = 0
            self.learned.succeeded(clock())
            growth = (GROWTH_AFTER_429 if self._cut_at else 1.0) / self.window
            self.window = min(float(self.ceiling), self.window + growth)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < ceil(self.window):
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)


class LearnedRate:
    """The server's rate limit, learned from its first storm of 429s, then kept just under.

    A limit met from a standing start is met when the calls it admitted fill it, and its
    Retry-After then runs to when the oldest of them leaves its window. So the calls admitted,
    over the time from the first send to the end of that wait, is the limit's rate, whether
    it counts per second or per minute. From then on calls are paced at MARGIN of the rate.
    The rate grows by GROWTH per such window while calls succeed, so a low first guess
    catches up, and a 429 cuts it by DECREASE, once per CUT_EVERY seconds at most: a small
    overshoot costs a few 429s. A later storm means the rate is far too high, as a bucket
    that let a burst through first makes it: it is cut to what the server admitted.
    """

    def __init__(self, traffic: Traffic, sends: deque[float] | None = None) -> None:
        self.traffic = traffic
        self.rate = 0.0  # calls a second the server admits; 0 until learned
        self.span = 0.0  # seconds the limit counts over, as learned
        # send times inside the HORIZON, of every stage of the command that calls this model
        # at this endpoint: the server's window holds an earlier stage's calls too
        self._sends: deque[float] = deque() if sends is None else sends
        self._refused: deque[float] = deque()  # send times of the calls answered 429
        self._done: deque[float] = deque()  # when the calls that succeeded came back
        self._storm_at = 0.0
        self._learn_at = 0.0  # when the first storm's wait ends: the rate is learned then
        self._cut_time = 0.0
        self._set_at = 0.0  # when the rate was learned or last cut by a storm
        self._schedule = _Schedule()

    def carry(self, rate: float, span: float) -> None:
        """Start from a rate learned before (calls a second, over a window of `span` s)."""
        self.rate, self.span = rate, span
        self._set_at = -1.0  # set by the first send: the pacing clock runs in the event loop
        self.traffic.carried_rpm = self.traffic.learned_rpm = round(rate * 60)

    def sent(self, at: float) -> None:
        """A call was sent at `at`."""
        if self._set_at < 0:
            self._set_at = at
        self._sends.append(at)
        while self._sends[0] < at - HORIZON:
            self._sends.popleft()

    def refused(self, sent_at: float, now: float) -> None:
        """A call sent at `sent_at` was answered 429: once learned, the rate is cut.

        Not within a window of the rate being set or carried in: until then the server's
        window still holds the calls sent before (an earlier stage's, or command's).
        """
        self._refused.append(sent_at)
        while self._refused[0] < now - HORIZON:
            self._refused.popleft()
        settled = now - self._set_at > self.span
        if self.rate and settled and now - self._cut_time >= CUT_EVERY:
            self.rate, self._cut_time = self.rate * DECREASE, now

    def storm(self, now: float, wait: float) -> None:
        """STORM 429s in a row: the first one teaches the rate, at the end of its `wait`.

        A later one cuts the rate to what the server admitted over the last window, and by
        STORM_DECREASE at least, unless it comes within a window of the rate being set:
        until then the window still holds the calls sent before, and frees them as they were
        sent (and what it admitted is not yet measured).
        """
        if self.rate and now - self._set_at > self.span:
            self.rate = min(self.rate * STORM_DECREASE, self._admitted(now))
            self._set_at = self._cut_time = now
        elif not self.rate and not self._learn_at:
            self._storm_at, self._learn_at = now, now + wait

    def succeeded(self, now: float) -> None:
        """A call succeeded: the rate grows by GROWTH over one window's worth of successes."""
        self._done.append(now)
        while self._done[0] < now - HORIZON:
            self._done.popleft()
        if self.rate:
            self.rate += GROWTH / max(self.span, GROWTH_PERIOD)

    def _admitted(self, now: float) -> float:
        """Calls a second that succeeded over the last window."""
        return sum(at > now - self.span for at in self._done) / self.span

    async def pace(self) -> None:
        """Learn the rate when the first storm's wait is over; then space sends by it."""
        if self._learn_at and clock() >= self._learn_at:
            self._learn()
        if self.rate:
            await self._schedule.book(1 / (self.rate * MARGIN))

    def _learn(self) -> None:
        """Calls admitted before the storm from the one its window began with, over the time
        from that one to the wait's end. Which one that was is not said: the calls before it
        had left the window, which made the rate from it the highest. From a standing start it
        is the first; after an earlier stage's calls, often one of those."""
        storm, until, self._learn_at = self._storm_at, self._learn_at, 0.0
        sent = sorted(at for at in self._sends if at <= storm)
        refused = sorted(at for at in self._refused if at <= storm)
        best, later = (0.0, 0.0), 0  # (rate, span); refused calls sent before a start
        for first, start in enumerate(sent):
            while later < len(refused) and refused[later] < start:
                later += 1
            admitted = len(sent) - first - (len(refused) - later)  # calls out count
            # a limit counts over a second at least: less is a burst let through
            span = max(until - start, MIN_SPAN)
            if admitted > 0 and admitted / span > best[0]:
                best = (admitted / span, span)
        if best[0] > 0:
            (self.rate, self.span), self._set_at = best, until
            self.traffic.learned_rpm = round(self.rate * 60)


class _Schedule:
    """Sends spaced out in time: each booking holds the schedule for its `seconds`."""

    def __init__(self) -> None:
        self.free_at = 0.0

    async def book(self, seconds: float) -> None:
        """Wait for the next free slot, and hold the schedule `seconds` after it."""
        now = clock()
        slot = max(now, self.free_at)
        self.free_at = slot + seconds
        if slot > now:
            await asyncio.sleep(slot - now)


def clock() -> float:
    """The pacing clock: the running event loop's, which aiolimiter's --rpm bucket reads too.

    In production it is time.monotonic(); a test's loop may run on virtual time, so that a
    minute of a rate limit passes in milliseconds.
    """
    return asyncio.get_running_loop().time()


def _bucket(rpm: int | None) -> Any:
    """A leaky bucket of one call per 60/rpm seconds: never more than rpm in any minute.

    It runs at MARGIN of the limit: sends paced exactly at it are tipped over by timer jitter.
    """
    if not rpm:
        return None
    from aiolimiter import AsyncLimiter

    return AsyncLimiter(1, 60 / (rpm * MARGIN))


def estimate_tokens(messages: list[BaseMessage]) -> int:
    """Tokens a prompt will be billed, roughly, without a tokenizer (none works offline).

    OpenAI's two rules of thumb for English, 4 characters or 3/4 of a word per token,
    averaged, plus a few tokens of framing per message. Used by --tpm and --dry-run.
    """
    return sum(round(text_tokens(str(message.content))) + 4 for message in messages)


def text_tokens(text: str) -> float:
    """Tokens of one text by the same rules."""
    return (len(text) / 4 + len(text.split()) * 4 / 3) / 2
