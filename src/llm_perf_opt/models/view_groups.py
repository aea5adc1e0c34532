"""Batched vision (`runtime.batch_vision`): the views of several pages through one encoder call per view shape.

The stacks of views of one shape (each page's global view; its tiles) are concatenated, encoded in one call and split
back per page. The encoders treat the views of a batch independently, so each view's features are its own, within
floating-point rounding. With `multiple` > 1 every group is padded with zero views to a multiple of it (compiled
vision: a few fixed batch shapes per group, not one graph per page mix); the padding's features are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: One call of the vision stack: views (n, 3, H, W) -> features with n first.
EncodeViews = Callable[[torch.Tensor], torch.Tensor]


def padded_count(count: int, multiple: int) -> int:
    """`count` rounded up to a multiple of `multiple` (≥ 1)."""
    return -(-count // multiple) * multiple


def encode_grouped(
    stacks: Sequence[torch.Tensor | None], encode: EncodeViews, multiple: int = 1
) -> list[torch.Tensor | None]:
    """The features of each stack of views (None for None or no views), those of one shape encoded in one call."""
    if multiple < 1:
        raise ValueError(f"multiple={multiple} must be ≥ 1")
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, stack in enumerate(stacks):
        if stack is not None and stack.shape[0] > 0:
            groups.setdefault(tuple(stack.shape[1:]), []).append(index)
    out: list[torch.Tensor | None] = [None] * len(stacks)
    for members in groups.values():
        views = [stack for i in members if (stack := stacks[i]) is not None]
        joined = torch.cat(views, dim=0)
        real = joined.shape[0]
        extra = padded_count(real, multiple) - real
        if extra:
            joined = torch.cat([joined, joined.new_zeros((extra, *joined.shape[1:]))], dim=0)
        features = encode(joined)[:real]
        sizes = [int(v.shape[0]) for v in views]
        for index, part in zip(members, torch.split(features, sizes, dim=0), strict=True):
            out[index] = part
    return out
