"""Collectives of groups whose members lie on several hosts: symm inside each node, the
platform's process groups between nodes.

Symmetric memory is shared memory inside one node, so a group with members on several hosts
cannot run symm's collectives as they are. Its calls come here instead (``entry.rs`` routes
every collective whose group spans hosts to ``_call``; ``symm.barrier`` calls ``barrier``), and
each is composed of symm's own collectives on the *node group* (the members on this rank's
host, a native group: no communication to make it) and of the platform's calls
(``Platform.inter_*``: ``torch.distributed`` on gloo, NCCL or HCCL) between nodes.

Topology. The nodes are the hosts of the members (the host identities the ranks exchanged at
start-up; ``SYMM_HOST_ID`` simulates hosts on one machine), in the order of their first member
in the group; a member's *local index* is its place among its node's members, in group order.
It is computed locally (no communication) and cached per group, like every group's state.
Between nodes, the members of one local index (one per node that has one, in node order)
exchange the platform's messages (``Platform.inter_isend``/``inter_irecv``) on the caller's own
process group: making dedicated groups is collective over the whole job in torch (a call on a
sub-group cannot ask the other ranks), and messages need no group of their own. A group whose
own backend is symm's (the "symm" torch.distributed backend, ``c10d.py``) cannot carry them (they
would come back here): the backend makes a private Gloo group of the same members when torch
creates the group, and the torch platform's ``inter_*`` use it for that group.

Algorithms (``k`` nodes, ``n`` members; docs/accuracy.md gives the order of reduction):

- allreduce, nodes of equal size ``s``: reduce-scatter in the node (member ``l`` gets part
  ``l`` of the node's reduction), allgather of that part between the nodes' members ``l``
  followed by a local reduction in node order, allgather in the node. Nodes of different
  sizes: allreduce in the node, allgather between the nodes' first members (the leaders) and
  the same local reduction, broadcast in the node from the leader.
- reduce_scatter, equal nodes: the input rearranged so that member ``l``'s part holds the
  destinations of local index ``l`` in node order, reduce-scatter in the node, alltoall between
  the nodes' members ``l``, local reduction in node order. Different sizes: the allreduce
  above of a copy of the input, then this rank's part of it.
- allgather, equal nodes: allgather between the nodes' members ``l``, then in the node.
  Different sizes: allgather in the node, allgather of the (padded) node blocks between the
  leaders, broadcast in the node from the leader.
- broadcast: from the source to the members with its local index on every node, then in each
  node; when a node has no member with that index, through the leaders instead.
- alltoall(v): the parts for members on this node over symm, the others as the platform's
  messages straight between the two ranks (each part crosses between hosts once, as in any
  scheme), each preceded by its count (a count the receiver does not expect is a Mismatch).
- send, recv, sendrecv: symm between two members on one host, the platform between hosts.

Every wait is bounded by ``SYMMETRIC_MEMORY_TIMEOUT``: symm's, and the platform's messages
(``inter_wait``); ``symm.barrier`` uses the platform's barrier of the caller's group (bounded by
that group's timeout). ``async_op=True`` is refused on such groups (``Unsupported``): the
composition runs on the calling thread (the "symm" torch.distributed backend runs its async
operations blocking on such groups, and returns them complete).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _api, _symm


class Topology:
    """Where the members of a group spanning hosts lie, and the groups its calls run on."""

    def __init__(self, st: Any, g: Any, parent: Any) -> None:
        hosts = st.comm.hosts
        native = list(g.ranks)
        by_host: Dict[str, List[int]] = {}
        for r, n in enumerate(native):
            by_host.setdefault(hosts[n], []).append(r)
        #: The group ranks of each node, in group order; nodes in the order of their first member.
        self.nodes: List[List[int]] = list(by_host.values())
        self.hosts: List[str] = list(by_host)
        self.node_of = [0] * len(native)
        self.local_of = [0] * len(native)
        for j, members in enumerate(self.nodes):
            for i, r in enumerate(members):
                self.node_of[r], self.local_of[r] = j, i
        self.size = len(native)
        self.me: int = g.rank
        self.my_node = self.node_of[self.me]
        self.local = self.local_of[self.me]
        #: Global rank of each group rank.
        self.global_ranks = [st.ranks[n] for n in native]
        #: This node's members as a native group (symm runs on it; no communication to make it).
        self.node = st.comm.group([native[r] for r in self.nodes[self.my_node]])
        # The fast path finds it there, as the groups the API resolved.
        st.groups[self.node] = self.node
        self.even = len({len(m) for m in self.nodes}) == 1
        #: The caller's platform group (None: the whole job): messages between hosts use it.
        self.parent = parent
        self._st = st

    def across(self, local: int) -> List[int]:
        """The group ranks of local index ``local``, in node order (an inter-node group)."""
        return [m[local] for m in self.nodes if len(m) > local]

    def node_size(self) -> int:
        return len(self.nodes[self.my_node])

    def _wait(self, handles: List[Any]) -> None:
        self._st.platform.inter_wait(handles, self._st.comm.default_timeout)

    def inter_allgather(self, output: Any, input: Any) -> None:
        """Allgather among the members of this rank's local index, one per node that has one
        (node order), by the platform's messages on the caller's group."""
        P, m = self._st.platform, self._numel(input)
        handles = []
        for q, r in enumerate(self.across(self.local)):
            part = P.narrow(output, q * m, m)
            if r == self.me:
                P.copy_into(part, input)
            else:
                handles += [P.inter_isend(input, r, self.parent), P.inter_irecv(part, r, self.parent)]
        self._wait(handles)

    def inter_alltoall(self, output: Any, input: Any, part: int) -> None:
        """Alltoall of ``part`` elements per member among the members of this rank's local index."""
        P = self._st.platform
        handles = []
        for q, r in enumerate(self.across(self.local)):
            mine, theirs = P.narrow(input, q * part, part), P.narrow(output, q * part, part)
            if r == self.me:
                P.copy_into(theirs, mine)
            else:
                handles += [P.inter_isend(mine, r, self.parent), P.inter_irecv(theirs, r, self.parent)]
        self._wait(handles)

    def inter_broadcast(self, tensor: Any, src: int) -> None:
        """Broadcast from the member of node ``src`` among the members of this rank's local index,
        every node having one."""
        P, members = self._st.platform, self.across(self.local)
        root = members[src]
        if root == self.me:
            self._wait([P.inter_isend(tensor, r, self.parent) for r in members if r != root])
        else:
            self._wait([P.inter_irecv(tensor, root, self.parent)])

    def _numel(self, tensor: Any) -> int:
        return int(_api._desc(self._st, tensor, "tensor")[1])

    def describe(self) -> str:
        return ", ".join(f"{h}: ranks {[self.global_ranks[r] for r in m]}" for h, m in zip(self.hosts, self.nodes))


