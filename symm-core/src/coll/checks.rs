//! The collectives' own argument checks, pure (no communication, no state): the host engine
//! (`symm-host`) and the reference collectives ([`super::reference`]) reject the same
//! arguments with the same errors through them.

use super::{lowp, Transport};
use crate::buffer::{LocalMut, LocalRef};
use crate::dtype::DType;
use crate::error::ArgError;
use crate::op::ReduceOp;

/// One buffer argument of a collective, as the checks see it.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    pub arg: &'static str,
    pub ptr: *const u8,
    pub len: usize,
    pub dtype: DType,
}

impl Part {
    /// Input buffer `arg`.
    #[inline(always)]
    pub fn of_ref(arg: &'static str, b: &LocalRef<'_>) -> Part {
        Part { arg, ptr: b.as_ptr(), len: b.len(), dtype: b.dtype() }
    }

    /// Output buffer `arg`.
    #[inline(always)]
    pub fn of_mut(arg: &'static str, b: &mut LocalMut<'_>) -> Part {
        Part { arg, ptr: b.as_mut_ptr(), len: b.len(), dtype: b.dtype() }
    }
}

/// Checks op/dtype/format of a reduction whose group default transport format is `default`;
/// returns the transport format in effect ([`transport_format`]).
#[inline(always)]
pub fn reduction(
    default: &Result<Option<DType>, ArgError>,
    dtype: DType,
    op: ReduceOp,
    transport: Transport,
) -> Result<Option<DType>, ArgError> {
    if op == ReduceOp::Avg && !dtype.is_float() {
        return Err(ArgError::invalid("op", "avg", format!("needs a floating-point dtype, not {dtype}")));
    }
    transport_format(transport, default, dtype)
}

/// The low-precision format of a reduction of `dtype` (`None`: full precision): the call's own
/// format, which must suit the data; none where the call asks for full precision; else the
/// group's `default` from the environment where it suits the data, and full precision where it
/// does not. The default is meant for the floating-point tensors a training step reduces
/// (gradients): an integer allreduce in the same job (a token count, a flag) runs in full
/// precision instead of failing. A default the environment spells wrong is an error for every
/// reduction that would use it. Inlined across the crates into every reduction's entry (see
/// symm-host's try-lock: together they are worth 6-17 % of a small collective's time).
#[inline]
pub fn transport_format(
    transport: Transport,
    default: &Result<Option<DType>, ArgError>,
    dtype: DType,
) -> Result<Option<DType>, ArgError> {
    match transport {
        Transport::Low(lp) => lowp::check_format(lp, dtype).map(|()| Some(lp)),
        Transport::Full => Ok(None),
        Transport::Default => Ok(default.clone()?.filter(|&lp| lowp::check_format(lp, dtype).is_ok())),
    }
}

/// Checks an out-of-place allreduce: `output` has the dtype and length of `input`, and is the
/// input itself or disjoint from it.
#[inline(always)]
pub fn allreduce_into(input: Part, output: Part) -> Option<ArgError> {
    if output.dtype != input.dtype {
        return Some(ArgError::DTypeMismatch {
            arg: "output",
            expected: input.dtype.to_string(),
            actual: output.dtype.to_string(),
        });
    }
    if output.len != input.len {
        return Some(ArgError::invalid(
            "output",
            format!("{} elements", output.len),
            format!("must hold the input's {} elements", input.len),
        ));
    }
    let bytes = input.len * input.dtype.size();
    if ranges_partially_overlap(input.ptr, bytes, output.ptr, bytes) {
        return Some(ArgError::invalid("output", "a partial overlap", "must be the input itself or disjoint from it"));
    }
    None
}

/// Checks a collective whose `whole` buffer holds `n` parts the size of `part` (reduce_scatter's
/// input and output, allgather's output and input): same dtype, the size relation, and `part`
/// either the caller's own part of `whole` (in place) or disjoint from it.
#[inline(always)]
pub fn parts(whole: Part, part: Part, n: usize, me: usize) -> Option<ArgError> {
    if part.dtype != whole.dtype {
        return Some(ArgError::DTypeMismatch {
            arg: part.arg,
            expected: format!("{}'s {}", whole.arg, whole.dtype),
            actual: part.dtype.to_string(),
        });
    }
    if whole.len != n * part.len {
        return Some(ArgError::invalid(
            whole.arg,
            format!("{} elements", whole.len),
            format!("must hold group size {n} x {}'s {} elements = {}", part.arg, part.len, n * part.len),
        ));
    }
    let size = whole.dtype.size();
    let own = whole.ptr.wrapping_add(me * part.len * size);
    if !std::ptr::eq(own, part.ptr) && ranges_partially_overlap(whole.ptr, whole.len * size, part.ptr, part.len * size)
    {
        return Some(ArgError::invalid(
            part.arg,
            format!("overlapping {}", whole.arg),
            format!("must be the caller's part of {} or disjoint from it", whole.arg),
        ));
    }
    None
}

