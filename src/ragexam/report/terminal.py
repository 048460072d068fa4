"""The summary for the terminal: compact rich tables that fit 80 columns."""

from __future__ import annotations

import pandas as pd
from rich import box
from rich.table import Table
from rich.text import Text

from ragexam.analysis.compare import SIGNIFICANT, TERMINAL_DOCUMENTS, CompareResult
from ragexam.analysis.summary import StatsResult
from ragexam.report.charts import diagnosis_colour
from ragexam.report.page import MEANS, number
from ragexam.report.text import printable
from ragexam.report.trust import FIGURES

TERMINAL_ROWS = 20
TERMINAL_NAME = 32  # characters of a document name in the terminal; the tail is kept
SHORT = {
    "questions": "n",
    "errors": "err",
    "pending": "pend",
    "completeness_mean": "compl",
    "conciseness_mean": "conc",
    "hit_rate": "hit",
    "mrr": "MRR",
}


def terminal_table(result: StatsResult, width: int | None = None) -> Table:
    """The per-document summary as a compact rich table that fits `width` columns (80 if
    unsaid): the documents' common folder said once, and the figures never cut (the names
    give way first: a figure cut at the edge, 0.78 shown as 0.7, read as another)."""
    shown = result.by_document.head(TERMINAL_ROWS)
    counts = ["questions", "errors"] + (["pending"] * bool(result.overall["pending"].iloc[0]))
    names = [printable(str(name)) for name in shown["document"]]
    folder = common_folder(names) if any(len(name) > TERMINAL_NAME for name in names) else ""
    under = f", in {folder}" if folder else ""
    table = Table(
        title=f"Worst {len(shown)} of {len(result.by_document)} documents by completeness{under}",
        caption=f"mean, and ± half its 95% bootstrap CI; cutoff k={result.k}; the bounds and "
        f"every document are in {result.paths['summary_by_document'].name}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    rows = [
        _terminal_cells(row, counts, name[len(folder) :])
        for name, (_, row) in zip(names, shown.iterrows(), strict=True)
    ]
    whole = result.overall.iloc[0]
    overall = _terminal_cells(whole, counts, printable(str(whole["document"])))
    headers = ["diagnosis"] + [SHORT.get(name, name) for name in counts]
    headers += [SHORT[m] for _, m, _ in MEANS]
    widths = []
    for column, header in enumerate(headers, start=1):  # never narrower than its cells
        lines = [line for row in [*rows, overall] for line in row[column].plain.split("\n")]
        widths.append(max(len(text) for text in [header, *lines]))
    # the name takes what the figures leave: each column has a space each side but at the
    # table's edges, a separator between it and the next, and the box two edges
    columns = len(widths) + 1
    room = (width or 80) - sum(widths) - (2 * columns - 2) - (columns - 1) - 2
    longest = max(len(row[0].plain) for row in [*rows, overall])
    name_width = max(12, min(longest, room))  # a wide terminal shows whole names
    cut = [short_name(row[0].plain, name_width) for row in rows]
    if len(set(cut)) < len(cut):  # names alike at their end: their middles tell them apart
        cut = [middle_cut(row[0].plain, name_width) for row in rows]
    for row, name in zip([*rows, overall], [*cut, overall[0].plain], strict=True):
        row[0] = Text(name)
    table.add_column("document", no_wrap=True, min_width=min(12, name_width), max_width=name_width)
    for column, (header, widest) in enumerate(zip(headers, widths, strict=True), start=1):
        table.add_column(header, justify="left" if column == 1 else "right", min_width=widest)
    for row in rows:
        table.add_row(*row)
    table.add_section()
    table.add_row(*overall, style="bold")
    return table


def common_folder(names: list[str]) -> str:
    """The folder every name is in, with its trailing slash ("" if none): absolute paths, as
    LangChain's and LlamaIndex's loaders name documents, say little in their first half."""
    folders = [name.split("/")[:-1] for name in names]
    common: list[str] = []
    for parts in zip(*folders, strict=False):  # as far as the shortest
        if any(part != parts[0] for part in parts):
            break
        common.append(parts[0])
    return "/".join(common) + "/" if common else ""


KIND_FIGURES = {
    "questions": "n",
    "completeness_mean": "compl",
    "conciseness_mean": "conc",
    "hit_rate": "hit",
    "mrr": "MRR",
    "all_found": "all",
    "declined": "declined",
    "made_up": "made up",
}