def topology(st: Any, group: Any) -> Topology:
    """The cached topology of ``group`` (a group spanning hosts), made on first use."""
    g = _api._native_group(st, group)
    topo = st.hier.get(g.id)
    if topo is None:
        topo = Topology(st, g, st.group if group is None else group)
        st.hier[g.id] = topo
    return topo


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def _start(group: Any, async_op: Any, function: str) -> Tuple[Any, Topology]:
    st = _api._current()
    if async_op:
        raise _api._error(
            _symm.Unsupported,
            st.comm.rank,
            f"{function}(async_op=True) on a group whose members lie on several hosts: its hierarchical form "
            "(symm inside each node, the platform between nodes) runs blocking only; call it with async_op=False",
        )
    return st, topology(st, group)


def _flat(st: Any, tensor: Any, arg: str) -> Tuple[Any, Any]:
    """The 1-D view of a contiguous tensor argument, and its description."""
    d = _api._desc(st, tensor, arg)
    if not d[3]:
        raise _api._invalid(st.comm.rank, arg, d[5] or "<tensor>", "expected a contiguous tensor")
    return st.platform.flat(tensor), d


def _op(st: Any, op: Any, dtype: str) -> str:
    name = st.comm.reduce_op(st.platform.scalar(op))
    if name == "avg" and "float" not in dtype:
        raise _api._invalid(st.comm.rank, "op", "avg", f"needs a floating-point dtype, not {dtype}")
    return name


