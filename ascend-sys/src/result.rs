//! The result layer: every status becomes a `Result` whose error names the function, the code
//! (with its name where the headers give one) and the library's own message.

use std::ffi::CStr;

use crate::loader::LoadError;
use crate::sys::acl::{self, aclError, AclApi};
use crate::sys::shmem;

/// An error of a CANN call (or of finding the library that has it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AscendError {
    /// A library or symbol could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An AscendCL call failed.
    #[error("{function} failed with ACL error {code} ({name}){message}", name = acl_error_name(*code), message = suffix(message))]
    Acl { function: &'static str, code: aclError, message: String },
    /// An Ascend SHMEM call failed.
    #[error("{function} failed with SHMEM error {code} ({name})", name = shmem_error_name(*code))]
    Shmem { function: &'static str, code: i32 },
    /// An aclnn operator failed.
    #[error("{function} failed with aclnn status {code}{message}", message = suffix(message))]
    Aclnn { function: &'static str, code: i32, message: String },
    /// A call that returns a pointer returned none.
    #[error("{function} returned NULL: {what}")]
    Null { function: &'static str, what: String },
    /// An argument the library would misread (a null stream means SHMEM's internal stream, a
    /// byte count the kernels would truncate).
    #[error("{function}: argument {argument} = {value} is refused: {reason}")]
    Refused { function: &'static str, argument: &'static str, value: String, reason: &'static str },
    /// A thread of ours that the bindings need (the one that runs host callbacks) did not start.
    #[error("{what}: {detail}")]
    Thread { what: &'static str, detail: String },
}

impl AscendError {
    /// Whether it is a host wait whose time ran out (the stream may still complete).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            AscendError::Acl { code: acl::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT | acl::ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, .. }
                | AscendError::Shmem { code: shmem::ACLSHMEM_TIMEOUT_ERROR | shmem::ACLSHMEM_INNER_TIMEOUT, .. }
        )
    }
}

/// Results of this crate.
pub type Result<T, E = AscendError> = std::result::Result<T, E>;

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// The name of an ACL error code, as the headers spell it (`unknown` for one they do not name).
pub fn acl_error_name(code: aclError) -> &'static str {
    acl::CONSTANTS
        .iter()
        .find(|c| (c.name.starts_with("ACL_ERROR_") || c.name == "ACL_SUCCESS") && c.value == i64::from(code))
        .map_or("unknown", |c| c.name)
}

/// The name of a SHMEM status (`aclshmem_error_code_t`).
pub fn shmem_error_name(code: i32) -> &'static str {
    match code {
        shmem::ACLSHMEM_SUCCESS => "ACLSHMEM_SUCCESS",
        shmem::ACLSHMEM_INVALID_PARAM => "ACLSHMEM_INVALID_PARAM",
        shmem::ACLSHMEM_INVALID_VALUE => "ACLSHMEM_INVALID_VALUE",
        shmem::ACLSHMEM_SMEM_ERROR => "ACLSHMEM_SMEM_ERROR",
        shmem::ACLSHMEM_INNER_ERROR => "ACLSHMEM_INNER_ERROR",
        shmem::ACLSHMEM_NOT_INITED => "ACLSHMEM_NOT_INITED",
        shmem::ACLSHMEM_BOOTSTRAP_ERROR => "ACLSHMEM_BOOTSTRAP_ERROR",
        shmem::ACLSHMEM_TIMEOUT_ERROR => "ACLSHMEM_TIMEOUT_ERROR",
        shmem::ACLSHMEM_MALLOC_FAILED => "ACLSHMEM_MALLOC_FAILED",
        shmem::ACLSHMEM_DL_FUNC_FAILED => "ACLSHMEM_DL_FUNC_FAILED",
        shmem::ACLSHMEM_INNER_TIMEOUT => "ACLSHMEM_INNER_TIMEOUT",
        shmem::ACLSHMEM_UNDER_API_UNLOAD => "ACLSHMEM_UNDER_API_UNLOAD",
        shmem::ACLSHMEM_NOT_SUPPORTED => "ACLSHMEM_NOT_SUPPORTED",
        _ => "unknown",
    }
}

/// `Ok` for a SHMEM status of success, else the error naming `function`.
pub fn shmem_check(function: &'static str, code: i32) -> Result<()> {
    if code == shmem::ACLSHMEM_SUCCESS {
        Ok(())
    } else {
        Err(AscendError::Shmem { function, code })
    }
}

impl AclApi {
    /// The thread's most recent message of ACL (and of the aclnn operators), or "".
    pub fn recent_message(&self) -> String {
        // SAFETY: takes no arguments; returns NULL or a NUL-terminated string owned by the
        // library, valid until the thread's next ACL call (copied out at once).
        let p = unsafe { (self.aclGetRecentErrMsg)() };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string()
    }

    /// `Ok` for `ACL_SUCCESS`, else the error naming `function` with the library's message.
    pub fn check(&self, function: &'static str, code: aclError) -> Result<()> {
        if code == acl::ACL_SUCCESS {
            Ok(())
        } else {
            Err(AscendError::Acl { function, code, message: self.recent_message() })
        }
    }

    /// `Ok` for an aclnn status of 0, else the error naming `function` with ACL's message (the
    /// operators report theirs there).
    pub fn check_aclnn(&self, function: &'static str, code: i32) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(AscendError::Aclnn { function, code, message: self.recent_message() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_function_the_code_and_the_message() {
        let e = AscendError::Acl {
            function: "aclrtMemcpyAsync",
            code: 107000,
            message: "EE1001: the argument is invalid".into(),
        };
        assert_eq!(
            e.to_string(),
            "aclrtMemcpyAsync failed with ACL error 107000 (ACL_ERROR_RT_PARAM_INVALID): EE1001: the argument is invalid"
        );
        let e = AscendError::Acl { function: "aclInit", code: 12345, message: String::new() };
        assert_eq!(e.to_string(), "aclInit failed with ACL error 12345 (unknown)");
        let e = AscendError::Shmem { function: "aclshmemx_init_attr", code: -6 };
        assert_eq!(e.to_string(), "aclshmemx_init_attr failed with SHMEM error -6 (ACLSHMEM_BOOTSTRAP_ERROR)");
        assert_eq!(shmem_check("aclshmem_finalize", 0), Ok(()));
        assert_eq!(shmem_error_name(-100), "ACLSHMEM_NOT_SUPPORTED");
        assert_eq!(shmem_error_name(7), "unknown");
    }

    #[test]
    fn the_timeouts_of_host_waits_are_told_apart() {
        let t =
            AscendError::Acl { function: "aclrtSynchronizeStreamWithTimeout", code: 507046, message: String::new() };
        assert!(t.is_timeout());
        assert!(AscendError::Shmem { function: "aclshmemx_init_attr", code: -7 }.is_timeout());
        assert!(!AscendError::Acl { function: "aclrtMalloc", code: 207001, message: String::new() }.is_timeout());
    }

    #[test]
    fn every_acl_error_constant_has_its_own_value() {
        let errors: Vec<_> = acl::CONSTANTS.iter().filter(|c| c.name.starts_with("ACL_ERROR_")).collect();
        assert!(errors.len() >= 20);
        for c in &errors {
            assert_eq!(acl_error_name(c.value as i32), c.name);
        }
    }
}
