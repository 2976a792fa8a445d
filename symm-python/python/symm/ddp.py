"""A DDP communication hook that keeps DDP's gradient buckets in symmetric memory.

::

    model = DistributedDataParallel(net, process_group=group, gradient_as_bucket_view=True)
    model.register_comm_hook(group, symm.ddp.allreduce_hook)

DDP over the backend alone (``"symm"``, symm/c10d.py) already works; its buckets are ordinary
memory, which symm stages through the group's workspace: a copy in and a copy out around every
allreduce, most of its time for large buckets (docs/performance.md, "DDP over the
torch.distributed backend"). DDP has no say in where its buckets live, so this hook moves them:
the first time it sees a bucket it takes the same number of bytes in the symmetric heap
(collective over the group, as the bucket's allreduce is), copies the bucket there and points the
bucket's storage at that memory in place (``UntypedStorage._swap_data_ptr_``, as torch's CUDA
graph trees swap storages). Every tensor on that storage follows, DDP's views of the bucket and,
with ``gradient_as_bucket_view=True``, the parameters' gradients; from then on the allreduce reads
and writes the buckets where they are, zero-copy. The average is symm's ``avg`` reduction, in the
same pass (no separate division of the bucket), in group-rank order as every symm reduction.

A bucket is moved when every member's bucket can be: a whole CPU storage (what DDP allocates),
not symmetric yet, on a group within one host, and a heap with room for it on every member (the
members agree first, so they move it together or none does; a bucket that was not moved is
staged from then on, as by the backend). A moved bucket keeps its heap range until DDP drops it
(the range comes back at the group's next symmetric allocation): the heap
(``SYMMETRIC_MEMORY_HEAP_SIZE``, default 1 GiB) must hold the model's gradients besides the
workspace. Only DDP's buckets should go through the hook: memory aliased outside torch (a NumPy
array over the bucket, say) would stop seeing the bucket once it moved.
"""

from typing import Any, Set, Tuple

import torch
import torch.distributed as dist

from . import _api
from ._symm import HeapExhausted, shmem_allreduce

__all__ = ["allreduce_hook"]

#: Buckets (index, bytes) the members agreed not to move: staged from then on, not asked again.
_staged: Set[Tuple[int, int]] = set()


def _movable(t: torch.Tensor, group: Any) -> bool:
    """Whether this member could move ``t``, a CPU tensor not in the heap yet, into it (a whole
    storage, on a group within one host, with torch able to swap storages)."""
    storage = t.untyped_storage()
    return (
        t.is_contiguous()
        and t.storage_offset() == 0
        and storage.nbytes() == t.numel() * t.element_size() > 0
        and hasattr(storage, "_swap_data_ptr_")
        and not _api._native_group(_api._current(), group).spans_hosts
    )


def _move_to_heap(t: torch.Tensor, group: Any) -> None:
    """Points ``t``'s storage at a new symmetric allocation holding its bytes (collective)."""
    heap = _api.empty(t.numel(), t.dtype, group=group)
    heap.copy_(t)
    # The bucket's storage takes the heap memory (its deleter releases the allocation when DDP
    # drops the bucket); `heap` takes the bucket's old memory, released when it goes here.
    t.untyped_storage()._swap_data_ptr_(heap.untyped_storage())


def _agree(movable: bool, group: Any) -> bool:
    """Whether every member can move its bucket (a blocking min over the group: once per
    bucket, so its wait behind the group's asynchronous work is paid once)."""
    flag = torch.tensor([int(movable)], dtype=torch.int32)
    shmem_allreduce(flag, "min", group=group)
    return bool(flag.item())


# The annotations are the classes DDP's register_comm_hook checks for (no postponed evaluation).
def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged over ``state`` (the process group DDP runs
    on; ``None``: every rank), moved into the symmetric heap the first time (module docs).

    Returns:
        A future of the averaged bucket, completed when symm's asynchronous allreduce is (on a
        group spanning hosts the allreduce is blocking: symm.hier has no asynchronous form).
    """
    buf = bucket.buffer()
    key = (bucket.index(), buf.numel() * buf.element_size())
    if key not in _staged and not _api.is_symmetric(buf):
        # npu buckets stay (every member's bucket is on the same device type: no agreement).
        if buf.device.type != "cpu" or not _agree(_movable(buf, state), state):
            _staged.add(key)
        else:
            try:
                _move_to_heap(buf, state)
            except HeapExhausted:
                # The members agree on a common free range, so every one of them lands here.
                _staged.add(key)
    if _api._native_group(_api._current(), state).spans_hosts:
        shmem_allreduce(buf, "avg", group=state)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buf)
        return done
    work = shmem_allreduce(buf, "avg", group=state, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
