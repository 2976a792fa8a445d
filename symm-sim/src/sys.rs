//! The operating-system calls the backend needs, each wrapped once: anonymous shared memory
//! (memfd), mappings, futexes and passing file descriptors over a Unix socket.
//!
//! Shared memory is a memfd: it has no name in `/dev/shm` or anywhere else, so nothing can be
//! left behind when ranks die; the kernel frees it when the last mapping goes away.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Creates an anonymous shared-memory file of `len` bytes (zero-filled, no name anywhere).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `cname` is a valid NUL-terminated string; the flags are valid.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: ftruncate on a valid fd we own.
    if unsafe { libc::ftruncate(owned.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
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
        // SAFETY: a fresh mapping chosen by the kernel; `fd` is a valid shared-memory fd of at
        // least `len` bytes (created by `memfd` with that length).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // Large collectives sweep whole heaps: ask for transparent huge pages to spare the TLB.
        // Honoured only where the host allows them for shared memory (shmem_enabled advise or
        // always); elsewhere a no-op, so the result is ignored.
        // SAFETY: advice on a range this function just mapped; it never changes its contents.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
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
        // SAFETY: base/len describe a mapping made by `map` and not unmapped before.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Spurious returns are allowed: callers
/// re-check their condition. Works across processes (the futex is not private). True when the
/// sleep ended because `timeout` passed (not by a wake-up, a changed word or a signal).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a valid, aligned 32-bit atomic for the duration of the call; the kernel
    // only reads it. EINTR, EAGAIN and ETIMEDOUT all mean "re-check" to the caller.
    let r = unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec)
    };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// Wakes every thread sleeping on `word`, in any process.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid aligned 32-bit atomic; FUTEX_WAKE only uses its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Registers this process for `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` (its threads then
/// take part in every such barrier, from any process) and checks that the barrier itself works.
/// False where the kernel (or a seccomp policy) does not offer it.
pub fn membarrier_register() -> bool {
    // SAFETY: membarrier takes no pointers; registering has no effect beyond ordering.
    membarrier_offered(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)
        && unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) } == 0
        && membarrier_global()
}

/// Whether the kernel offers `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` (and `also`), which
/// needs no registration of the caller.
pub fn membarrier_offered(also: libc::c_long) -> bool {
    // SAFETY: membarrier takes no pointers; QUERY returns a bit mask of supported commands.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
    let needed = MEMBARRIER_CMD_GLOBAL_EXPEDITED | also;
    supported >= 0 && supported & needed == needed
}

/// `membarrier` commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;

/// A full memory barrier on every CPU that runs a thread of a registered process (and this
/// one), before this returns: about 0.5 us here. False if it failed.
pub fn membarrier_global() -> bool {
    // SAFETY: membarrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0 }
}

/// Sends one file descriptor over a connected Unix stream (SCM_RIGHTS).
pub fn send_fd(sock: &UnixStream, fd: RawFd) -> io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is a valid "empty" header; fields are filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points to `space` bytes, enough for one cmsg carrying one fd;
    // CMSG_FIRSTHDR therefore returns a valid header pointer inside `cbuf`.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` is fully initialised and its buffers outlive the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one file descriptor sent by [`send_fd`].
pub fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is valid; filled below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points to live buffers of the declared sizes.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: recvmsg filled `msg`; CMSG_FIRSTHDR returns null or a header inside `cbuf`.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: checked non-null before reading the header fields.
    if cmsg.is_null() || unsafe { (*cmsg).cmsg_type } != libc::SCM_RIGHTS {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "peer sent no file descriptor"));
    }
    // SAFETY: an SCM_RIGHTS message carries at least one fd in its data area.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()) };
    // SAFETY: the kernel installed `fd` in our table for us; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether process `pid` is running: it exists and is not a zombie (a rank that died but was
/// not reaped yet by its launcher is dead for its peers). Only meaningful on the same host.
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    let exists = r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // The state is the field after the parenthesised command name in /proc/<pid>/stat.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false);
    exists && !zombie
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

/// The credentials of the peer of `sock` (`SO_PEERCRED`).
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
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
