"""What the terminal shows of the batch road: each batch's line, and what the road did."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.progress import ProgressColumn, Task
from rich.text import Text

if TYPE_CHECKING:
    from ragexam.llm.batchapi import BatchView


class CountColumn(ProgressColumn):
    """Rows in error, or a batch's failed requests."""

    def render(self, task: Task) -> Text:
        """The count, in red."""
        if task.fields.get("batch") is not None:
            return Text(f"{task.fields['errors']} failed", style="red")
        return Text(f"{task.fields['errors']} errors", style="red")


def batch_times(view: BatchView, now: float | None = None) -> str:
    """A batch's age, and the endpoint's own deadline: `4m12s elapsed, expires in 23h55m`."""
    now = time.time() if now is None else now
    parts = [f"{span(now - view.created_at)} elapsed"]
    if view.expires_at and not view.ended:
        parts.append(f"expires in {span(view.expires_at - now)}")
    return ", ".join(parts)


def batch_line(view: BatchView) -> str:
    """One batch in one line, for logs."""
    done = view.completed + view.failed
    return f"{view.id} {view.status}: {done}/{view.total} answered, {view.failed} failed, " + (
        batch_times(view)
    )


def span(seconds: float) -> str:
    """4m12s, 23h55m, 9s."""
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def batch_summary(batch: dict[str, Any]) -> str:
    """What the batch road did: requests sent, results merged, and how long the batches took."""
    sent, merged = f"{batch['requests']:,} requests sent", f"{batch['results_merged']:,} merged"
    runs = batch.get("runs", 1)
    merged += f" over the {runs} runs of this batch job" if runs > 1 else ""
    if batch["mode"] == "dir":
        waiting = f"; {batch['waiting']:,} wait for results" if batch["waiting"] else ""
        return f"batch files: {sent} to {batch['folder']}/requests, {merged}{waiting}"
    took = f", the batches took {span(batch['seconds'])}" if batch["seconds"] is not None else ""
    # not its rounds: the pass that merges the last batch is one, and no batch waits on it
    return f"batches: {batch['batches']} made, {sent}, {merged}{took}"
