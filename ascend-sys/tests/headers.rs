//! The bindings against the C headers: every declared function type, constant, alias size and
//! struct layout of `ascend_sys::sys` becomes a C++ `static_assert`, compiled against
//! - ACL's own headers from the `torch-npu` wheel (`torch_npu/include/third_party/acl/inc`);
//! - `tests/facts/shmem.h` and `tests/facts/aclnn.h`, transcriptions of SHMEM's and aclnn's
//!   headers (not in a package CI can download), with ACL's types from the wheel.
//!
//! The checks that compile need the headers and a C++ compiler: `scripts/test.sh ascend`
//! downloads the wheel once into `target/tools` and runs them with `--ignored`, naming the
//! include directory in `SYMM_ASCEND_HEADERS`.

use std::path::{Path, PathBuf};
use std::process::Command;

use ascend_sys::sys::{acl, aclnn, shmem, Alias, Constant, Layout, Signature};

/// A Rust type of the bindings as C++ spells it: `*mut *const c_void` is `void const * *`.
fn c_type(rust: &str) -> String {
    let spaced = rust.replace('*', " * ");
    let mut tokens: Vec<&str> = spaced.split_whitespace().collect();
    let base = tokens.pop().expect("a type");
    let mut c = match base {
        "()" => "void",
        "c_void" => "void",
        "c_char" => "char",
        "i32" => "int32_t",
        "u32" => "uint32_t",
        "i64" => "int64_t",
        "u64" => "uint64_t",
        "usize" => "size_t",
        "f32" => "float",
        "f64" => "double",
        "bool" => "bool",
        other => other,
    }
    .to_string();
    // What is left is pointer levels from the outside in: `* mut` or `* const`.
    let levels: Vec<&str> = tokens.chunks(2).map(|p| p[1]).collect();
    for level in levels.iter().rev() {
        c = if *level == "const" { format!("{c} const *") } else { format!("{c} *") };
    }
    c
}

/// The assertions of one module of the bindings.
fn assertions(signatures: &[Signature], constants: &[Constant], aliases: &[Alias], layouts: &[Layout]) -> String {
    let mut out = String::new();
    for s in signatures {
        let params: Vec<String> = s.params.iter().map(|p| c_type(p)).collect();
        let ty = format!("{} (*)({})", c_type(s.ret), params.join(", "));
        out += &format!(
            "static_assert(std::is_same<decltype(&{name}), {ty}>::value, \"{name}: the bindings declare {ty}\");\n",
            name = s.name
        );
    }
    for c in constants {
        out += &format!(
            "static_assert(static_cast<long long>({name}) == {value}LL, \"{name}: the bindings say {value}\");\n",
            name = c.name,
            value = c.value
        );
    }
    for a in aliases {
        out += &format!(
            "static_assert(sizeof({name}) == {size}, \"{name}: the bindings give it {size} bytes\");\n",
            name = a.name,
            size = a.size
        );
    }
    for l in layouts {
        out += &format!(
            "static_assert(sizeof({name}) == {size}, \"{name}: the bindings give it {size} bytes\");\n\
             static_assert(alignof({name}) <= {align}, \"{name}: the bindings align it to {align}\");\n",
            name = l.name,
            size = l.size,
            align = l.align
        );
        for (field, offset) in l.fields {
            out += &format!(
                "static_assert(offsetof({name}, {field}) == {offset}, \"{name}.{field}: the bindings put it at {offset}\");\n",
                name = l.name
            );
        }
    }
    out
}

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
    let dir = std::env::temp_dir().join(format!("ascend-sys-headers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.cpp"));
    std::fs::write(&file, source).unwrap();
    let facts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/facts");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&compiler)
        .args(["-std=c++17", "-fsyntax-only", "-Wno-deprecated-declarations"])
        .arg("-I")
        .arg(acl_headers())
        .arg("-I")
        .arg(&facts)
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("could not run the C++ compiler {compiler:?} (set CXX, or install g++): {e}"));
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

const PRELUDE: &str = "#include <cstddef>\n#include <cstdint>\n#include <type_traits>\n";

#[test]
fn rust_types_are_spelled_as_c_types() {
    assert_eq!(c_type("*mut c_void"), "void *");
    assert_eq!(c_type("*const c_char"), "char const *");
    assert_eq!(c_type("* mut * mut c_void"), "void * *");
    assert_eq!(c_type("*mut *const aclTensor"), "aclTensor const * *");
    assert_eq!(c_type("usize"), "size_t");
    assert_eq!(c_type("aclrtStream"), "aclrtStream");
    assert_eq!(c_type("()"), "void");
}

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
