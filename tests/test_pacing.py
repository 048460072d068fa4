"""Pacing under rate limits, on virtual time: the window, the learned rate, --rpm and --tpm.

Each test runs ragexam's LLM against a simulated server (simulation.py) whose clock jumps, so
the same claims as the real-clock tests (test_rate_limits.py, test_token_pacing.py) hold here
in milliseconds and at the real one-minute windows, whatever else the machine is doing.
"""

from __future__ import annotations

import pytest
from limits import Bucket, SlidingWindow
from simulation import Server, simulate, simulate_stages

from ragexam.llm.endpoint import EndpointMemory, endpoint_key

RPM = 900  # the limit: 900 calls a minute, as the real-clock tests scale it


@pytest.mark.parametrize("window", [4.0, 60.0])  # the real tests' scaled window, and a minute
def test_the_first_storm_teaches_the_limit_and_the_run_settles_under_it(window: float) -> None:
    limit = SlidingWindow(round(RPM * window / 60), window)
    rows = round(RPM / 60 * window * 6)  # six windows of work
    run = simulate(Server(limit, latency=1.0), rows, concurrency=64)
    assert run.rows_ok == rows
    assert rows / run.seconds / (RPM / 60) >= 0.85  # calls admitted ÷ the limit
    assert run.limited <= 0.10, run.limited
    assert run.learned_rpm is not None and abs(run.learned_rpm - RPM) <= 0.1 * RPM


def test_a_limit_first_met_after_an_earlier_stage_is_learned_at_its_rate() -> None:
    # The first stage's calls fill most of the window without a 429; the next stage meets
    # the limit at its first calls. It learned from its own calls alone: ~7 a minute where
    # the limit was 120, and the rest of the run crawled (and the next command, from it).
    limit = SlidingWindow(20, 10.0)  # 120 a minute
    first, second = simulate_stages(Server(limit, latency=0.1), [19, 200], concurrency=16)
    assert first.rows_ok == 19 and first.learned_rpm is None  # no 429: nothing learned
    assert second.rows_ok == 200
    assert second.learned_rpm is not None and abs(second.learned_rpm - 120) <= 12
    assert 200 / second.seconds / 2 >= 0.8  # calls admitted ÷ the limit


def test_rpm_wins_over_a_rate_learned_too_low() -> None:
    # A rate learned too low (1 a minute, as above before the fix), kept in the run folder,
    # held --rpm down: the lower of the two paced the calls, and the user could not lift it.
    memory = EndpointMemory()
    memory.learned(endpoint_key("simulated-model", "http://simulated/v1"), 1 / 60, 60.0)
    limit = SlidingWindow(120, 8.0)
    (run,) = simulate_stages(Server(limit, latency=1.0), [400], memory=memory, rpm=RPM)
    assert run.rows_ok == 400 and 400 / run.seconds / (RPM / 60) >= 0.85


def test_rpm_paces_under_the_limit_from_the_first_call() -> None:
    run = simulate(Server(SlidingWindow(120, 8.0), latency=1.0), 400, concurrency=64, rpm=RPM)
    assert run.rows_ok == 400 and run.learned_rpm is None  # no storm: nothing to learn
    assert run.limited <= 0.02, run.limited
    assert 400 / run.seconds / (RPM / 60) >= 0.85


def test_a_bucket_that_lets_a_burst_through_first_is_learned_and_kept() -> None:
    rate = RPM / 60
    run = simulate(Server(Bucket(rate, int(rate)), latency=1.0), 400, concurrency=32)
    ideal = (400 - rate) / rate + 1.0  # the bucket's burst, then `rate` a second
    assert run.rows_ok == 400 and ideal / run.seconds >= 0.85
    assert run.limited <= 0.20, run.limited
    assert run.limited_after(6.0) <= 0.05  # the early storm's rate corrected, then kept


def test_tpm_paces_tokens_and_without_it_the_token_limit_is_hit() -> None:
    prompt = "a question of some length " * 40  # ~180 tokens a call by ragexam's estimate
    tokens_a_minute = 25_000

    def token_limit() -> Server:
        return Server(SlidingWindow(tokens_a_minute // 15, 4.0), latency=0.5, by_tokens=True)

    paced = simulate(token_limit(), 160, prompt, concurrency=64, tpm=tokens_a_minute)
    unpaced = simulate(token_limit(), 160, prompt, concurrency=64)
    assert paced.rows_ok == unpaced.rows_ok == 160
    assert paced.limited <= 0.02 < 0.05 < unpaced.limited, (paced.limited, unpaced.limited)
    used = sum(call.tokens for call in paced.calls if not call.refused) / paced.seconds
    assert used / (tokens_a_minute / 60) >= 0.8  # paced at 95% of the limit
