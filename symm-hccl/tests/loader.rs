//! Loading HCCL: a library found nowhere, a library without the functions, and the first call
//! of the safe layer on a machine without CANN.

use std::path::{Path, PathBuf};

use ascend_sys::loader::{open_with, LoadError};
use symm_hccl::safe::{hccl, load_with};
use symm_hccl::sys::HcclApi;
use symm_hccl::{HcclError, RootInfo};

/// A fresh directory of this test, with a `lib64` inside.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("symm-hccl-{name}-{}", std::process::id()));
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

/// Whether this machine has an HCCL the search would find outside the test's environment.
fn hccl_installed() -> bool {
    std::env::var_os("ASCEND_HOME_PATH").is_some()
        || ["/usr/local/Ascend/ascend-toolkit/latest/lib64", "/usr/local/Ascend/cann/lib64"]
            .iter()
            .any(|d| Path::new(d).join("libhccl.so").exists())
}

#[test]
fn a_missing_libhccl_names_itself_and_every_place_searched() {
    if hccl_installed() {
        return; // The default prefixes would find it: nothing is missing here.
    }
    let home = scratch("absent");
    let env = |name: &str| match name {
        "ASCEND_HOME_PATH" => Some(home.display().to_string()),
        "LD_LIBRARY_PATH" => Some("/opt/nothing".to_string()),
        _ => None,
    };
    let e = load_with(&env).unwrap_err();
    let LoadError::NotFound { library, tried, .. } = &e else { panic!("{e:?}") };
    assert_eq!(library, "libhccl.so");
    let places: Vec<&str> = tried.iter().map(|a| a.place.as_str()).collect();
    assert_eq!(places[0], "this process");
    assert!(places[1].starts_with("$ASCEND_HOME_PATH/lib64 ("), "{places:?}");
    assert_eq!(tried[1].reason, "no such file");
    assert_eq!((places[2], tried[2].reason.as_str()), ("$ASCEND_TOOLKIT_HOME/lib64", "not set"));
    let text = e.to_string();
    for part in [
        "libhccl.so could not be loaded",
        &format!("{}/lib64/libhccl.so): no such file", home.display()),
        "/usr/local/Ascend/ascend-toolkit/latest/lib64/libhccl.so",
        "/usr/local/Ascend/cann/lib64/libhccl.so",
        "LD_LIBRARY_PATH=/opt/nothing",
        "install the CANN toolkit with HCCL",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    std::fs::remove_dir_all(home).unwrap();
}

#[test]
fn a_libhccl_without_the_functions_names_the_first_missing_one() {
    // The C library under HCCL's file name loads, and has none of HCCL's functions.
    let home = scratch("foreign");
    std::os::unix::fs::symlink(libc_path(), home.join("lib64/libhccl.so")).unwrap();
    let env = |name: &str| (name == "ASCEND_HOME_PATH").then(|| home.display().to_string());

    let loaded = open_with(HcclApi::LIBRARY, &env).unwrap();
    assert!(loaded.origin().starts_with("$ASCEND_HOME_PATH/lib64"), "{}", loaded.origin());
    let e = HcclApi::resolve(loaded).unwrap_err();
    let LoadError::MissingSymbol { library, symbol, path, .. } = &e else { panic!("{e:?}") };
    assert_eq!((library.as_str(), symbol.as_str()), ("libhccl.so", "HcclGetRootInfo"));
    assert!(Path::new(path).ends_with("lib64/libhccl.so"), "{path}");
    let text = e.to_string();
    assert!(text.contains("has no symbol HcclGetRootInfo"), "{text}");
    assert!(text.contains("install the CANN toolkit with HCCL"), "{text}");
    std::fs::remove_dir_all(home).unwrap();
}

#[test]
fn the_declared_functions_are_required_except_the_newer_ones() {
    let optional: Vec<&str> = HcclApi::SIGNATURES.iter().filter(|s| !s.required).map(|s| s.name).collect();
    assert_eq!(optional, ["HcclGetErrorString", "HcclGetCommAsyncError"]);
    for name in [
        "HcclGetRootInfo",
        "HcclCommInitRootInfo",
        "HcclCommDestroy",
        "HcclAllReduce",
        "HcclAllGather",
        "HcclReduceScatter",
        "HcclBroadcast",
        "HcclSend",
        "HcclRecv",
        "HcclAlltoAllV",
    ] {
        assert!(HcclApi::SIGNATURES.iter().any(|s| s.name == name && s.required), "{name}");
    }
}

#[test]
fn the_safe_layer_fails_clearly_without_hccl_and_remembers_it() {
    let first = hccl().map(|_| ());
    if hccl_installed() {
        first.expect("HCCL is installed here: libhccl.so loads with every required function");
        return;
    }
    let e = first.unwrap_err();
    assert!(matches!(e, HcclError::Load(LoadError::NotFound { .. })), "{e:?}");
    assert!(e.to_string().contains("libhccl.so could not be loaded"), "{e}");
    // The same error again, without a second search.
    assert_eq!(hccl().map(|_| ()).unwrap_err(), e);
    // Every call that needs the library says so.
    let e = RootInfo::get().unwrap_err();
    assert!(e.to_string().contains("libhccl.so could not be loaded"), "{e}");
}
