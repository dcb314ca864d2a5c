"""A rank's rows of a ready batch: how an iterable of ready batches (a loader that is not a DataLoader)
trains on several processes with the same meaning as on one.

Every rank reads the whole iterable, so every rank holds the same batches in the same order, and each
keeps its own rows of each batch: every tensor of the batch (in nested dicts, lists and tuples) is cut
along its first dimension as the global-batch plan deals one micro-step to the ranks
(``GlobalBatchPlan.layout``: contiguous rows, rank 0 first; a batch of B rows on W ranks gives the
first ``B % W`` ranks one row more). Numbers, strings and 0-d tensors go to every rank whole. A rank
with no row (B < W) runs a padding micro-batch (the batch's first row, weight 0), as the plan's own
short batches do.

A rank's micro-batch weighs its share of the batch's rows (``rows / B``), so that with a
``training_step`` that returns the mean loss over its batch the averaged gradient is one process's:
each batch counts once per step, whatever its size (as one process weighs it). A batch holding no
tensor with rows is computed whole on every rank, each weighing ``1 / W``.

Several training loaders (each batch one batch of every loader): each loader's part is cut by its own
rows; the parts must give every rank the same share (one weight for the step's one loss), so parts
that split unevenly in different proportions are refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch


def row_counts(batch: Any) -> set[int]:
    """The first dimensions of the tensors (of at least one dimension) in ``batch``."""
    if isinstance(batch, torch.Tensor):
        return {batch.size(0)} if batch.dim() else set()
    if isinstance(batch, dict):
        return set().union(*(row_counts(value) for value in batch.values()))
    if isinstance(batch, (list, tuple)):
        return set().union(*(row_counts(value) for value in batch))
    return set()


def rank_span(count: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s rows ``[start, stop)`` of ``count`` rows on ``world`` ranks (the plan's dealing)."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def take_rows(batch: Any, start: int, stop: int) -> Any:
    """``batch`` with every tensor of at least one dimension cut to its rows ``start:stop``."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, dict):
        rows = {key: take_rows(value, start, stop) for key, value in batch.items()}
        return rows if type(batch) is dict else _same_type(batch, rows)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(take_rows(value, start, stop) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(take_rows(value, start, stop) for value in batch)
    return batch


def _same_type(batch: Any, rows: dict) -> Any:
    try:
        return type(batch)(rows)
    except TypeError:  # a mapping type that cannot be built from a dict: a plain dict
        return rows


def _part_rows(part: Any, rank: int, world: int, where: str) -> tuple[Any, int, int]:
    """``(this rank's rows of part, its row count, the part's rows)``; a part without rows: whole, 0, 0."""
    counts = row_counts(part)
    if not counts:
        return part, 0, 0
    if len(counts) > 1:
        raise ValueError(
            f"{where}: a ready batch holds tensors with first dimensions {', '.join(map(str, sorted(counts)))}; on "
            f"{world} processes each rank keeps its rows of every tensor (cut along the first dimension), so they must "
            "agree: give the batch's tensors one first dimension (per-batch values as 0-d tensors or numbers), or run "
            "on one device")
    count = counts.pop()
    start, stop = rank_span(count, rank, world)
    if start == stop:  # fewer rows than ranks: a padding micro-batch of the first row, weight 0
        return take_rows(part, 0, 1), 0, count
    return take_rows(part, start, stop), stop - start, count


def ready_batch_rows(batch: Any, rank: int, world: int, parts: list[Any] | None, where: str) -> tuple[Any, Any]:
    """``(rank's rows of batch, its weight)`` (see the module docstring). ``parts``: the keys of a
    combined batch of several training loaders (None: one loader's batch). One process: the batch, 1."""
    if world == 1:
        return batch, 1
    pieces = [(None, batch)] if parts is None else [(key, batch[key]) for key in parts]
    mine, shares = {}, {}
    for key, piece in pieces:
        mine[key], rows, count = _part_rows(piece, rank, world, where)
        if count:
            shares[key] = (rows, count)
    if parts is None:
        rows_of = mine[None]
    elif isinstance(batch, dict):
        rows_of = type(batch)(mine) if type(batch) is dict else _same_type(batch, mine)
    else:
        rows_of = type(batch)(mine[key] for key in parts)
    fractions = {rows / count for rows, count in shares.values()}
    if not shares:
        return rows_of, 1 / world  # nothing to cut: every rank computes the whole batch
    if len(fractions) > 1:
        sizes = ", ".join(f"{key!r}: {count} rows" for key, (_, count) in shares.items())
        raise ValueError(
            f"{where}: a combined batch of several training loaders ({sizes}) cannot be cut into the same share on "
            f"each of {world} processes (each rank's one loss weighs one share of every loader's batch): give every "
            f"loader a batch size (and a last batch, or drop_last=True) that {world} divides, or run on one device")
    rows, count = next(iter(shares.values()))
    return rows_of, 1 if rows == count else (0 if rows == 0 else rows / count)
