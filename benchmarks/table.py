"""A markdown table with a title and notes: what every sub-benchmark prints and logs."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BenchResult", "Table", "is_number"]


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Table:
    """Rows of already formatted cells; columns whose cells are all numbers are right-aligned.

    Attributes:
        title: One line above the table: what was measured, on what, with which settings.
        columns: Header cells.
        rows: One tuple of cells per row, as long as `columns`.
        notes: Lines under the table (conventions, caveats).
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for row in self.rows:
            assert len(row) == len(self.columns), (row, self.columns)

    def markdown(self) -> str:
        numeric = [bool(self.rows) and all(is_number(row[i]) for row in self.rows) for i in range(len(self.columns))]
        lines = [self.title, "",
                 "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---:" if right else "---" for right in numeric) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class BenchResult:
    """One sub-benchmark's outcome: the table to print and the flat figures to log.

    Attributes:
        name: The sub-benchmark ("step", "peers", "data", "overhead").
        table: What is printed and logged as `bench_<name>.md`.
        metrics: MLflow metric name -> value, e.g. {"step/baseline/median_ms": 3921.0}.
    """

    name: str
    table: Table
    metrics: dict[str, float] = field(default_factory=dict)
