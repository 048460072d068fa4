"""What calls cost in US dollars: prices per model from genai-prices, or the user's own.

genai-prices (pydantic's maintained table, shipped inside the package, so it works offline)
prices a model by its name; RAGEXAM_PRICE_INPUT and RAGEXAM_PRICE_OUTPUT (USD per million
tokens) override it, and price local or unknown models. A model without a price has cost
None, shown as "unknown", never $0.

Calls through a Batch API are priced at the table's batch price where it has one (its
`processing: batch` variant), else at half the price: the discount OpenAI, Anthropic, Google,
Mistral and Together all give.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ragexam.config import Settings
from ragexam.io.manifest import read_manifest, set_run_field, update_manifest
from ragexam.io.runfolder import CONTROL_RUNS, RunFolder

PER = 1_000_000  # prices are per million tokens
BATCH = {"processing": "batch"}  # genai-prices' context for a batch price
BATCH_SHARE = 0.5  # of the sync price, where the table has no batch price


@dataclass(frozen=True)
class Price:
    """USD per million input and output tokens, and where the figures came from."""

    input: float
    output: float
    source: str

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Dollars for this many tokens."""
        return (input_tokens * self.input + output_tokens * self.output) / PER

    def short(self) -> str:
        """E.g. `$0.15/$0.6 per 1M tokens in/out, genai-prices`, for one screen line."""
        where = self.source.split(":")[0].split(",")[0]
        rate = ", batch rate" if "batch" in self.source else ""
        return f"${self.input:g}/${self.output:g} per 1M tokens in/out{rate}, {where}"

    def describe(self) -> str:
        """E.g. `$0.15 in / $0.60 out per 1M tokens (genai-prices: openai gpt-4o-mini)`."""
        return f"${self.input:g} in / ${self.output:g} out per 1M tokens ({self.source})"


def price_of(model: str, settings: Settings) -> Price | None:
    """The model's price: the overrides where set, else the table; None when unknown."""
    given = (settings.price_input, settings.price_output)
    if given[0] is not None and given[1] is not None:
        return Price(given[0], given[1], "RAGEXAM_PRICE_INPUT/OUTPUT")
    table = table_price(model)
    if table is None:
        return None
    input_ = table.input if given[0] is None else given[0]
    output = table.output if given[1] is None else given[1]
    overridden = ", with RAGEXAM_PRICE_* overriding" if given != (None, None) else ""
    return Price(input_, output, table.source + overridden)


def batch_price(model: str, settings: Settings) -> Price | None:
    """The model's price through a Batch API: the table's batch price, else half the price."""
    given = (settings.price_input, settings.price_output)
    table = table_price(model, batch=True) if given == (None, None) else None
    if table is not None:
        return table
    sync = price_of(model, settings)
    if sync is None:
        return None
    return Price(
        sync.input * BATCH_SHARE, sync.output * BATCH_SHARE, f"{sync.source}, at half: batch"
    )


@lru_cache(maxsize=64)
def table_price(model: str, batch: bool = False) -> Price | None:
    """The model's price in genai-prices' table, matched by name; None when it lacks it.

    With `batch`, only a batch price the table has itself; None when it has none.
    """
    from genai_prices import Usage, calc_price  # ~0.5 s to load: only when a cost is asked

    # Priced on 1,000 tokens each way and scaled: some models charge more past a context size.
    try:
        found = calc_price(
            Usage(input_tokens=1000, output_tokens=1000),
            model_ref=model,
            price_context=BATCH if batch else None,
        )
    except LookupError:
        return None
    variants = found.model.price_variants or []
    if batch and not any(variant.when == BATCH for variant in variants):
        return None
    source = f"genai-prices: {found.provider.id} {found.model.id}" + (", batch" if batch else "")
    return Price(float(found.input_price) * 1000, float(found.output_price) * 1000, source)


def carried_spend(previous: Mapping[str, Any] | None, job_open: bool) -> dict[str, Any]:
    """What a stage's new record carries of the one it replaces, to add up what the stage has
    cost the folder over every run (`spent_usd`): what it had cost before, and, when a batch
    job is open (this run goes on with it), the job's cost as counted in that already. A run
    killed before its cost was recorded passes on what it carried."""
    previous = previous or {}
    carried = previous.get("carried") if isinstance(previous.get("carried"), dict) else None
    recorded = "spent_usd" in previous
    batch = previous.get("batch")
    if not recorded and carried is not None and isinstance(batch, dict) and batch.get("idle"):
        recorded = bool(carried.get("recorded"))  # a stopped run that added nothing: as before it
    if "spent_usd" in previous:
        spent, job_cost = previous["spent_usd"], previous.get("cost_usd")
    elif carried is not None:  # a run killed before its cost was recorded: what it carried
        spent, job_cost = carried.get("spent", 0.0), carried.get("job_cost", 0.0)
    else:  # none, or an older version's record: its latest run's cost, all that is known
        spent, job_cost = previous.get("cost_usd", 0.0), previous.get("cost_usd")
    counted = job_cost if job_open else 0.0
    return {"carried": {"spent": spent, "job_cost": counted, "recorded": recorded}}


