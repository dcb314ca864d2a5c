"""One rank's validation batches, computed batch by batch as a loader asks for them (O(batch) memory,
not O(validation set) per rank and pass)."""

from __future__ import annotations

from typing import Iterator, Sequence


class ValidationShard(Sequence):
    """Rank ``rank``'s validation batches: positions ``rank, rank + world_size, ...`` below
    ``num_samples`` in batches of ``batch_size`` (every position exactly once over the ranks, no
    padding with duplicates: DistributedSampler's would skew the metrics). ``order`` maps a position
    to a sample index (a shuffled or sampler-drawn order); without it the position is the index.

    ``padded(total)`` adds lockstep padding batches ``[0]`` (weight 0, ``sizes()``) up to ``total``.
    Indexing and iterating give each batch as a new ``list[int]``; equal to any sequence of the same batches.
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int,
                 order: Sequence[int] | None = None, padding: int = 0):
        self.positions = range(rank, num_samples, world_size)  # a range: O(1) whatever the size
        self.batch_size, self.order, self.padding = batch_size, order, padding
        self.real = -(-len(self.positions) // batch_size)  # batches with samples, before the padding
        self._args = (num_samples, batch_size, rank, world_size)

    def __len__(self) -> int:
        return self.real + self.padding

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of a validation shard of {len(self)} batches")
        if index >= self.real:
            return [0]  # lockstep padding: re-reads the first sample, counted with weight 0
        batch = self.positions[index * self.batch_size:(index + 1) * self.batch_size]
        return list(batch) if self.order is None else [self.order[p] for p in batch]

    def __iter__(self) -> Iterator[list[int]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def sizes(self) -> Iterator[int]:
        """Each batch's number of real samples (0 for a padding batch), without building the batches."""
        for index in range(len(self)):
            yield len(self.positions[index * self.batch_size:(index + 1) * self.batch_size]) if index < self.real else 0

    def padded(self, total: int) -> ValidationShard:
        """The same batches followed by padding batches up to ``total`` (no fewer than now)."""
        return ValidationShard(*self._args, order=self.order, padding=max(0, total - self.real))
