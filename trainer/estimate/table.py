"""The estimator's printout: the configured strategy per rank, then every strategy side by side."""

from __future__ import annotations

from trainer.estimate.formulas import RankBytes
from trainer.estimate.plan import Row

GIB = 2 ** 30
COLUMNS = ("parameters", "gradients", "optimizer", "buckets", "activations")


def human(nbytes: float) -> str:
    """``1.50 GiB``, ``12.0 MiB``, ``512 B``: binary units."""
    for unit, size in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"


def fits(rank: RankBytes, memory_gb: float | None, measured: bool = True) -> str:
    """Whether ``rank`` fits in ``memory_gb`` GiB; without measured activations, only its state is known."""
    if memory_gb is None:
        return "-"
    if rank.total > memory_gb * GIB:
        return "no"
    return "yes" if measured else "state only"


def _grid(header: list[str], lines: list[list[str]], left_last: bool = False) -> str:
    """Columns aligned: the first (and with ``left_last`` the last) to the left, numbers to the right."""
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    left = {0, len(header) - 1} if left_last else {0}

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, lines)])


def _cells(r: RankBytes, measured: bool) -> list[str]:
    """The columns' figures; activations that were not measured say so (the total then leaves them out)."""
    cells = [human(getattr(r, c)) for c in COLUMNS]
    if not measured:
        cells[-1] = "not measured"
    return cells


def configured_table(row: Row, memory_gb: float | None, label: str = "rank", measured: bool = True,
                     first: int = 0) -> str:
    """Each rank (or pipeline rank) of the configured strategy; identical ranks collapsed into a range.
    ``first``: the number of ``row.ranks[0]`` (a row of one rank: the dry run's)."""
    lines, start = [], 0
    for i in range(1, len(row.ranks) + 1):
        if i == len(row.ranks) or row.ranks[i] != row.ranks[start]:
            r = row.ranks[start]
            a, b = start + first, i - 1 + first
            name = f"{label} {a}" if a == b else f"{label}s {a}-{b}"
            lines.append([name, *_cells(r, measured), human(r.total), fits(r, memory_gb, measured)])
            start = i
    return _grid(["", *COLUMNS, "total", "fits"], lines)


def comparison_table(rows: list[Row], memory_gb: float | None, checkpointing: bool, measured: bool = True) -> str:
    """One line per strategy: its largest rank (or pipeline stage)."""
    lines = []
    for row in rows:
        r = row.worst
        lines.append([row.name, *_cells(r, measured), human(r.total), fits(r, memory_gb, measured), row.detail])
    header = ["strategy", *COLUMNS[:-1], "activations" + (" (ckpt)" if checkpointing else ""), "total", "fits", "layout"]
    notes = [f"  {row.name}: {row.note}" for row in rows if row.note]
    return "\n".join([_grid(header, lines, left_last=True), *notes])
