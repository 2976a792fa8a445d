//! Sets PyO3's `Py_3_*` cfgs for this crate (the fast path reads a field CPython keeps only up
//! to 3.13), and lets `cargo test` run the unit tests of this crate: without the
//! `extension-module` feature the test binary links libpython, and the loader must find the
//! library of the interpreter PyO3 was configured for (a pyenv or venv Python is not on the
//! default search path).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The interpreter's version as `Py_3_*` cfgs (which fields of CPython's structs exist).
    pyo3_build_config::use_pyo3_cfgs();
    if std::env::var_os("CARGO_FEATURE_EXTENSION_MODULE").is_some() {
        // An extension module links no libpython: the importing interpreter provides it.
        return;
    }
    let config = pyo3_build_config::get();
    if let (Some(dir), true) = (&config.lib_dir, config.shared) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
