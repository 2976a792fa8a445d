//! The SHMEM symmetric heap, its teams and its stream-ordered data plane.

use std::ffi::c_void;

use super::runtime::{chunks, Stream};
use super::shmem;
use crate::result::{shmem_check, AscendError, Result};
use crate::sys::shmem::{self as sys, aclshmem_team_t, aclshmemx_init_attr_t, aclshmemx_uniqueid_t};

/// The heap size to ask SHMEM for when `bytes` are wanted: rounded up to the 2 MiB page, more
/// than 0 and at most 40 GiB (`ACLSHMEM_MAX_LOCAL_SIZE`), as the library requires.
pub fn heap_request(bytes: usize) -> Result<u64> {
    let refused = |reason| AscendError::Refused {
        function: "aclshmemx_init_attr",
        argument: "local_mem_size",
        value: bytes.to_string(),
        reason,
    };
    if bytes == 0 {
        return Err(refused("the heap must not be empty"));
    }
    let rounded = (bytes as u64).div_ceil(sys::ACLSHMEM_PAGE_SIZE) * sys::ACLSHMEM_PAGE_SIZE;
    if rounded > sys::ACLSHMEM_MAX_LOCAL_SIZE {
        return Err(refused("Ascend SHMEM maps at most 40 GiB per PE (ACLSHMEM_MAX_LOCAL_SIZE)"));
    }
    Ok(rounded)
}

/// This PE's symmetric heap: SHMEM initialised with the unique-id bootstrap and one symmetric
/// allocation of the whole heap, which the caller sub-allocates (every SHMEM allocation is a
/// host-blocking collective; one at start-up keeps them out of the calls). Dropping it frees
/// the allocation and finalizes SHMEM, collectively: every PE drops its heap.
#[derive(Debug)]
pub struct ShmemHeap {
    base: *mut c_void,
    bytes: usize,
    my_pe: i32,
    n_pes: i32,
}

// SAFETY: the heap is device memory addressed through SHMEM, usable from any thread whose
// context has the PE's device.
unsafe impl Send for ShmemHeap {}
// SAFETY: as above; the type gives no host access to the memory.
unsafe impl Sync for ShmemHeap {}

impl ShmemHeap {
    /// A new unique id, made by the PE that will be PE 0 (it opens the listening socket the
    /// others connect to): its 136 bytes go to every PE through the caller's start-up exchange.
    pub fn unique_id() -> Result<[u8; 136]> {
        let api = shmem()?;
        let mut uid = aclshmemx_uniqueid_t { version: 0, my_pe: 0, n_pes: 0, internal: [0; 124] };
        // SAFETY: a valid out-pointer of the library's layout.
        shmem_check("aclshmemx_get_uniqueid", unsafe { (api.aclshmemx_get_uniqueid)(&mut uid) })?;
        Ok(uid.to_bytes())
    }

