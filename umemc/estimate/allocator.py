"""A replay of ggml's graph allocator (ggml/src/ggml-alloc.c, `ggml_gallocr`), for the compute buffer.

llama.cpp sizes its compute buffer by allocating the worst-case graph once (`sched_reserve`): every tensor the
graph computes gets an offset in one buffer, and the buffer is as large as the highest offset reached. The
allocator is deterministic, so replaying its rules on the same graph gives the same size to the byte, where a
formula for "the largest set of tensors alive at once" misses by where freed blocks happen to lie. The rules,
as the vendored ggml implements them:

- graph inputs (leaves: the token ids, the positions, the KV indices, the attention mask ...) are allocated
  first, in the order the graph reaches them; weights and the KV cache live in buffers of their own;
- nodes are then taken in graph order: a node is placed in its first source's memory (in place) when its op
  allows it (`ggml_op_can_inplace`), that source is not a graph output, is allocated by this allocator (a view
  never is: its memory belongs to the tensor it views), has the same layout, and this node is its last user;
- otherwise it takes the best-fitting free block (the smallest one large enough, ties to the later block),
  the block at the end (which grows the buffer) only when no other fits;
- after a node, each source whose users are all done is freed, and a view's last use frees the viewed tensor
  once it has no other user or view; a freed block merges with its free neighbours;
- sizes are rounded up to the buffer's alignment (32 bytes on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALIGNMENT = 32  # ggml-backend.cpp TENSOR_ALIGNMENT: the CPU buffer type's alignment


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(eq=False, slots=True)
class Tensor:
    """One tensor of a graph, of `size` bytes (a view's are its viewed tensor's; it is never placed itself)."""

    size: int
    sources: tuple[Tensor, ...] = ()
    inplace: bool = False  # the op may write into its first suitable source (ggml_op_can_inplace)
    view_of: Tensor | None = None  # the tensor whose memory a view (reshape, permute, set_rows) shares
    external: bool = False  # weights, the KV cache: not in the compute buffer
    output: bool = False  # graph outputs (the logits) are never freed
    users: int = field(default=0, init=False)
    views: int = field(default=0, init=False)
    placed: bool = field(default=False, init=False)
    offset: int = field(default=0, init=False)


class _Blocks:
    """ggml_dyn_tallocr: free blocks sorted by offset; the last one is open-ended."""

    def __init__(self) -> None:
        self.free: list[list[int]] = [[0, 1 << 62]]
        self.high = 0

    def take(self, size: int) -> int:
        size = _aligned(size)
        best = -1
        for i, (_, free) in enumerate(self.free[:-1]):
            if free >= size and (best < 0 or free <= self.free[best][1]):
                best = i
        block = self.free[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.free[best]
        self.high = max(self.high, offset + size)
        return offset

    def give(self, offset: int, size: int) -> None:
        size = _aligned(size)
        blocks = self.free
        for i, (start, free) in enumerate(blocks):
            if start + free == offset:  # the freed bytes follow this block
                blocks[i][1] += size
                if i + 1 < len(blocks) and blocks[i][0] + blocks[i][1] == blocks[i + 1][0]:
                    blocks[i][1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == start:  # they precede it
                blocks[i] = [offset, free + size]
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == offset:
                    blocks[i - 1][1] += blocks[i][1]
                    del blocks[i]
                return
        blocks.append([offset, size])
        blocks.sort()


def buffer_size(leaves: list[Tensor], nodes: list[Tensor]) -> int:
    """The compute buffer ggml-alloc reserves for a graph: its inputs in `leaves`, its ops in `nodes`, each in
    the order llama.cpp's graph holds them."""
    blocks = _Blocks()
    for leaf in leaves:
        _place(leaf, blocks)
    for node in nodes:
        if node.view_of is not None:
            node.view_of.views += 1
        for src in node.sources:
            src.users += 1
    for node in nodes:
        _place(node, blocks)
        for parent in node.sources:
            parent.users -= 1
            if parent.users or parent.views:
                continue
            base = parent.view_of
            if base is None:
                _release(parent, blocks)
            else:  # a view's last use: the viewed tensor goes once nothing else uses or views it
                base.views -= 1
                if not base.views and not base.users:
                    _release(base, blocks)
    return blocks.high


def _place(t: Tensor, blocks: _Blocks) -> None:
    """ggml_gallocr_allocate_node: in place in a source where the rules allow it, else a block of its own."""
    if t.external or t.placed or t.view_of is not None:
        return
    t.placed = True
    if t.inplace:
        for parent in t.sources:
            # a view is never placed itself, so it is never written over (ggml_gallocr_is_own)
            if parent.placed and not parent.output and parent.size == t.size and parent.users == 1 and not parent.views:
                t.offset, parent.placed = parent.offset, False
                return
    t.offset = blocks.take(t.size)


def _release(t: Tensor, blocks: _Blocks) -> None:
    if t.placed and not t.output:  # graph outputs are never freed
        blocks.give(t.offset, t.size)
        t.placed = False
