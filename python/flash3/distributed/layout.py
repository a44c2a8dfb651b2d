"""How a sequence is split over the ranks of a context-parallel group.

"contiguous": rank r holds tokens [r * n, (r + 1) * n) of a sequence of
W * n tokens. With a causal mask the last rank then does W times the work of
the first.

"zigzag" (the load-balanced layout for causal attention): the sequence is cut
into 2W equal chunks and rank r holds chunks r and 2W - 1 - r, concatenated,
so every rank has one early and one late chunk and the same number of visible
(query, key) pairs. For W = 2 and chunks 0 1 2 3: rank 0 holds 0 3, rank 1
holds 1 2.

The sequence dimension is dim 1, as in flash3's (batch, seqlen, heads, dim).
"""

import torch

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}; got {layout!r}")


def _chunk_count(layout, world_size):
    return 2 * world_size if layout == "zigzag" else world_size


def chunks_of_rank(layout, rank, world_size):
    """Indices of the global chunks rank `rank` holds, in its local order."""
    check_layout(layout)
    return (rank, 2 * world_size - 1 - rank) if layout == "zigzag" else (rank,)


def shard_sequence(x, rank, world_size, layout="zigzag"):
    """Rank `rank`'s shard of a full (batch, seqlen, ...) tensor (a copy)."""
    check_layout(layout)
    chunks = _chunk_count(layout, world_size)
    seqlen = x.shape[1]
    if seqlen % chunks:
        raise ValueError(
            f"x: the sequence length ({seqlen}) must be a multiple of {chunks} for the "
            f"{layout} layout over {world_size} ranks")
    pieces = x.chunk(chunks, dim=1)
    return torch.cat([pieces[c] for c in chunks_of_rank(layout, rank, world_size)], dim=1)


def unshard_sequence(shards, layout="zigzag"):
    """The full tensor from every rank's shard (a list in rank order)."""
    check_layout(layout)
    world_size = len(shards)
    per_rank = len(chunks_of_rank(layout, 0, world_size))
    pieces = [None] * _chunk_count(layout, world_size)
    for rank, shard in enumerate(shards):
        for piece, c in zip(shard.chunk(per_rank, dim=1), chunks_of_rank(layout, rank, world_size)):
            pieces[c] = piece
    return torch.cat(pieces, dim=1)


def global_order(layout, world_size, seqlen, device=None):
    """Global positions of the tokens of all shards concatenated in rank order
    (what an all-gather of the shards along the sequence holds)."""
    positions = torch.arange(seqlen, device=device).unsqueeze(0).unsqueeze(-1)
    shards = [shard_sequence(positions, r, world_size, layout) for r in range(world_size)]
    return torch.cat(shards, dim=1).view(-1)