def _spent(record: Mapping[str, Any], cost: float | None) -> float | None:
    """What the stage has cost the folder over every run: what it had cost before, and what
    this run added (on the batch road, the job's cost less what was counted of it before; a
    rerun with nothing to do, which shows the job the last run ended, adds nothing)."""
    carried = record.get("carried") or {}
    spent, counted = carried.get("spent", 0.0), carried.get("job_cost", 0.0)
    batch = record.get("batch")
    if isinstance(batch, dict) and batch.get("idle") and carried.get("recorded"):
        return spent  # type: ignore[no-any-return]  # the job, shown again, is counted in it
    if spent is None or cost is None or counted is None:
        return None
    return float(spent + cost - counted)


def _priced(price: Price | None, tokens: tuple[int, int]) -> float | None:
    """What tokens cost at a price; nothing billed costs $0 at any price, even none known
    (a run of a mistyped model that stopped before any call must not make a total unknown)."""
    if tokens == (0, 0):
        return 0.0
    return price.cost(*tokens) if price else None


def record_cost(
    out: Path, stage: str, settings: Settings
) -> tuple[float | None, Price | None, tuple[int, int]]:
    """Price the tokens the stage's last run billed; write cost_usd to it and to the run.
    Returns the cost, the price, and the tokens priced at it."""
    manifest = read_manifest(out)
    record: dict[str, Any] = manifest.get("stages", {}).get(stage, {})
    model = str(record.get("model", ""))
    priced_at = batch_price if record.get("batch") else price_of  # the batch road's rate
    price = priced_at(model, settings) if model else None
    billed = record.get("tokens_billed") or {
        "prompt": record.get("prompt_tokens", 0),
        "completion": record.get("completion_tokens", 0),
    }
    tokens = int(billed["prompt"]), int(billed["completion"])
    cost = _priced(price, tokens)
    others = {**(record.get("verification") or {}), **(record.get("billed_elsewhere") or {})}
    for role in others.values():  # generate's checks, a job of another model: their prices
        checked = priced_at(str(role.get("model", "")), settings)  # on the same road
        spent = role.get("tokens_billed") or {}
        used = _priced(checked, (int(spent.get("prompt", 0)), int(spent.get("completion", 0))))
        cost = None if cost is None or used is None else cost + used
    priced: dict[str, Any] = {"cost_usd": cost, "price": price.describe() if price else None}
    priced["spent_usd"] = _spent(record, cost)  # every run's: the folder's total adds them
    if record.get("batch"):  # beside it, what the same calls cost on the sync road
        sync = price_of(model, settings) if model else None
        priced["cost_usd_sync"] = sync.cost(*tokens) if sync else None
    update_manifest(out, stage, {**record, **priced})
    record_total(out)
    parent = RunFolder(out).parent_run()
    if parent is not None:
        record_total(parent.path)  # a control run's cost is part of its run's
    return cost, price, tokens


@dataclass(frozen=True)
class RunCost:
    """What each priced stage of a run folder cost, its control runs' folders included."""

    stages: dict[str, float | None]  # "generate", ..., "gold/answer": None when unknown
    # of those unknown, the stages priced now whose earlier runs were not: a price set now
    # cannot price them
    earlier: tuple[str, ...] = ()

    @property
    def total(self) -> float | None:
        """The sum, or None when any stage's price is unknown: never a partial sum."""
        costs = list(self.stages.values())
        return None if None in costs else sum(cost or 0.0 for cost in costs)

    @property
    def unpriced(self) -> list[str]:
        """The stages whose price is unknown."""
        return [name for name, cost in self.stages.items() if cost is None]

    @property
    def priced(self) -> float:
        """What the stages with a known price cost: a part, when some are unpriced."""
        return sum(cost for cost in self.stages.values() if cost is not None)


def run_cost(out: Path) -> RunCost:
    """The cost of every stage recorded in OUT, then in OUT/gold and OUT/closed_book."""
    stages: dict[str, float | None] = {}
    earlier = []
    for folder, prefix in [(out, ""), *((out / name, f"{name}/") for name in CONTROL_RUNS)]:
        recorded = read_manifest(folder).get("stages", {})
        for stage, entry in recorded.items() if isinstance(recorded, dict) else ():
            if isinstance(entry, dict) and "spent_usd" in entry:  # every run of it
                stages[prefix + stage] = entry["spent_usd"]
                if entry["spent_usd"] is None and entry.get("cost_usd") is not None:
                    earlier.append(prefix + stage)
            elif isinstance(entry, dict) and "cost_usd" in entry:  # an older version's
                stages[prefix + stage] = entry["cost_usd"]
    return RunCost(stages, tuple(earlier))


def record_total(out: Path) -> RunCost:
    """Write the run folder's total to its manifest: cost_usd, and the stages it covers."""
    cost = run_cost(out)
    set_run_field(out, "cost_usd", cost.total)
    set_run_field(out, "cost_stages", list(cost.stages))
    return cost