def _rank(st: Any, topo: Topology, value: Any, arg: str) -> int:
    v = st.platform.scalar(value)
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise _api._invalid(st.comm.rank, arg, repr(value), "expected an int (a rank of the group)")
    r = v.__index__()
    if not 0 <= r < topo.size:
        raise _api._error(
            _symm.GroupError,
            st.comm.rank,
            f"{arg} = {r} is outside the group of {topo.size} ranks (global ranks {topo.global_ranks})",
        )
    return r


def _same(st: Any, arg: str, d: Any, numel: int, other: Any, what: str) -> None:
    """``d`` (argument ``arg``) must have ``numel`` elements and ``other``'s dtype."""
    if d[2] != other[2]:
        raise _api._invalid(st.comm.rank, arg, d[2], f"must have the dtype of {what} ({other[2]})")
    if d[1] != numel:
        raise _api._invalid(st.comm.rank, arg, f"{d[1]} elements", f"expected {numel} ({what})")


# --------------------------------------------------------------------------------------------
# The collectives (parameters as the native table's, src/ops.rs)
# --------------------------------------------------------------------------------------------


def shmem_allreduce(
    tensor: Any, op: Any = "sum", group: Any = None, low_precision_dtype: Any = None, async_op: Any = False
) -> None:
    st, topo = _start(group, async_op, "shmem_allreduce")
    x, d = _flat(st, tensor, "tensor")
    _allreduce(st, topo, x, d[1], _op(st, op, d[2]), low_precision_dtype)


