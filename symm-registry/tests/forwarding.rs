//! `Comm` forwards every method of every trait of `symm-core` it implements, provided methods
//! included: a method missing from `src/forward.rs` would silently run the trait's default
//! instead of the backend's override.

use std::collections::BTreeSet;

/// The methods declared in the block that starts at the line `header` of `source`.
fn methods(source: &str, header: &str, indent: usize) -> BTreeSet<String> {
    let start = source.find(header).unwrap_or_else(|| panic!("{header:?} not found"));
    let body = &source[start..];
    let end = body.find("\n}").expect("the block's end");
    body[..end]
        .lines()
        .filter(|l| l.len() - l.trim_start().len() == indent)
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix("unsafe fn ").or_else(|| l.strip_prefix("fn "))?;
            Some(rest.split(['(', '<']).next().unwrap_or_default().to_string())
        })
        .collect()
}

fn read(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    std::fs::read_to_string(format!("{root}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_method_of_every_forwarded_trait_is_forwarded() {
    let forward = read("symm-registry/src/forward.rs");
    for (file, name) in [
        ("symm-core/src/backend.rs", "Backend"),
        ("symm-core/src/backend.rs", "HostMapped"),
        ("symm-core/src/coll/mod.rs", "Collectives"),
        ("symm-core/src/stream.rs", "StreamBackend"),
    ] {
        let declared = methods(&read(file), &format!("pub trait {name}:"), 4);
        assert!(declared.len() >= 3, "{name}: found only {declared:?} in {file}");
        // Forwarded ones sit in `forward!` (8 columns in), written out ones 4 columns in.
        let block = format!("impl {name} for Comm {{");
        let mut forwarded = methods(&forward, &block, 8);
        forwarded.extend(methods(&forward, &block, 4));
        assert_eq!(forwarded, declared, "the methods of {name} that `impl {name} for Comm` forwards");
    }
}