    /// Starts SHMEM as PE `my_pe` of `n_pes` with the unique id PE 0 made, and allocates a heap
    /// of `heap_bytes` (rounded by [`heap_request`]); collective over every PE. The calling
    /// thread's device must be set and ACL initialised.
    pub fn init(my_pe: i32, n_pes: i32, heap_bytes: usize, uid: &[u8]) -> Result<ShmemHeap> {
        let api = shmem()?;
        let local = heap_request(heap_bytes)?;
        let mut uid = aclshmemx_uniqueid_t::from_bytes(uid).ok_or_else(|| AscendError::Refused {
            function: "aclshmemx_set_attr_uniqueid_args",
            argument: "uid",
            value: format!("{} bytes", uid.len()),
            reason: "a unique id is 136 bytes (aclshmemx_uniqueid_t)",
        })?;
        let mut attr = aclshmemx_init_attr_t::defaults();
        // SAFETY: valid pointers; the library stores the pointer to `uid`, which lives until
        // `aclshmemx_init_attr` below has returned.
        let code = unsafe { (api.aclshmemx_set_attr_uniqueid_args)(my_pe, n_pes, local as i64, &mut uid, &mut attr) };
        shmem_check("aclshmemx_set_attr_uniqueid_args", code)?;
        // SAFETY: `attr` is complete (defaults, then the library's own fill) and `uid` alive.
        let code = unsafe { (api.aclshmemx_init_attr)(sys::ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr) };
        shmem_check("aclshmemx_init_attr", code)?;
        // SAFETY: SHMEM is initialised; a collective allocation of the whole heap.
        let base = unsafe { (api.aclshmem_malloc)(local as usize) };
        if base.is_null() {
            // SAFETY: initialised above; every PE fails the same allocation and finalizes.
            let _ = unsafe { (api.aclshmem_finalize)() };
            return Err(AscendError::Null {
                function: "aclshmem_malloc",
                what: format!("no symmetric heap of {local} bytes (SHMEM's log says why: SHMEM_LOG_LEVEL=INFO)"),
            });
        }
        Ok(ShmemHeap { base, bytes: local as usize, my_pe, n_pes })
    }

