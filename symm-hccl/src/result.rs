//! The result layer: every HCCL status becomes a `Result` whose error names the function, the
//! code, its name in `hccl_types.h` and HCCL's own description of it (`HcclGetErrorString`).
//! Loader errors are `ascend_sys`'s ([`LoadError`]), and so are the errors of the ACL calls the
//! ordering primitive makes ([`AscendError`]).

use std::ffi::CStr;

use ascend_sys::{AscendError, LoadError};

use crate::sys::{self, HcclApi, HcclResult};

/// An error of an HCCL call, of an argument refused before the call, or of the ACL calls and
/// library loading around it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HcclError {
    /// A library or symbol could not be loaded (`libhccl.so`, or ACL's for the streams).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An ACL call (an event, a stream wait) failed.
    #[error(transparent)]
    Acl(AscendError),
    /// An HCCL call returned a status other than `HCCL_SUCCESS`.
    #[error("{function} failed with HCCL error {code} ({name}){message}", name = hccl_result_name(*code), message = suffix(message))]
    Hccl { function: &'static str, code: HcclResult, message: String },
    /// An argument HCCL would misread (a rank outside the communicator, arrays of the wrong
    /// length, bytes that are not a root info), refused before the call.
    #[error("{function}: argument {argument} = {value} is refused: {reason}")]
    Refused { function: &'static str, argument: &'static str, value: String, reason: &'static str },
    /// A host wait whose time ran out (the stream's work may still complete).
    #[error("{function}: {what} did not complete within {timeout:?}")]
    Timeout { function: &'static str, what: &'static str, timeout: std::time::Duration },
    /// A valid symm argument HCCL has no equivalent for (`avg`, a dtype it does not reduce).
    #[error("{function}: {argument} = {value} is not supported by HCCL: {reason}")]
    Unsupported { function: &'static str, argument: &'static str, value: String, reason: &'static str },
}

impl From<AscendError> for HcclError {
    fn from(e: AscendError) -> Self {
        match e {
            // One variant for a library that did not load, whichever crate loaded it.
            AscendError::Load(load) => HcclError::Load(load),
            other => HcclError::Acl(other),
        }
    }
}

impl HcclError {
    /// Whether a time ran out: HCCL's own (`HCCL_E_TIMEOUT`: a peer that never came,
    /// `HCCL_CONNECT_TIMEOUT` or `HCCL_EXEC_TIMEOUT` passed), or a host wait of this crate's.
    pub fn is_timeout(&self) -> bool {
        matches!(self, HcclError::Hccl { code: sys::HCCL_E_TIMEOUT, .. } | HcclError::Timeout { .. })
    }
}

/// Results of this crate.
pub type Result<T, E = HcclError> = std::result::Result<T, E>;

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// The name `hccl_types.h` gives a status (`unknown` for one it does not name, such as a code a
/// newer HCCL added).
pub fn hccl_result_name(code: HcclResult) -> &'static str {
    sys::CONSTANTS
        .iter()
        .find(|c| (c.name.starts_with("HCCL_E_") || c.name == "HCCL_SUCCESS") && c.value == i64::from(code))
        .map_or("unknown", |c| c.name)
}

/// `Ok` for `HCCL_SUCCESS`, else the error naming `function` and `code`, with `describe(code)`
/// as HCCL's message (called only on failure).
pub fn check_with(function: &'static str, code: HcclResult, describe: impl FnOnce(HcclResult) -> String) -> Result<()> {
    if code == sys::HCCL_SUCCESS {
        Ok(())
    } else {
        Err(HcclError::Hccl { function, code, message: describe(code) })
    }
}

impl HcclApi {
    /// HCCL's description of `code`, or "" where this HCCL has no `HcclGetErrorString` or no
    /// description.
    pub fn error_string(&self, code: HcclResult) -> String {
        let Some(describe) = self.HcclGetErrorString else { return String::new() };
        // SAFETY: a plain value argument; the library returns NULL or a NUL-terminated string
        // it owns (copied out at once).
        let p = unsafe { describe(code) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string()
    }

    /// `Ok` for `HCCL_SUCCESS`, else the error naming `function`, the code and HCCL's message.
    pub fn check(&self, function: &'static str, code: HcclResult) -> Result<()> {
        check_with(function, code, |c| self.error_string(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_becomes_an_error_naming_function_code_name_and_message() {
        let e = check_with("HcclAllReduce", 5, |_| "not support feature".into()).unwrap_err();
        assert_eq!(e.to_string(), "HcclAllReduce failed with HCCL error 5 (HCCL_E_NOT_SUPPORT): not support feature");
        let e = check_with("HcclCommInitRootInfo", 9, |_| String::new()).unwrap_err();
        assert_eq!(e.to_string(), "HcclCommInitRootInfo failed with HCCL error 9 (HCCL_E_TIMEOUT)");
        assert!(e.is_timeout());
        // A code this header does not name (HCOMM's HCCL_E_IN_STATUS, 1041) is still reported.
        let e = check_with("HcclBroadcast", 1041, |_| String::new()).unwrap_err();
        assert_eq!(e.to_string(), "HcclBroadcast failed with HCCL error 1041 (unknown)");
        assert!(!e.is_timeout());
    }

    #[test]
    fn success_asks_for_no_message() {
        assert_eq!(check_with("HcclSend", sys::HCCL_SUCCESS, |_| unreachable!("success has no message")), Ok(()));
    }

    #[test]
    fn every_status_of_the_header_has_its_own_name() {
        let statuses: Vec<_> = sys::CONSTANTS.iter().filter(|c| c.name.starts_with("HCCL_E_")).collect();
        assert_eq!(statuses.len(), 24, "HCCL_E_PARA (1) to HCCL_E_OOM (24)");
        for c in statuses {
            assert_eq!(hccl_result_name(c.value as HcclResult), c.name);
        }
        assert_eq!(hccl_result_name(0), "HCCL_SUCCESS");
        assert_eq!(hccl_result_name(-1), "unknown");
    }

    #[test]
    fn ascend_errors_keep_their_kind() {
        let load = LoadError::NotFound { library: "libascendcl.so".into(), tried: vec![], hint: "install CANN" };
        assert_eq!(HcclError::from(AscendError::Load(load.clone())), HcclError::Load(load));
        let acl = AscendError::Acl { function: "aclrtRecordEvent", code: 107000, message: String::new() };
        let e = HcclError::from(acl.clone());
        assert_eq!(e, HcclError::Acl(acl));
        assert!(e.to_string().starts_with("aclrtRecordEvent failed with ACL error 107000"), "{e}");
    }
}