def kind_table(by_kind: pd.DataFrame) -> Table:
    """summary_by_kind.csv as a compact rich table: each kind of question, then ALL."""
    table = Table(
        title="By kind of question",
        caption="all: every chunk of the question retrieved; declined, made up: shares of the "
        "unanswerable questions' graded answers",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("kind", no_wrap=True)
    for header in KIND_FIGURES.values():
        table.add_column(header, justify="right")
    for _, row in by_kind.iterrows():
        cells = [Text(str(row["kind"])), Text(f"{int(row['questions']):,}")]
        cells += [Text(number(row.get(name))) for name in list(KIND_FIGURES)[1:]]
        table.add_row(*cells, style="bold" if row["kind"] == "ALL" else "")
    return table


def middle_cut(name: str, width: int) -> str:
    """A name cut to `width` in its middle: its start and its end kept."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[-(width - 1 - head) :]


def short_name(name: str, width: int = TERMINAL_NAME) -> str:
    """A document name cut to one line from the left: a path's end says most about it."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def _terminal_cells(row: pd.Series, counts: list[str], name: str) -> list[Text]:
    """One row's cells; Text keeps a document name like "[red]" from being read as markup."""
    diagnosis = str(row["diagnosis"])
    cells = [
        Text(name),  # cut by the table, to the room the figures leave
        Text(diagnosis, style=diagnosis_colour(diagnosis, True)),
    ]
    cells += [Text(str(row[name])) for name in counts]
    for name, mean, _ in MEANS:
        low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
        spread = "" if pd.isna(low) else f"\n±{(high - low) / 2:.2f}"
        cells.append(Text(number(row[mean])) + Text(spread, style="dim"))
    return cells


def comparison_table(result: CompareResult) -> Table:
    """The comparison as a rich table."""
    table = result.table
    overall = table[table["document"] == "ALL"]
    changed = table[(table["document"] != "ALL") & (table["p_value"] < SIGNIFICANT)]
    shown = changed.reindex(changed["diff"].abs().sort_values(ascending=False).index)
    shown = shown.head(TERMINAL_DOCUMENTS)
    rich = Table(
        title="Run B against run A, paired on qa_id",
        caption=f"diff = B - A with its 95% paired bootstrap CI; p: paired randomisation test. "
        f"Per document only p < {SIGNIFICANT} ({len(shown)} of {len(changed)} shown; no "
        f"correction for many comparisons); every row is in {result.path.name}",
    )
    for header in ("document", "metric", "A", "B", "diff", "95% CI", "p", "better/worse/same"):
        rich.add_column(header, justify="left" if header in ("document", "metric") else "right")
    for _, row in overall.iterrows():
        rich.add_row(*_cells(row), style="bold")
    rich.add_section()
    for _, row in shown.iterrows():
        rich.add_row(*_cells(row))
    return rich


def _cells(row: pd.Series) -> list[Text]:
    """One row: the means, B - A with its CI and p-value, and the counts; a dash with no pairs."""
    numbers = ["-"] * 5
    if row["n"]:
        numbers = [f"{row['mean_a']:.3f}", f"{row['mean_b']:.3f}", f"{row['diff']:+.3f}"]
        numbers += [f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]", f"{row['p_value']:.2g}"]
    colour = "green" if row["diff"] > 0 else "red" if row["diff"] < 0 else ""
    counts = "/".join(str(row[name]) for name in ("improved", "worse", "same"))
    kind = str(row.get("kind", "all"))
    document = printable(str(row["document"])) + ("" if kind == "all" else f" · {kind}")
    cells = [
        Text(document),
        Text(str(row["metric"])),
        *map(Text, numbers),
        Text(counts),
    ]
    cells[4].stylize(colour)
    return cells


def calibration_table(table: pd.DataFrame) -> Table:
    """calibration.csv as a compact rich table."""
    shown = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="The judge against your labels")
    shown.add_column("metric", no_wrap=True)
    for *_, label in FIGURES:
        shown.add_column(label, justify="right", no_wrap=True)
    for record in table.to_dict("records"):
        rho = number(record["spearman"])
        if not pd.isna(record["spearman_ci_low"]):
            rho += f" [{record['spearman_ci_low']:.2f}, {record['spearman_ci_high']:.2f}]"
        figures = [number(record[name]) for name, *_ in FIGURES[2:]]
        shown.add_row(str(record["metric"]), str(record["n"]), rho, *figures)
    return shown