    /// The heap's base on this PE (a device address).
    pub fn base(&self) -> *mut c_void {
        self.base
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// This PE's number.
    pub fn my_pe(&self) -> i32 {
        self.my_pe
    }

    /// The number of PEs.
    pub fn n_pes(&self) -> i32 {
        self.n_pes
    }

    /// The address of byte `offset` of this PE's heap.
    fn at(&self, offset: usize) -> *mut c_void {
        self.base.cast::<u8>().wrapping_add(offset).cast()
    }

    /// The address at which this PE's device reaches `pe`'s heap, where SHMEM maps it.
    pub fn peer_base(&self, pe: i32) -> Result<*mut c_void> {
        let api = shmem()?;
        // SAFETY: a symmetric address; a PE the library cannot map gives NULL.
        let p = unsafe { (api.aclshmem_ptr)(self.base, pe) };
        if p.is_null() {
            Err(AscendError::Null { function: "aclshmem_ptr", what: format!("PE {pe}'s heap is not mapped here") })
        } else {
            Ok(p)
        }
    }

    /// Enqueues on `stream` a copy of `bytes` from `src` (device memory of this PE) into `pe`'s
    /// heap at `dst_offset`, split below the kernels' 32-bit byte count.
    ///
    /// # Safety
    /// `src` is valid for `bytes` until the copy completes on `stream`; `dst_offset + bytes`
    /// lies in the heap.
    pub unsafe fn put_on_stream(
        &self,
        pe: i32,
        dst_offset: usize,
        src: *const c_void,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let api = shmem()?;
        for (at, len) in chunks(bytes, sys::ACLSHMEM_MAX_TRANSFER) {
            // SAFETY: both ranges valid (contract); a stream that is not null (`Stream`).
            unsafe {
                (api.aclshmemx_putmem_on_stream)(
                    self.at(dst_offset + at),
                    src.cast::<u8>().add(at) as *mut c_void,
                    len,
                    pe,
                    stream.raw(),
                )
            };
        }
        Ok(())
    }

    /// Enqueues on `stream` a copy of `bytes` of `pe`'s heap at `src_offset` into `dst`.
    ///
    /// # Safety
    /// `dst` is valid for `bytes` writes, untouched by others, until the copy completes.
    pub unsafe fn get_on_stream(
        &self,
        pe: i32,
        src_offset: usize,
        dst: *mut c_void,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let api = shmem()?;
        for (at, len) in chunks(bytes, sys::ACLSHMEM_MAX_TRANSFER) {
            // SAFETY: as in `put_on_stream`.
            unsafe {
                (api.aclshmemx_getmem_on_stream)(
                    dst.cast::<u8>().add(at).cast(),
                    self.at(src_offset + at),
                    len,
                    pe,
                    stream.raw(),
                )
            };
        }
        Ok(())
    }

    /// Enqueues on `stream` the update of `pe`'s int32 signal at `offset` (4-byte aligned, in
    /// the heap): `op` is `ACLSHMEM_SIGNAL_SET` or `ACLSHMEM_SIGNAL_ADD`.
    pub fn signal_on_stream(&self, pe: i32, offset: usize, op: i32, value: i32, stream: &Stream) -> Result<()> {
        check_signal_offset(offset, self.bytes)?;
        let api = shmem()?;
        // SAFETY: a symmetric int32 inside the heap (checked); a non-null stream.
        unsafe { (api.aclshmemx_signal_op_on_stream)(self.at(offset).cast(), value, op, pe, stream.raw()) };
        Ok(())
    }

    /// Enqueues on `stream` a wait until this PE's int32 signal at `offset` satisfies `cmp`
    /// (`ACLSHMEM_CMP_*`) against `value`. The kernel spins on the device without a bound of
    /// its own: the caller bounds it with its host-side synchronize.
    pub fn wait_on_stream(&self, offset: usize, cmp: i32, value: i32, stream: &Stream) -> Result<()> {
        check_signal_offset(offset, self.bytes)?;
        if !(sys::ACLSHMEM_CMP_EQ..=sys::ACLSHMEM_CMP_LE).contains(&cmp) {
            return Err(AscendError::Refused {
                function: "aclshmemx_signal_wait_until_on_stream",
                argument: "cmp",
                value: cmp.to_string(),
                reason: "a comparison is one of ACLSHMEM_CMP_EQ (0) to ACLSHMEM_CMP_LE (5)",
            });
        }
        let api = shmem()?;
        // SAFETY: as in `signal_on_stream`.
        unsafe { (api.aclshmemx_signal_wait_until_on_stream)(self.at(offset).cast(), cmp, value, stream.raw()) };
        Ok(())
    }

    /// Enqueues on `stream` a barrier of `team` (every PE of it enqueues one).
    pub fn barrier_on_stream(&self, team: &Team, stream: &Stream) -> Result<()> {
        let api = shmem()?;
        // SAFETY: a live team handle and a non-null stream.
        unsafe { (api.aclshmemx_barrier_on_stream)(team.raw, stream.raw()) };
        Ok(())
    }

    /// Enqueues on `stream` the completion of this PE's earlier data-plane operations. v1.0 to
    /// v1.3 have no such call and need none: their on-stream copies are blocking kernels, each
    /// complete before the stream's next operation.
    pub fn quiet_on_stream(&self, stream: &Stream) -> Result<()> {
        let api = shmem()?;
        if let Some(quiet) = api.aclshmemx_quiet_on_stream {
            // SAFETY: a non-null stream.
            unsafe { quiet(stream.raw()) };
        }
        Ok(())
    }
}

impl Drop for ShmemHeap {
    fn drop(&mut self) {
        if let Ok(api) = shmem() {
            // SAFETY: the heap's one allocation, no longer used (the owner synchronized its
            // streams); both calls are collective, as the type's documentation says.
            unsafe {
                (api.aclshmem_free)(self.base);
                let _ = (api.aclshmem_finalize)();
            }
        }
    }
}

fn check_signal_offset(offset: usize, heap: usize) -> Result<()> {
    if !offset.is_multiple_of(4) || offset.checked_add(4).is_none_or(|end| end > heap) {
        return Err(AscendError::Refused {
            function: "a SHMEM signal",
            argument: "offset",
            value: offset.to_string(),
            reason: "a signal is an int32 at a 4-byte aligned offset inside the heap",
        });
    }
    Ok(())
}

/// A SHMEM team: the world, or a strided split of it (destroyed on drop).
#[derive(Debug)]
pub struct Team {
    raw: aclshmem_team_t,
    owned: bool,
}

impl Team {
    /// Every PE.
    pub const WORLD: Team = Team { raw: sys::ACLSHMEM_TEAM_WORLD, owned: false };