/// Checks the send list of an alltoall over `n` members receiving into `dtype`: one piece per
/// member, each of `dtype`.
#[inline(always)]
pub fn alltoall_sends(send: &[LocalRef<'_>], dtype: DType, n: usize) -> Option<ArgError> {
    if send.len() != n {
        Some(ArgError::invalid(
            "send_tensor_list",
            format!("{} tensors", send.len()),
            format!("needs one per group rank ({n})"),
        ))
    } else if let Some((i, s)) = send.iter().enumerate().find(|(_, s)| s.dtype() != dtype) {
        Some(ArgError::DTypeMismatch {
            arg: "send_tensor_list",
            expected: format!("receive_tensor's {dtype}"),
            actual: format!("{} (entry {i})", s.dtype()),
        })
    } else {
        None
    }
}

/// Checks the send side of a single-buffer alltoall over `n` members: `n` counts that fit
/// `send`, and `send` of the receive buffer's dtype.
#[inline(always)]
pub fn alltoall_single_sends(send: &LocalRef<'_>, send_counts: &[usize], recv: DType, n: usize) -> Option<ArgError> {
    let total: Option<usize> = send_counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
    if send_counts.len() != n || total.is_none_or(|t| t > send.len()) {
        Some(ArgError::invalid(
            "send_counts",
            format!("{send_counts:?}"),
            format!("needs {n} counts summing to at most the send buffer's {} elements", send.len()),
        ))
    } else if send.dtype() != recv {
        Some(ArgError::DTypeMismatch {
            arg: "send_tensor_list",
            expected: recv.to_string(),
            actual: format!("{} (entry 0)", send.dtype()),
        })
    } else {
        None
    }
}

/// Checks the receive side of an alltoall over `n` members whose send pieces (pointer, count,
/// of `recv`'s dtype) are `sends`: one count per member, their sum within `recv`, and `recv`
/// overlapping no piece.
#[inline(always)]
pub fn alltoall_recv(sends: &[(*const u8, usize)], recv: Part, recv_counts: &[usize], n: usize) -> Option<ArgError> {
    let total: Option<usize> = recv_counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
    if recv_counts.len() != n {
        Some(ArgError::invalid(
            "receive_list",
            format!("{} counts", recv_counts.len()),
            format!("needs one per group rank ({n})"),
        ))
    } else if total.is_none_or(|t| t > recv.len) {
        Some(ArgError::invalid(
            "receive_list",
            format!("{recv_counts:?}"),
            format!("sums to more than the receive buffer's {} elements", recv.len),
        ))
    } else {
        // Peers read the send pieces while this member writes the receive buffer.
        let (recv_at, recv_bytes) = (recv.ptr, recv.len * recv.dtype.size());
        sends.iter().position(|&(ptr, len)| ranges_overlap(ptr, len * recv.dtype.size(), recv_at, recv_bytes)).map(
            |i| {
                ArgError::invalid(
                    "receive_tensor",
                    format!("{} elements at {recv_at:p}", recv.len),
                    format!("overlaps the piece for group rank {i}; it must not overlap what is sent"),
                )
            },
        )
    }
}

/// Checks a broadcast's root against the group size `n`.
#[inline(always)]
pub fn root(root: usize, n: usize) -> Option<ArgError> {
    (root >= n).then(|| ArgError::invalid("root", root, format!("must be a rank of the group (0..{n})")))
}

/// Checks that a sendrecv's buffers are disjoint (the peer may read `send` in place while
/// `recv` is being written).
#[inline(always)]
pub fn sendrecv(send: *const u8, send_bytes: usize, recv: *const u8, recv_bytes: usize) -> Option<ArgError> {
    ranges_overlap(send, send_bytes, recv, recv_bytes).then(|| {
        ArgError::invalid(
            "recv_tensor",
            format!("{recv_bytes} bytes at {recv:p}"),
            format!("must not overlap send_tensor ({send_bytes} bytes at {send:p})"),
        )
    })
}

/// Whether two byte ranges share a byte (an empty range shares none).
pub fn ranges_overlap(a: *const u8, a_len: usize, b: *const u8, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len
}

/// Whether two byte ranges share a byte without being the same range.
pub fn ranges_partially_overlap(a: *const u8, a_len: usize, b: *const u8, b_len: usize) -> bool {
    ranges_overlap(a, a_len, b, b_len) && !(std::ptr::eq(a, b) && a_len == b_len)
}
