"""Check that the quickstart left a complete run folder, with no dev tool installed."""

import csv
import importlib.util
import sys
from pathlib import Path

out = Path(sys.argv[1])
for name in ("qa_dataset.csv", "answers.csv", "judgments.csv", "summary.csv", "report.html"):
    if not (out / name).is_file():
        sys.exit(f"quickstart: {out / name} is missing")
with (out / "judgments.csv").open(encoding="utf-8", newline="") as handle:
    statuses = [row["status"] for row in csv.DictReader(handle)]
if len(statuses) != 19 or set(statuses) != {"ok"}:
    sys.exit(f"quickstart: expected 19 ok judgments, got {statuses}")
dev = [name for name in ("pytest", "mypy", "playwright") if importlib.util.find_spec(name)]
if dev:
    sys.exit(f"quickstart: installed the dev group ({', '.join(dev)})")
print("quickstart: 19 questions generated, answered and judged; no dev tool installed")
