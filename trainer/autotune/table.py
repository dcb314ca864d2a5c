"""The results table, printed and written to ``table.txt``, and the choice of the best row."""

from __future__ import annotations

from trainer.autotune.trial import TrialResult

COLUMNS = ("strategy", "micro-batch", "accum", "act. ckpt", "samples/s", "peak MB", "vs best", "result")


def best(results: list[TrialResult]) -> TrialResult | None:
    """The fastest measured row (the first of equals), or None if none ran through."""
    measured = [r for r in results if r.ok and r.samples_per_s is not None]
    return max(measured, key=lambda r: r.samples_per_s, default=None)


def rows(results: list[TrialResult]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per candidate, in the order run."""
    top = best(results)
    out = []
    for r in results:
        c = r.candidate
        ratio = f"{r.samples_per_s / top.samples_per_s:.2f}" if r.ok and top is not None else ""
        out.append((
            c.strategy, str(c.micro_batch_size), str(c.accumulation), "on" if c.activation_checkpointing else "off",
            f"{r.samples_per_s:.0f}" if r.samples_per_s is not None else "",
            f"{r.peak_mb:.0f}" if r.peak_mb is not None else "",
            ratio, ("ok, best" if r is top else r.status),
        ))
    return out


def format_table(results: list[TrialResult]) -> str:
    """A plain-text table with a header rule; numbers right-aligned."""
    cells = [COLUMNS, *rows(results)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    numeric = {1, 2, 4, 5, 6}

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                         for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join([line(COLUMNS), "  ".join("-" * w for w in widths), *map(line, cells[1:])])
