//! The bindings against HCCL's own headers: every declared function type, enumerator, constant,
//! alias size and the root info's layout of `symm_hccl::sys` becomes a C++ `static_assert`
//! (`ascend_sys::sys::header_check`, the generator `ascend-sys` checks ACL with), compiled
//! against `hccl/hccl.h` and `hccl/hccl_types.h` of the `torch-npu` 2.14.0 wheel.
//!
//! The checks that compile need the headers and a C++ compiler: `scripts/test.sh ascend`
//! downloads the wheel once into `target/tools` and runs them with `--include-ignored`, naming
//! `torch_npu/include/third_party/acl/inc` in `SYMM_ASCEND_HEADERS` (`hccl.h` includes
//! `acl/acl.h`) and `torch_npu/include/third_party/hccl/inc` in `SYMM_HCCL_HEADERS` (by
//! default the `hccl/inc` beside `SYMM_ASCEND_HEADERS`'s `acl/inc`).

use std::path::PathBuf;

use ascend_sys::sys::header_check::{self, assertions};
use ascend_sys::sys::{Alias, Constant, Layout, Signature};
use symm_hccl::sys::{self, HcclApi};

/// The include directories: ACL's, HCCL's, and the wheel's `include` root (the wheel's `hccl.h`
/// includes `third_party/hccl/inc/hccl/hccl_types.h` by that path).
fn include_dirs() -> Vec<PathBuf> {
    let acl = std::env::var_os("SYMM_ASCEND_HEADERS").map(PathBuf::from).expect(
        "SYMM_ASCEND_HEADERS names the torch-npu wheel's torch_npu/include/third_party/acl/inc \
         (scripts/test.sh ascend downloads it)",
    );
    assert!(acl.join("acl/acl.h").exists(), "{} has no acl/acl.h", acl.display());
    let hccl = std::env::var_os("SYMM_HCCL_HEADERS").map(PathBuf::from).unwrap_or_else(|| acl.join("../../hccl/inc"));
    // Resolved, so that its ancestors below are the real directories, not `..` steps.
    let hccl = hccl.canonicalize().unwrap_or(hccl);
    assert!(
        hccl.join("hccl/hccl.h").exists() && hccl.join("hccl/hccl_types.h").exists(),
        "{} has no hccl/hccl.h and hccl/hccl_types.h (set SYMM_HCCL_HEADERS to the wheel's third_party/hccl/inc)",
        hccl.display()
    );
    let mut dirs = vec![acl, hccl.clone()];
    // `hccl/inc` -> `hccl` -> `third_party` -> `include`.
    if let Some(root) = hccl.ancestors().nth(3) {
        dirs.push(root.to_path_buf());
    }
    dirs
}

/// Compiles `source` (C++17, syntax only) against the headers: the compiler's messages on failure.
fn compile(name: &str, source: &str) -> Result<(), String> {
    header_check::compile("symm-hccl", name, source, &include_dirs())
}

const PRELUDE: &str = "#include <cstddef>\n#include <cstdint>\n#include <type_traits>\n#include \"hccl/hccl.h\"\n";

#[test]
fn the_root_info_is_the_headers_4108_bytes() {
    assert_eq!(sys::HCCL_ROOT_INFO_BYTES, 4108);
    let layout = sys::LAYOUTS.iter().find(|l| l.name == "HcclRootInfo").unwrap();
    assert_eq!((layout.size, layout.align, layout.fields), (4108, 1, &[("internal", 0)][..]));
    assert!(sys::ALIASES.iter().all(|a| a.size == if a.name == "HcclComm" { 8 } else { 4 }));
}

#[test]
#[ignore = "needs the torch-npu headers and a C++ compiler: scripts/test.sh ascend"]
fn hccl_bindings_match_the_wheels_headers() {
    let source = format!("{PRELUDE}{}", assertions(HcclApi::SIGNATURES, sys::CONSTANTS, sys::ALIASES, sys::LAYOUTS));
    compile("hccl", &source).unwrap_or_else(|e| panic!("the HCCL bindings disagree with the headers:\n{e}"));
}

/// The check fails on a wrong declaration, value, size and layout (so that its passing means
/// something), naming what is wrong; and the right ones pass.
#[test]
#[ignore = "needs the torch-npu headers and a C++ compiler: scripts/test.sh ascend"]
fn the_check_catches_each_kind_of_mistake() {
    // `count` as `uint32_t` where the header has `uint64_t`.
    let wrong_signature = [Signature {
        name: "HcclBroadcast",
        ret: "HcclResult",
        params: &["*mut c_void", "u32", "HcclDataType", "u32", "HcclComm", "aclrtStream"],
        required: true,
    }];
    // bfloat16 is 11; 27 is ACL's number for it.
    let wrong_constant = [Constant { name: "HCCL_DATA_TYPE_BFP16", value: 27 }];
    let wrong_alias = [Alias { name: "HcclDataType", size: 8 }];
    let wrong_layout = [Layout { name: "HcclRootInfo", size: 4096, align: 1, fields: &[("internal", 0)] }];
    let cases = [
        ("signature", assertions(&wrong_signature, &[], &[], &[]), "HcclBroadcast"),
        ("constant", assertions(&[], &wrong_constant, &[], &[]), "HCCL_DATA_TYPE_BFP16"),
        ("alias", assertions(&[], &[], &wrong_alias, &[]), "HcclDataType"),
        ("layout", assertions(&[], &[], &[], &wrong_layout), "HcclRootInfo: the bindings give it 4096 bytes"),
    ];
    for (kind, body, named) in cases {
        let e = compile(&format!("wrong-{kind}"), &format!("{PRELUDE}{body}")).expect_err(kind);
        // A failed assertion, not a header that did not compile at all.
        assert!(e.contains("static assertion failed"), "the {kind} case fails an assertion: {e}");
        assert!(e.contains(named), "the {kind} error names {named}: {e}");
    }
    let right = [Signature {
        name: "HcclBroadcast",
        ret: "HcclResult",
        params: &["*mut c_void", "u64", "HcclDataType", "u32", "HcclComm", "aclrtStream"],
        required: true,
    }];
    compile("right", &format!("{PRELUDE}{}", assertions(&right, &[], &[], &[]))).unwrap();
}
