//! The root info: the address of the root rank that every rank's `HcclCommInitRootInfo` meets.
//! One rank makes it ([`RootInfo::get`]); its bytes reach the others through the caller's
//! start-up exchange (symm's `Store`, torch's store), which rebuild it with
//! [`RootInfo::from_bytes`].

use std::ffi::c_char;

use super::hccl;
use crate::result::{HcclError, Result};
use crate::sys::{HcclRootInfo, HCCL_ROOT_INFO_BYTES};

/// HCCL's root info (`HcclRootInfo`, 4108 opaque bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct RootInfo {
    // Boxed: 4 KiB moved through results and stores is better moved as a pointer.
    bytes: Box<[u8; RootInfo::BYTES]>,
}

impl std::fmt::Debug for RootInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RootInfo {{ {} bytes }}", RootInfo::BYTES)
    }
}

impl RootInfo {
    /// Its size, `HCCL_ROOT_INFO_BYTES`.
    pub const BYTES: usize = HCCL_ROOT_INFO_BYTES as usize;

    /// A new root info, made on the rank that is the root (it listens for the others:
    /// `HCCL_IF_IP` or `HCCL_SOCKET_IFNAME` choose the interface). The calling thread's device
    /// must be set.
    pub fn get() -> Result<RootInfo> {
        let api = hccl()?;
        let mut raw = HcclRootInfo::zeroed();
        // SAFETY: a valid out-pointer of the header's layout (4108 bytes).
        api.check("HcclGetRootInfo", unsafe { (api.HcclGetRootInfo)(&mut raw) })?;
        Ok(RootInfo::from_raw(&raw))
    }

    /// The root info whose bytes another rank sent ([`RootInfo::as_bytes`]); anything but
    /// [`RootInfo::BYTES`] bytes is refused (a truncated or foreign record would otherwise
    /// send `HcclCommInitRootInfo` to a wrong address, or hang it until its timeout).
    pub fn from_bytes(bytes: &[u8]) -> Result<RootInfo> {
        let bytes: [u8; RootInfo::BYTES] = bytes.try_into().map_err(|_| HcclError::Refused {
            function: "RootInfo::from_bytes",
            argument: "bytes",
            value: format!("{} bytes", bytes.len()),
            reason: "a root info is HCCL_ROOT_INFO_BYTES = 4108 bytes, as HcclGetRootInfo made it",
        })?;
        Ok(RootInfo { bytes: Box::new(bytes) })
    }

    /// Its bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..]
    }

    /// From the C struct.
    pub fn from_raw(raw: &HcclRootInfo) -> RootInfo {
        // `c_char` is signed on x86_64 and unsigned on aarch64: the bytes are the same.
        RootInfo { bytes: Box::new(raw.internal.map(|c| c as u8)) }
    }

    /// As the C struct `HcclCommInitRootInfo` reads.
    pub fn to_raw(&self) -> HcclRootInfo {
        HcclRootInfo { internal: self.bytes.map(|b| b as c_char) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root info with every byte different from its neighbours (no real one is needed).
    fn sample() -> Vec<u8> {
        (0..RootInfo::BYTES).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn bytes_round_trip_through_the_c_struct() {
        let info = RootInfo::from_bytes(&sample()).unwrap();
        assert_eq!(info.as_bytes(), &sample()[..]);
        let raw = info.to_raw();
        assert_eq!(std::mem::size_of_val(&raw), 4108);
        // Bytes above 127 survive the signed `c_char` of x86_64.
        assert_eq!(raw.internal[1] as u8, 10);
        assert_eq!(raw.internal[18] as u8, 129);
        assert_eq!(RootInfo::from_raw(&raw), info);
        assert_eq!(format!("{info:?}"), "RootInfo { 4108 bytes }");
    }

    #[test]
    fn a_record_of_another_length_is_refused_naming_its_length() {
        for len in [0, 136, 4107, 4109] {
            let e = RootInfo::from_bytes(&vec![0; len]).unwrap_err();
            assert!(matches!(e, HcclError::Refused { argument: "bytes", .. }), "{e:?}");
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("RootInfo::from_bytes: argument bytes = {len} bytes is refused")),
                "{text}"
            );
            assert!(text.contains("4108"), "{text}");
        }
    }
}
