"""Streaming (iterable) training and validation data: the shard protocol (``ShardedIterable``), the
readers, the steps in ``data.stream_mode=invariant`` / ``sharded``, and their checkpoint position."""

from trainer.data.streaming.protocol import MODES, ShardedIterable

__all__ = ["MODES", "ShardedIterable"]
