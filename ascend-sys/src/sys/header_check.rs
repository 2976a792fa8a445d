//! The header check's generator: every declared function type, constant, alias size and struct
//! layout of a table becomes a C++ `static_assert`, which a test compiles against the library's
//! headers (`tests/headers.rs` here and in `symm-hccl`). A declaration that disagrees with the
//! header then fails to compile, naming itself.
//!
//! It lives beside [`Signature`], [`Constant`], [`Alias`] and [`Layout`] so that every crate
//! declaring a table with [`ffi_library!`](crate::ffi_library) checks it with the same code.

use super::{Alias, Constant, Layout, Signature};

/// A Rust type of the bindings as C++ spells it: `*mut *const c_void` is `void const * *`.
/// Names it does not know (the C typedefs the bindings share, such as `aclrtStream`) are kept.
pub fn c_type(rust: &str) -> String {
    let spaced = rust.replace('*', " * ");
    let mut tokens: Vec<&str> = spaced.split_whitespace().collect();
    let base = tokens.pop().unwrap_or("()");
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
    let levels: Vec<&str> = tokens.chunks(2).map(|p| p.get(1).copied().unwrap_or("mut")).collect();
    for level in levels.iter().rev() {
        c = if *level == "const" { format!("{c} const *") } else { format!("{c} *") };
    }
    c
}

/// The assertions of one module of the bindings, as C++17 source lines; the file that compiles
/// them includes `<cstddef>`, `<cstdint>`, `<type_traits>` and the library's header first.
pub fn assertions(signatures: &[Signature], constants: &[Constant], aliases: &[Alias], layouts: &[Layout]) -> String {
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

/// Compiles `source` (saved as `<name>.cpp` under `tag` in the temporary directory) as C++17,
/// syntax only, with `include_dirs`: `Err` carries the compiler's messages. The compiler is
/// `$CXX`, else `c++`.
pub fn compile(tag: &str, name: &str, source: &str, include_dirs: &[std::path::PathBuf]) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("{tag}-headers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    let file = dir.join(format!("{name}.cpp"));
    std::fs::write(&file, source).map_err(|e| format!("could not write {}: {e}", file.display()))?;
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut command = std::process::Command::new(&compiler);
    command.args(["-std=c++17", "-fsyntax-only", "-Wno-deprecated-declarations"]);
    for dir in include_dirs {
        command.arg("-I").arg(dir);
    }
    let out = command
        .arg(&file)
        .output()
        .map_err(|e| format!("could not run the C++ compiler {compiler:?} (set CXX, or install g++): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn each_kind_of_declaration_becomes_an_assertion_naming_it() {
        let signatures = [Signature { name: "f", ret: "i32", params: &["*mut u64", "usize"], required: true }];
        let constants = [Constant { name: "K", value: -1 }];
        let aliases = [Alias { name: "T", size: 4 }];
        let layouts = [Layout { name: "S", size: 16, align: 8, fields: &[("x", 8)] }];
        let text = assertions(&signatures, &constants, &aliases, &layouts);
        for line in [
            "static_assert(std::is_same<decltype(&f), int32_t (*)(uint64_t *, size_t)>::value, \"f: the bindings declare int32_t (*)(uint64_t *, size_t)\");",
            "static_assert(static_cast<long long>(K) == -1LL, \"K: the bindings say -1\");",
            "static_assert(sizeof(T) == 4, \"T: the bindings give it 4 bytes\");",
            "static_assert(sizeof(S) == 16, \"S: the bindings give it 16 bytes\");",
            "static_assert(alignof(S) <= 8, \"S: the bindings align it to 8\");",
            "static_assert(offsetof(S, x) == 8, \"S.x: the bindings put it at 8\");",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
    }
}
