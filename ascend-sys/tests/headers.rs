//! The bindings against the C headers: every declared function type, constant, alias size and
//! struct layout of `ascend_sys::sys` becomes a C++ `static_assert` (`sys::header_check`),
//! compiled against
//! - ACL's own headers from the `torch-npu` wheel (`torch_npu/include/third_party/acl/inc`);
//! - `tests/facts/shmem.h` and `tests/facts/aclnn.h`, transcriptions of SHMEM's and aclnn's
//!   headers (not in a package CI can download), with ACL's types from the wheel.
//!
//! The checks that compile need the headers and a C++ compiler: `scripts/test.sh ascend`
//! downloads the wheel once into `target/tools` and runs them with `--ignored`, naming the
//! include directory in `SYMM_ASCEND_HEADERS`.

use std::path::{Path, PathBuf};

use ascend_sys::sys::header_check::{self, assertions};
use ascend_sys::sys::{acl, aclnn, shmem, Alias, Constant, Layout, Signature};

/// The include directory of the wheel's ACL headers; the run fails without it.
fn acl_headers() -> PathBuf {
    let dir = std::env::var_os("SYMM_ASCEND_HEADERS").map(PathBuf::from).expect(
        "SYMM_ASCEND_HEADERS names the torch-npu wheel's torch_npu/include/third_party/acl/inc \
         (scripts/test.sh ascend downloads it)",
    );
    assert!(dir.join("acl/acl.h").exists(), "{} has no acl/acl.h", dir.display());
    dir
}

/// Compiles `source` (C++17, syntax only) against the headers: the compiler's messages on failure.
fn compile(name: &str, source: &str) -> Result<(), String> {
    let facts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/facts");
    header_check::compile("ascend-sys", name, source, &[acl_headers(), facts])
}

const PRELUDE: &str = "#include <cstddef>\n#include <cstdint>\n#include <type_traits>\n";

#[test]
#[ignore = "needs the torch-npu headers and a C++ compiler: scripts/test.sh ascend"]
fn acl_bindings_match_the_wheels_headers() {
    let source = format!(
        "{PRELUDE}#include \"acl/acl.h\"\n{}",
        assertions(acl::AclApi::SIGNATURES, acl::CONSTANTS, acl::ALIASES, &[])
    );
    compile("acl", &source).unwrap_or_else(|e| panic!("the ACL bindings disagree with the headers:\n{e}"));
}

#[test]
#[ignore = "needs the torch-npu headers and a C++ compiler: scripts/test.sh ascend"]
fn shmem_bindings_match_the_reference_facts() {
    let source = format!(
        "{PRELUDE}#include \"shmem.h\"\n{}",
        assertions(shmem::ShmemApi::SIGNATURES, shmem::CONSTANTS, shmem::ALIASES, shmem::LAYOUTS)
    );
    compile("shmem", &source).unwrap_or_else(|e| panic!("the SHMEM bindings disagree with the facts:\n{e}"));
}

#[test]
#[ignore = "needs the torch-npu headers and a C++ compiler: scripts/test.sh ascend"]
fn aclnn_bindings_match_the_reference_facts() {
    let mut signatures = aclnn::NnopbaseApi::SIGNATURES.to_vec();
    signatures.extend_from_slice(aclnn::OpApi::SIGNATURES);
    let source = format!("{PRELUDE}#include \"aclnn.h\"\n{}", assertions(&signatures, &[], aclnn::ALIASES, &[]));
    compile("aclnn", &source).unwrap_or_else(|e| panic!("the aclnn bindings disagree with the facts:\n{e}"));
}

/// The check itself fails on a wrong declaration, a wrong value, a wrong size and a wrong
/// offset (so that its passing means something).
#[test]
#[ignore = "needs the torch-npu headers and a C++ compiler: scripts/test.sh ascend"]
fn the_check_catches_each_kind_of_mistake() {
    let wrong_signature = [Signature { name: "aclrtSetDevice", ret: "aclError", params: &["u32"], required: true }];
    let wrong_constant = [Constant { name: "ACL_MEMCPY_DEVICE_TO_DEVICE", value: 2 }];
    let wrong_alias = [Alias { name: "aclrtMemcpyKind", size: 8 }];
    let cases = [
        ("signature", assertions(&wrong_signature, &[], &[], &[]), "acl/acl.h", "aclrtSetDevice"),
        ("constant", assertions(&[], &wrong_constant, &[], &[]), "acl/acl.h", "ACL_MEMCPY_DEVICE_TO_DEVICE"),
        ("alias", assertions(&[], &[], &wrong_alias, &[]), "acl/acl.h", "aclrtMemcpyKind"),
        (
            "layout",
            assertions(
                &[],
                &[],
                &[],
                &[Layout { name: "aclshmemx_init_attr_t", size: 120, align: 8, fields: &[("instance_id", 104)] }],
            ),
            "shmem.h",
            "instance_id",
        ),
    ];
    for (kind, body, header, named) in cases {
        let e = compile(&format!("wrong-{kind}"), &format!("{PRELUDE}#include \"{header}\"\n{body}")).expect_err(kind);
        assert!(e.contains(named), "the {kind} error names {named}: {e}");
    }
    // And the right ones pass.
    let right = [Signature { name: "aclrtSetDevice", ret: "aclError", params: &["i32"], required: true }];
    compile("right", &format!("{PRELUDE}#include \"acl/acl.h\"\n{}", assertions(&right, &[], &[], &[]))).unwrap();
}