def _allreduce(st: Any, topo: Topology, x: Any, m: int, op: str, lp: Any) -> None:
    P, k = st.platform, len(topo.nodes)
    # Inside a node the members' values are summed; the average divides the whole sum once.
    node_op = "sum" if op == "avg" else op
    if topo.even:
        s = topo.node_size()
        c = -(-m // s)
        buf = x
        if c * s != m:  # padded to whole parts (the padding reduces to nothing anyone reads)
            buf = P.scratch(x, c * s)
            P.copy_into(P.narrow(buf, 0, m), x)
        mine = P.narrow(buf, topo.local * c, c)
        _symm.shmem_reduce_scatter(mine, buf, node_op, group=topo.node, low_precision_dtype=lp)
        gathered = P.scratch(x, k * c)
        topo.inter_allgather(gathered, mine)
        P.reduce_into(mine, [P.narrow(gathered, j * c, c) for j in range(k)], op, topo.size)
        _symm.shmem_allgather(buf, mine, group=topo.node)
        if buf is not x:
            P.copy_into(x, P.narrow(buf, 0, m))
        return
    _symm.shmem_allreduce(x, node_op, group=topo.node, low_precision_dtype=lp)
    if topo.local == 0:
        gathered = P.scratch(x, k * m)
        topo.inter_allgather(gathered, x)
        P.reduce_into(x, [P.narrow(gathered, j * m, m) for j in range(k)], op, topo.size)
    _symm.shmem_broadcast(x, 0, group=topo.node)


def shmem_reduce_scatter(
    output_tensor: Any,
    input_tensor: Any,
    op: Any = "sum",
    group: Any = None,
    low_precision_dtype: Any = None,
    async_op: Any = False,
) -> None:
    st, topo = _start(group, async_op, "shmem_reduce_scatter")
    out, do = _flat(st, output_tensor, "output_tensor")
    inp, di = _flat(st, input_tensor, "input_tensor")
    m, n = do[1], topo.size
    _same(st, "input_tensor", di, n * m, do, f"{n} ranks x output_tensor's {m} elements")
    op = _op(st, op, do[2])
    P, k = st.platform, len(topo.nodes)
    if not topo.even:
        whole = P.scratch(inp, n * m)
        P.copy_into(whole, inp)
        _allreduce(st, topo, whole, n * m, op, low_precision_dtype)
        P.copy_into(out, P.narrow(whole, topo.me * m, m))
        return
    # Member l of every node gathers the node's values for the destinations of local index l,
    # in node order: its part of `buf` is then [node 0's, node 1's, ...] for those destinations.
    buf = P.scratch(inp, n * m)
    for i, dests in enumerate(topo.across(index) for index in range(topo.node_size())):
        for j, r in enumerate(dests):
            P.copy_into(P.narrow(buf, (i * k + j) * m, m), P.narrow(inp, r * m, m))
    mine = P.narrow(buf, topo.local * k * m, k * m)
    node_op = "sum" if op == "avg" else op
    _symm.shmem_reduce_scatter(mine, buf, node_op, group=topo.node, low_precision_dtype=low_precision_dtype)
    received = P.scratch(inp, k * m)
    topo.inter_alltoall(received, mine, m)
    P.reduce_into(out, [P.narrow(received, j * m, m) for j in range(k)], op, n)


def shmem_allgather(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: Any = False) -> None:
    st, topo = _start(group, async_op, "shmem_allgather")
    out, do = _flat(st, output_tensor, "output_tensor")
    inp, di = _flat(st, input_tensor, "input_tensor")
    m, n = di[1], topo.size
    _same(st, "output_tensor", do, n * m, di, f"{n} ranks x input_tensor's {m} elements")
    P, k, s = st.platform, len(topo.nodes), topo.node_size()
    if topo.even:
        # Member l gets the inputs of local index l from every node, then the node shares them.
        block = P.scratch(inp, k * m)
        topo.inter_allgather(block, inp)
        everything = P.scratch(inp, s * k * m)
        _symm.shmem_allgather(everything, block, group=topo.node)
        for i in range(s):
            for j, r in enumerate(topo.across(i)):
                P.copy_into(P.narrow(out, r * m, m), P.narrow(everything, (i * k + j) * m, m))
        return
    # Nodes of different sizes: each node's block (padded to the largest node) through the leaders.
    most = max(len(members) for members in topo.nodes)
    block = P.scratch(inp, most * m)
    _symm.shmem_allgather(P.narrow(block, 0, s * m), inp, group=topo.node)
    everything = P.scratch(inp, k * most * m)
    if topo.local == 0:
        topo.inter_allgather(everything, block)
    _symm.shmem_broadcast(everything, 0, group=topo.node)
    for j, members in enumerate(topo.nodes):
        for i, r in enumerate(members):
            P.copy_into(P.narrow(out, r * m, m), P.narrow(everything, (j * most + i) * m, m))


def shmem_broadcast(tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False) -> None:
    st, topo = _start(group, async_op, "shmem_broadcast")
    x, _ = _flat(st, tensor, "tensor")
    src = _rank(st, topo, src_rank, "src_rank")
    node, local = topo.node_of[src], topo.local_of[src]
    if all(len(members) > local for members in topo.nodes):
        # The members of the source's local index (one per node) get it, then their nodes.
        if topo.local == local:
            topo.inter_broadcast(x, node)
        _symm.shmem_broadcast(x, local, group=topo.node)
        return
    # Some node has no member of that index: through the nodes' first members.
    if topo.my_node == node and local != 0:
        _symm.shmem_broadcast(x, local, group=topo.node)
    if topo.local == 0:
        topo.inter_broadcast(x, node)
    if topo.my_node != node:
        _symm.shmem_broadcast(x, 0, group=topo.node)


def shmem_alltoall(
    send_tensor_list: Any, receive_tensor: Any, receive_list: Any, group: Any = None, async_op: Any = False
) -> None:
    st, topo = _start(group, async_op, "shmem_alltoall")
    n, P = topo.size, st.platform
    descs = _api._descs(st, send_tensor_list, "send_tensor_list")
    recv, dr = _flat(st, receive_tensor, "receive_tensor")
    counts = _api._counts(st, receive_list, "receive_list")
    if len(descs) != n:
        raise _api._invalid(st.comm.rank, "send_tensor_list", f"{len(descs)} tensors", f"expected one per rank ({n})")
    if len(counts) != n:
        raise _api._invalid(st.comm.rank, "receive_list", counts, f"expected one count per rank ({n})")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise _api._invalid(st.comm.rank, "receive_list", counts, "counts are integers >= 0")
    for i, d in enumerate(descs):
        if not d[3] or d[2] != dr[2]:
            raise _api._invalid(
                st.comm.rank, "send_tensor_list", f"entry {i}", f"expected a contiguous tensor of {dr[2]}"
            )
    if sum(counts) > dr[1]:
        raise _api._invalid(
            st.comm.rank, "receive_list", counts, f"sums to {sum(counts)}, past receive_tensor's {dr[1]} elements"
        )
    sends = [P.flat(t) for t in send_tensor_list]
    offsets = [sum(counts[:r]) for r in range(n)]
    local = topo.nodes[topo.my_node]
    # The members on this node, over symm.
    node_recv = P.scratch(recv, sum(counts[r] for r in local))
    _symm.shmem_alltoall([sends[r] for r in local], node_recv, [counts[r] for r in local], group=topo.node)
    at = 0
    for r in local:
        P.copy_into(P.narrow(recv, offsets[r], counts[r]), P.narrow(node_recv, at, counts[r]))
        at += counts[r]
    # The others, by the platform's messages straight from the send tensors into place; each
    # part is preceded by its count, so that a count the receiver does not expect is a Mismatch
    # (naming both ranks), not a part cut short.
    remote = [r for r in range(n) if topo.node_of[r] != topo.my_node]
    telling = P.int_tensor([descs[r][1] for r in remote])
    told = P.int_tensor([0] * len(remote))
    handles = []
    for i, r in enumerate(remote):
        handles += [P.inter_isend(P.narrow(telling, i, 1), r, topo.parent)]
        handles += [P.inter_irecv(P.narrow(told, i, 1), r, topo.parent)]
        handles += [P.inter_isend(sends[r], r, topo.parent)]
        handles += [P.inter_irecv(P.narrow(recv, offsets[r], counts[r]), r, topo.parent)]
    P.inter_wait(handles, st.comm.default_timeout)
    for i, r in enumerate(remote):
        sent = P.scalar(P.narrow(told, i, 1))
        if sent != counts[r]:
            raise _api._error(
                _symm.Mismatch,
                st.comm.rank,
                f"shmem_alltoall: receive_list[{r}] = {counts[r]}, but group rank {r} (global rank "
                f"{topo.global_ranks[r]}) sent {sent} elements (receive_tensor holds what arrived of them)",
            )


def shmem_send(tensor: Any, dst_rank: Any, group: Any = None, async_op: Any = False) -> None:
    st, topo = _start(group, async_op, "shmem_send")
    x, _ = _flat(st, tensor, "tensor")
    dst = _rank(st, topo, dst_rank, "dst_rank")
    _exchange(st, topo, (x, dst), None)


def shmem_recv(tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False) -> None:
    st, topo = _start(group, async_op, "shmem_recv")
    x, _ = _flat(st, tensor, "tensor")
    src = _rank(st, topo, src_rank, "src_rank")
    _exchange(st, topo, None, (x, src))


def shmem_sendrecv(
    send_tensor: Any, dst_rank: Any, recv_tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False
) -> None:
    st, topo = _start(group, async_op, "shmem_sendrecv")
    s, _ = _flat(st, send_tensor, "send_tensor")
    dst = _rank(st, topo, dst_rank, "dst_rank")
    r, _ = _flat(st, recv_tensor, "recv_tensor")
    src = _rank(st, topo, src_rank, "src_rank")
    _exchange(st, topo, (s, dst), (r, src))


def _exchange(st: Any, topo: Topology, send: Optional[Tuple[Any, int]], recv: Optional[Tuple[Any, int]]) -> None:
    """A message to and/or from a rank of the group: symm when it is on this host, the platform
    (on the caller's group) otherwise. The platform's part is started first and waited for last,
    so that neither transport waits for the other's progress."""
    P = st.platform
    here = lambda r: topo.node_of[r] == topo.my_node  # noqa: E731
    started = []
    if send is not None and not here(send[1]):
        started.append(P.inter_isend(send[0], send[1], topo.parent))
    if recv is not None and not here(recv[1]):
        started.append(P.inter_irecv(recv[0], recv[1], topo.parent))
    local_send = send if send is not None and here(send[1]) else None
    local_recv = recv if recv is not None and here(recv[1]) else None
    if local_send and local_recv:
        _symm.shmem_sendrecv(
            local_send[0], topo.local_of[local_send[1]], local_recv[0], topo.local_of[local_recv[1]], group=topo.node
        )
    elif local_send:
        _symm.shmem_send(local_send[0], topo.local_of[local_send[1]], group=topo.node)
    elif local_recv:
        _symm.shmem_recv(local_recv[0], topo.local_of[local_recv[1]], group=topo.node)
    # Bounded as every wait here (a message's own wait() may wait for its peer forever).
    P.inter_wait(started, st.comm.default_timeout)


def barrier(st: Any, group: Any) -> None:
    """``symm.barrier`` of a group spanning hosts: the node's barrier (symm's work in it is
    complete), then the platform's barrier of the whole group."""
    topo = topology(st, group)
    st.comm.barrier(topo.node)
    st.platform.inter_barrier(topo.parent)


def refusal(st: Any, g: Any, what: str, target: Any = None) -> Exception:
    """The GroupError of a call symmetric memory cannot serve on the group ``g`` spanning hosts
    (``what``: the call; ``target``: its ``target_rank`` as given, for a one-sided call)."""
    # Only where the members lie is asked: no platform group is needed (nor made).
    topo = st.hier.get(g.id) or Topology(st, g, None)
    me = st.comm.rank
    mine = topo.hosts[topo.my_node]
    v = st.platform.scalar(target)
    if target is not None and hasattr(v, "__index__") and 0 <= v.__index__() < topo.size:
        r = v.__index__()
        there = topo.hosts[topo.node_of[r]]
        if there != mine:
            return _api._error(
                _symm.GroupError,
                me,
                f"{what}: target_rank = {r} (global rank {topo.global_ranks[r]}) is on host {there!r} and this rank "
                f"on host {mine!r}: the group spans hosts, and one-sided calls need both ranks on one node (symmetric "
                "memory is shared memory inside a node: there is no load/store path between hosts). Use "
                "shmem_send/shmem_recv or a collective, which work across hosts",
            )
    return _api._error(
        _symm.GroupError,
        me,
        f"{what}: the group spans hosts ({topo.describe()}): symmetric memory is shared inside one node, so "
        f"{'one-sided calls' if target is not None else 'symmetric allocation'} need a group of one node's ranks "
        "(collectives and shmem_send/shmem_recv on ordinary tensors work on this group)",
    )


#: The calls ``entry.rs`` routes here, by function name.
_CALLS: Dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (
        shmem_allreduce,
        shmem_reduce_scatter,
        shmem_allgather,
        shmem_alltoall,
        shmem_broadcast,
        shmem_send,
        shmem_recv,
        shmem_sendrecv,
    )
}


def _call(function: str, given: Dict[str, Any]) -> None:
    """Runs the public collective ``function`` with the arguments ``given`` (by name) on a group
    spanning hosts."""
    return _CALLS[function](**given)


__all__: Sequence[str] = ["Topology", "topology"]
