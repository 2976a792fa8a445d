//! The operating-system calls the backend needs, each wrapped once: anonymous shared memory
//! (memfd), mappings, futexes, passing file descriptors over a Unix socket, and CPU affinity.
//!
//! Shared memory is a memfd: it has no name in `/dev/shm` or anywhere else, so nothing can be
//! left behind when ranks die; the kernel frees it when the last mapping goes away.

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::MemfdFlags;
use rustix::mm::{Advice, MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use rustix::thread::{futex, CpuSet, MembarrierCommand, MembarrierQuery};

/// Creates an anonymous shared-memory file of `len` bytes (zero-filled, no name anywhere).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    Ok(fd)
}

/// A shared read-write mapping of a whole shared-memory file; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it goes through atomics
// or through copies whose exclusivity the protocol guarantees, never through Rust references
// to non-atomic data.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-write.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED): it overlaps
        // no memory of this process; `fd` is a shared-memory file of at least `len` bytes.
        let p = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)?
        };
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // Large collectives sweep whole heaps: ask for transparent huge pages to spare the TLB.
        // Honoured only where the host allows them for shared memory (shmem_enabled advise or
        // always); elsewhere a no-op, so the result is ignored.
        // SAFETY: advice on a range this function just mapped; it never changes its contents.
        let _ = unsafe { rustix::mm::madvise(p, len, Advice::LinuxHugepage) };
        Ok(Mapping { base, len })
    }

    /// First byte.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, for mappings made by `map`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping made by `map` and not unmapped before; nothing
        // refers to it once its owner drops it.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Spurious returns are allowed: callers
/// re-check their condition. Works across processes (the futex is not private). True when the
/// sleep ended because `timeout` passed (not by a wake-up, a changed word or a signal).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // EINTR and EAGAIN mean "re-check" to the caller, as a wake-up does.
    futex::wait(word, futex::Flags::empty(), expected, Some(&ts)) == Err(rustix::io::Errno::TIMEDOUT)
}

/// Wakes every thread sleeping on `word`, in any process.
pub fn futex_wake_all(word: &AtomicU32) {
    // Fails only for a bad address, which a reference cannot be.
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

/// Registers this process for `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` (its threads then
/// take part in every such barrier, from any process) and checks that the barrier itself works.
/// False where the kernel (or a seccomp policy) does not offer it.
pub fn membarrier_register() -> bool {
    rustix::thread::membarrier_query()
        .contains(MembarrierQuery::GLOBAL_EXPEDITED | MembarrierQuery::REGISTER_GLOBAL_EXPEDITED)
        && rustix::thread::membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
        && membarrier_global()
}

/// Whether the kernel offers `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, which needs no
/// registration of the caller.
pub fn membarrier_offered() -> bool {
    rustix::thread::membarrier_query().contains(MembarrierQuery::GLOBAL_EXPEDITED)
}

/// A full memory barrier on every CPU that runs a thread of a registered process (and this
/// one), before this returns: about 0.5 us here. False if it failed.
pub fn membarrier_global() -> bool {
    rustix::thread::membarrier(MembarrierCommand::GlobalExpedited).is_ok()
}

/// Sends one file descriptor over a connected Unix stream (SCM_RIGHTS).
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor in the control message"));
    }
    rustix::net::sendmsg(sock, &[IoSlice::new(&[0u8])], &mut control, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receives one file descriptor sent by [`send_fd`].
pub fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut byte)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    control
        .drain()
        .find_map(|m| match m {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "peer sent no file descriptor"))
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Pins the calling thread (and threads it starts later) to `cpu`, one of [`allowed_cpus`].
pub fn pin_to(cpu: usize) -> io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {cpu} is out of range")));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// The number of CPUs online on this host. Not the process's affinity mask: ranks pinned to one
/// core each still have a core each, which is what the spin policy asks.
pub fn host_cores() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1)
}

/// Who is at the other end of a connected Unix socket, as the kernel recorded it when the
/// connection (or, for a client, the server's `listen`) was made: it cannot be forged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id, in this process's pid namespace (0 when the peer is outside it).
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// The credentials of the peer of `sock` (`SO_PEERCRED`). Through libc: rustix's `UCred` holds
/// a non-zero pid, and a peer in another pid namespace has pid 0.
pub fn peer_cred(sock: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes passed; SO_PEERCRED fills a
    // `ucred` on a connected Unix socket.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred { pid: u32::try_from(cred.pid).unwrap_or(0), uid: cred.uid, gid: cred.gid })
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}
