//! The loader's errors: a library found nowhere, a library without a function symm requires,
//! and the first call of the safe layer on a machine without CANN.

use std::path::{Path, PathBuf};

use ascend_sys::loader::{open_with, LoadError};
use ascend_sys::sys::acl::AclApi;
use ascend_sys::sys::shmem::ShmemApi;

/// A fresh directory of this test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ascend-sys-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("lib64")).unwrap();
    dir
}

/// The C library this process has loaded (from its memory map).
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps.lines().find(|l| l.contains("/libc.so") || l.contains("/libc-")).expect("libc is mapped");
    PathBuf::from(line.split_whitespace().last().unwrap())
}

#[test]
fn a_library_found_nowhere_lists_every_place_searched() {
    let home = scratch("absent");
    let env = |name: &str| match name {
        "ASCEND_HOME_PATH" => Some(home.display().to_string()),
        "LD_LIBRARY_PATH" => Some("/opt/nothing".to_string()),
        _ => None,
    };
    let e = open_with("libsymm-test-absent.so", &env).unwrap_err();
    let LoadError::NotFound { library, tried, .. } = &e else { panic!("{e:?}") };
    assert_eq!(library, "libsymm-test-absent.so");
    let places: Vec<&str> = tried.iter().map(|a| a.place.as_str()).collect();
    assert_eq!(places[0], "this process");
    assert!(places[1].starts_with("$ASCEND_HOME_PATH/lib64 ("), "{places:?}");
    assert_eq!(tried[1].reason, "no such file");
    assert_eq!(places[2], "$ASCEND_TOOLKIT_HOME/lib64");
    assert_eq!(tried[2].reason, "not set");
    assert!(places.last().unwrap().contains("LD_LIBRARY_PATH=/opt/nothing"), "{places:?}");
    let text = e.to_string();
    for part in [
        "libsymm-test-absent.so could not be loaded",
        &format!("{}/lib64/libsymm-test-absent.so): no such file", home.display()),
        "/usr/local/Ascend/ascend-toolkit/latest/lib64",
        "source its set_env.sh",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    std::fs::remove_dir_all(home).unwrap();
}

#[test]
fn a_file_that_does_not_load_says_why() {
    let home = scratch("broken");
    std::fs::write(home.join("lib64/libascendcl.so"), b"not an ELF file").unwrap();
    let env = |name: &str| (name == "ASCEND_HOME_PATH").then(|| home.display().to_string());
    let e = open_with("libascendcl.so", &env).unwrap_err();
    let LoadError::NotFound { tried, .. } = &e else { panic!("{e:?}") };
    let attempt = tried.iter().find(|a| a.place.starts_with("$ASCEND_HOME_PATH")).unwrap();
    assert_ne!(attempt.reason, "no such file");
    assert!(attempt.reason.contains("libascendcl.so"), "the loader's own message: {}", attempt.reason);
    std::fs::remove_dir_all(home).unwrap();
}

#[test]
fn a_library_without_a_required_function_names_it() {
    // A file of the right name that is another library (the C library) loads, and lacks every
    // ACL and SHMEM function.
    let home = scratch("foreign");
    for name in ["libascendcl.so", "libshmem.so"] {
        std::os::unix::fs::symlink(libc_path(), home.join("lib64").join(name)).unwrap();
    }
    let env = |name: &str| (name == "ASCEND_HOME_PATH").then(|| home.display().to_string());

    let loaded = open_with("libascendcl.so", &env).unwrap();
    assert!(loaded.origin().starts_with("$ASCEND_HOME_PATH/lib64"), "{}", loaded.origin());
    let e = AclApi::resolve(loaded).unwrap_err();
    let LoadError::MissingSymbol { library, symbol, path, .. } = &e else { panic!("{e:?}") };
    assert_eq!((library.as_str(), symbol.as_str()), ("libascendcl.so", "aclInit"));
    assert!(Path::new(path).ends_with("lib64/libascendcl.so"), "{path}");
    assert!(e.to_string().contains("has no symbol aclInit"), "{e}");

    let e = ShmemApi::resolve(open_with("libshmem.so", &env).unwrap()).unwrap_err();
    assert!(e.to_string().contains("has no symbol aclshmemx_get_uniqueid"), "{e}");
    assert!(e.to_string().contains("install Ascend SHMEM"), "{e}");
    std::fs::remove_dir_all(home).unwrap();
}

/// Whether this machine has a CANN install the search would find.
fn cann_installed() -> bool {
    std::env::var_os("ASCEND_HOME_PATH").is_some()
        || Path::new("/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so").exists()
        || Path::new("/usr/local/Ascend/cann/lib64/libascendcl.so").exists()
}

#[test]
fn the_safe_layer_fails_clearly_without_cann_and_remembers_it() {
    let first = ascend_sys::safe::acl().map(|_| ());
    if cann_installed() {
        first.expect("CANN is installed here: libascendcl.so loads");
        return;
    }
    let e = first.unwrap_err();
    assert!(e.to_string().contains("libascendcl.so could not be loaded"), "{e}");
    // The same error again, without a second search.
    assert_eq!(ascend_sys::safe::acl().map(|_| ()).unwrap_err(), e);
    // Every call that needs the library says so, never crashes.
    let e = ascend_sys::safe::Stream::create().unwrap_err();
    assert!(e.to_string().contains("libascendcl.so could not be loaded"), "{e}");
    let e = ascend_sys::safe::ShmemHeap::unique_id().unwrap_err();
    assert!(e.to_string().contains("libshmem.so could not be loaded"), "{e}");
}
