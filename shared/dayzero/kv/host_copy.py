"""Copy a sequence's blocks between two host pools in one compiled call (numba): every kind of
state, the blocks of each counted off one id list, each stretch of consecutive blocks one memmove
a layer. Python's per-copy cost (a numpy slice assignment ~1.3 us, five a handoff, or a gather
and a scatter when the ids do not count up) was most of a small state's handoff.

A host pool's storage is described once, when its pools are built, as ``places`` (kv.places): int64
[kinds, 5] rows (address, blocks, layers, bytes between layers, bytes of a block in a layer), in
``POOL_KINDS`` order; the copy moves bytes, so any dtype. The addresses hold while the pools
keep their tensors (for life: no pool's storage is ever replaced). ``copy_blocks`` (kv.handoff)
is its torch twin: the same blocks for tensors on any device.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _memmove(typingctx, dst, src, nbytes):  # noqa: ARG001 - numba's signature for an intrinsic
    """memmove(dst, src, nbytes) on addresses (llvm.memmove: libc's, not a byte loop)."""

    def codegen(context, builder, signature, args):  # noqa: ARG001
        byte_ptr = ir.IntType(8).as_pointer()
        dst_ptr, src_ptr = (builder.inttoptr(arg, byte_ptr) for arg in args[:2])
        cgutils.raw_memmove(builder, dst_ptr, src_ptr, args[2], 1)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@numba.njit(cache=True, nogil=True)
def copy_host_blocks(dst_places, src_places, plan):
    """For each kind k (a row of both ``places``): its first ``counts[k]`` blocks of its list in
    ``dst`` = those of its list in ``src``, in every layer. ``plan`` (int64), for K kinds: the count
    of each kind, the length of each kind's list in dst, the same in src, then dst's lists, kind
    after kind, then src's (a list may hold more ids than its count: a sequence's tables, a
    message's, taken as they are). All is checked before a byte moves (src's ids come from a
    message): a list shorter than its count or ids outside their pool raise IndexError, a plan or
    pools that do not match ValueError. One pool as both: a stretch may overlap its own source
    (memmove), but a block one stretch writes is read after it by a later one (the twin gathers
    first: blocks swapped differ); import_state's lists share no block (a sequence's blocks are
    not its source's)."""
    kinds = min(dst_places.shape[0], src_places.shape[0])
    if plan.shape[0] < 3 * kinds:
        raise ValueError("a plan shorter than its counts")
    head = plan[: 3 * kinds]
    if head.min() < 0 or head.max() > plan.shape[0]:  # (bounded first: their sum cannot wrap past int64)
        raise ValueError("a plan whose ids do not match its lengths")
    counts, dst_lens, src_lens = head[:kinds], head[kinds : 2 * kinds], head[2 * kinds :]
    if plan.shape[0] != 3 * kinds + dst_lens.sum() + src_lens.sum():
        raise ValueError("a plan whose ids do not match its lengths")
    dst_list, src_list = 3 * kinds, 3 * kinds + dst_lens.sum()  # where each kind's list starts
    for kind in range(kinds):
        dst_blocks, layers, size = dst_places[kind, 1], dst_places[kind, 2], dst_places[kind, 4]
        src_blocks = src_places[kind, 1]
        if src_places[kind, 2] != layers or src_places[kind, 4] != size:
            raise ValueError("the two pools' blocks differ in layers or bytes")
        if counts[kind] > dst_lens[kind] or counts[kind] > src_lens[kind]:
            raise IndexError("fewer block ids than their count")
        for i in range(counts[kind]):
            if not (0 <= plan[dst_list + i] < dst_blocks and 0 <= plan[src_list + i] < src_blocks):
                raise IndexError("a block id is outside its pool")
        dst_list, src_list = dst_list + dst_lens[kind], src_list + src_lens[kind]
    dst_list, src_list = 3 * kinds, 3 * kinds + dst_lens.sum()
    for kind in range(kinds):
        dst_ids, src_ids = plan[dst_list : dst_list + counts[kind]], plan[src_list : src_list + counts[kind]]
        dst_at, _, layers, dst_stride, size = dst_places[kind]
        src_at, src_stride = src_places[kind, 0], src_places[kind, 3]
        i, end = 0, counts[kind]
        while i < end:  # a stretch: the pairs after i that count up by one in both lists
            j = i + 1
            while j < end and dst_ids[j] == dst_ids[j - 1] + 1 and src_ids[j] == src_ids[j - 1] + 1:
                j += 1
            dst_from, src_from = dst_at + dst_ids[i] * size, src_at + src_ids[i] * size
            for layer in range(layers):
                _memmove(dst_from + layer * dst_stride, src_from + layer * src_stride, (j - i) * size)
            i = j
        dst_list, src_list = dst_list + dst_lens[kind], src_list + src_lens[kind]
