"""What calls cost in US dollars: prices per model from genai-prices, or the user's own.

genai-prices (pydantic's maintained table, shipped inside the package, so it works offline)
prices a model by its name; RAGEXAM_PRICE_INPUT and RAGEXAM_PRICE_OUTPUT (USD per million
tokens) override it, and price local or unknown models. A model without a price has cost
None, shown as "unknown", never $0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ragexam.config import Settings
from ragexam.manifest import read_manifest, set_run_field, update_manifest

PER = 1_000_000  # prices are per million tokens


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
        return f"${self.input:g}/${self.output:g} per 1M tokens in/out, {where}"

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


@lru_cache(maxsize=64)
def table_price(model: str) -> Price | None:
    """The model's price in genai-prices' table, matched by name; None when it lacks it."""
    from genai_prices import Usage, calc_price  # ~0.5 s to load: only when a cost is asked

    # Priced on 1,000 tokens each way and scaled: some models charge more past a context size.
    try:
        found = calc_price(Usage(input_tokens=1000, output_tokens=1000), model_ref=model)
    except LookupError:
        return None
    source = f"genai-prices: {found.provider.id} {found.model.id}"
    return Price(float(found.input_price) * 1000, float(found.output_price) * 1000, source)


def record_cost(out: Path, stage: str, settings: Settings) -> tuple[float | None, Price | None]:
    """Price the tokens the stage's last run billed; write cost_usd to it and to the run."""
    manifest = read_manifest(out)
    record: dict[str, Any] = manifest.get("stages", {}).get(stage, {})
    model = str(record.get("model", ""))
    price = price_of(model, settings) if model else None
    billed = record.get("tokens_billed") or {
        "prompt": record.get("prompt_tokens", 0),
        "completion": record.get("completion_tokens", 0),
    }
    cost = price.cost(int(billed["prompt"]), int(billed["completion"])) if price else None
    priced = {"cost_usd": cost, "price": price.describe() if price else None}
    update_manifest(out, stage, {**record, **priced})
    stages = read_manifest(out)["stages"].values()
    costs = [entry["cost_usd"] for entry in stages if "cost_usd" in entry]
    set_run_field(out, "cost_usd", None if None in costs else sum(costs))
    return cost, price
