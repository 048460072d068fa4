"""How many harder questions a generate run still wants, and what became of those it tried.

Verification drops some candidates, so candidates are tried until enough are kept; a Quota
admits one more only while the candidates in flight could still fall short, so that no more
calls are made than could be needed, and never more questions kept than asked.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ragexam.stages.candidates import Candidate


class Quota:
    """Hands out candidates until `wanted` are kept; never more in flight than could be needed."""

    def __init__(self, wanted: int) -> None:
        self.wanted, self.kept, self.open, self.dropped = wanted, 0, 0, 0
        self.tried = 0
        self.reasons: dict[str, int] = {}
        self.changed = asyncio.Condition()

    async def admit(self) -> bool:
        """Wait for room: True to try one more candidate, False once enough are kept."""
        async with self.changed:
            await self.changed.wait_for(
                lambda: self.kept >= self.wanted or self.kept + self.open < self.wanted
            )
            if self.kept >= self.wanted:
                return False
            self.open += 1
            self.tried += 1
            return True

    async def settle(self, kept: bool, reason: str = "") -> None:
        """One candidate is done: kept, dropped for `reason`, or failed (neither)."""
        async with self.changed:
            self.open -= 1
            self.kept += kept
            if reason:
                self.dropped += 1
                self.reasons[reason] = self.reasons.get(reason, 0) + 1
            self.changed.notify_all()


@dataclass
class Asked:
    """One kind of harder question: how many were asked, kept before, and this run's quota."""

    kind: str
    asked: int
    candidates: list[Candidate]
    kept_before: int = 0
    quota: Quota = field(default_factory=lambda: Quota(0))  # Harder.start sets it

    def record(self, calls: int) -> dict[str, Any]:
        """What the manifest says of it: asked, kept, tried, dropped and why, calls."""
        kept = self.kept_before + self.quota.kept
        return {
            "asked": self.asked,
            "kept": kept,
            "tried": self.quota.tried,
            "dropped": self.quota.dropped,
            "reasons": dict(self.quota.reasons),
            "calls": calls,
            "calls_per_kept": round(calls / self.quota.kept, 2) if self.quota.kept else None,
            "candidates": len(self.candidates),
        }

    def note(self, calls: int) -> str:
        """One line for the terminal."""
        found = self.record(calls)
        why = ", ".join(f"{count} {reason}" for reason, count in self.quota.reasons.items())
        line = f"{self.kind}: kept {found['kept']} of {self.asked} asked"
        line += f"; this run tried {found['tried']}, dropped {found['dropped']}"
        line += f" ({why})" if why else ""
        if found["calls_per_kept"] is not None:
            line += f"; {found['calls_per_kept']:g} calls per question kept"
        if found["kept"] < self.asked and self.quota.open == 0:
            line += f"; no candidate left of {len(self.candidates)} drawn"
        return line