    /// The PEs `start, start + stride, ...` (`size` of them) of the world; `None` on a PE that
    /// is not one of them. Local, with no communication, but every PE must split in the same
    /// order for the team indices to agree (R9).
    pub fn split_strided(start: i32, stride: i32, size: i32) -> Result<Option<Team>> {
        let api = shmem()?;
        let mut raw = sys::ACLSHMEM_TEAM_INVALID;
        // SAFETY: a valid out-pointer.
        let code =
            unsafe { (api.aclshmem_team_split_strided)(sys::ACLSHMEM_TEAM_WORLD, start, stride, size, &mut raw) };
        shmem_check("aclshmem_team_split_strided", code)?;
        Ok((raw != sys::ACLSHMEM_TEAM_INVALID).then_some(Team { raw, owned: true }))
    }

    /// The handle.
    pub fn raw(&self) -> aclshmem_team_t {
        self.raw
    }

    /// The world PE of this team's PE `pe`, `None` if it has none.
    pub fn world_pe(&self, pe: i32) -> Result<Option<i32>> {
        let api = shmem()?;
        // SAFETY: plain values; -1 for a PE outside the team.
        let w = unsafe { (api.aclshmem_team_translate_pe)(self.raw, pe, sys::ACLSHMEM_TEAM_WORLD) };
        Ok((w >= 0).then_some(w))
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        if self.owned {
            if let Ok(api) = shmem() {
                // SAFETY: a team this value split and no longer used.
                unsafe { (api.aclshmem_team_destroy)(self.raw) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_requests_are_whole_pages_within_the_limit() {
        assert_eq!(heap_request(1).unwrap(), 2 << 20);
        assert_eq!(heap_request(2 << 20).unwrap(), 2 << 20);
        assert_eq!(heap_request((2 << 20) + 1).unwrap(), 4 << 20);
        assert_eq!(heap_request(40 << 30).unwrap(), 40 << 30);
        let e = heap_request(0).unwrap_err().to_string();
        assert!(e.contains("local_mem_size = 0"), "{e}");
        let e = heap_request((40 << 30) + 1).unwrap_err().to_string();
        assert!(e.contains("at most 40 GiB"), "{e}");
    }

    #[test]
    fn signal_offsets_are_aligned_words_inside_the_heap() {
        assert!(check_signal_offset(0, 8).is_ok());
        assert!(check_signal_offset(4, 8).is_ok());
        assert!(check_signal_offset(8, 8).is_err());
        assert!(check_signal_offset(2, 8).is_err());
        assert!(check_signal_offset(usize::MAX - 1, 8).is_err());
    }

    #[test]
    fn unique_ids_travel_as_their_bytes() {
        let mut internal = [0u8; 124];
        internal.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let uid = aclshmemx_uniqueid_t { version: sys::ACLSHMEM_UNIQUEID_VERSION, my_pe: 0, n_pes: 8, internal };
        let bytes = uid.to_bytes();
        assert_eq!(aclshmemx_uniqueid_t::from_bytes(&bytes), Some(uid));
        assert_eq!(aclshmemx_uniqueid_t::from_bytes(&bytes[1..]), None);
        assert_eq!(&bytes[0..4], &65672i32.to_ne_bytes());
    }

    #[test]
    fn init_attributes_default_as_the_header_does() {
        let a = aclshmemx_init_attr_t::defaults();
        assert_eq!(a.option_attr.version, 65560);
        assert_eq!(a.option_attr.data_op_engine_type, sys::ACLSHMEM_DATA_OP_MTE);
        assert_eq!(
            (a.option_attr.shm_init_timeout, a.option_attr.shm_create_timeout, a.option_attr.control_operation_timeout),
            (120, 120, 120)
        );
        assert_eq!(a.option_attr.sockFd, -1);
        assert!(a.comm_args.is_null());
        assert_eq!(a.instance_id, 0);
    }
}
