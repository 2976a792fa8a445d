//! Finding and opening the CANN libraries at run time, and resolving their symbols.
//!
//! Nothing links against CANN: each library is opened with `dlopen` when first needed, like
//! torch_npu's function loader and `pyhccl` do. A library is looked for, in order:
//! 1. already loaded in the process (`RTLD_NOLOAD`): torch_npu, or the SHMEM Python package,
//!    may have loaded it, and a second copy of `libshmem.so` in one process is refused (R11);
//! 2. `$ASCEND_HOME_PATH/lib64`, then `$ASCEND_TOOLKIT_HOME/lib64` (set by CANN's `set_env.sh`);
//! 3. the default install prefixes `/usr/local/Ascend/ascend-toolkit/latest/lib64` and
//!    `/usr/local/Ascend/cann/lib64` (the prefix moved in CANN 8.5, R2);
//! 4. the dynamic loader's own search by file name (`LD_LIBRARY_PATH`, `ld.so.cache`).
//!
//! A library found nowhere is a [`LoadError::NotFound`] listing every place tried and why it
//! failed there (a file that exists but does not load says so: a wrong architecture, a missing
//! dependency); a missing symbol is a [`LoadError::MissingSymbol`] naming it and the file.

use std::path::PathBuf;

/// Why a library or one of its symbols could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No place had a loadable copy of the library.
    #[error(
        "{library} could not be loaded (tried: {tried}); {hint}",
        tried = tried.iter().map(|a| format!("{}: {}", a.place, a.reason)).collect::<Vec<_>>().join("; ")
    )]
    NotFound { library: String, tried: Vec<Attempt>, hint: &'static str },
    /// The library loaded but lacks a function the bindings require (too old a version, or a
    /// file of another name put in its place).
    #[error("{path} has no symbol {symbol}: {library} of this version lacks a function symm requires; {hint}")]
    MissingSymbol { library: String, path: String, symbol: String, hint: &'static str },
}

/// One place a library was looked for, and why it did not load from there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The place, in words (`$ASCEND_HOME_PATH/lib64/libascendcl.so`, ...).
    pub place: String,
    /// Why it failed there (the loader's message, or why the place was not tried).
    pub reason: String,
}

/// An opened library and where it came from. Dropping it closes the handle: the function tables
/// own theirs, so their pointers stay valid for their lifetime.
pub struct Loaded {
    library: libloading::Library,
    file: String,
    origin: String,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("file", &self.file).field("origin", &self.origin).finish()
    }
}

impl Loaded {
    /// The file (or file name) it was opened as.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Where it was found, in words.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The function `symbol`, as type `T`.
    ///
    /// # Safety
    /// `T` is the C function's type, and the value is used only while `self` is alive (the
    /// tables `ffi_library!` declares own their `Loaded`).
    pub unsafe fn required<T: Copy>(&self, symbol: &str) -> Result<T, LoadError> {
        // SAFETY: forwarded (this function's contract is `optional`'s).
        unsafe { self.optional(symbol) }.ok_or_else(|| LoadError::MissingSymbol {
            library: library_name(&self.file).to_string(),
            path: self.file.clone(),
            symbol: symbol.to_string(),
            hint: hint(library_name(&self.file)),
        })
    }

    /// The function `symbol` as type `T`, or `None` where this version lacks it.
    ///
    /// # Safety
    /// As for [`Loaded::required`].
    pub unsafe fn optional<T: Copy>(&self, symbol: &str) -> Option<T> {
        // SAFETY: `T` is the symbol's type (contract); the value is copied out of the `Symbol`
        // and stays valid while `self.library` is open, which the caller guarantees (contract).
        unsafe { self.library.get::<T>(symbol.as_bytes()).ok().map(|s| *s) }
    }
}

/// The environment the search reads (a parameter, so that tests need not change the process's).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Opens `file` (a library file name such as `libascendcl.so`) from the first place of the
/// module's search order that has it.
pub fn open(file: &str) -> Result<Loaded, LoadError> {
    open_with(file, &process_env)
}

/// [`open`] with the environment `env`.
pub fn open_with(file: &str, env: Env<'_>) -> Result<Loaded, LoadError> {
    let mut tried = Vec::new();
    // SAFETY: opening a CANN library runs its initialisers, which is what loading it means;
    // `RTLD_NOLOAD` opens nothing new.
    match unsafe { dlopen(file, libc::RTLD_LAZY | libc::RTLD_NOLOAD) } {
        Ok(library) => return Ok(Loaded { library, file: file.to_string(), origin: "already loaded".into() }),
        Err(_) => tried.push(Attempt { place: "this process".into(), reason: "not loaded yet".into() }),
    }
    for (place, dir) in directories(env) {
        let Some(dir) = dir else {
            tried.push(Attempt { place, reason: "not set".into() });
            continue;
        };
        let path = dir.join(file);
        let place = format!("{place} ({})", path.display());
        if !path.exists() {
            tried.push(Attempt { place, reason: "no such file".into() });
            continue;
        }
        let name = path.to_string_lossy().into_owned();
        // SAFETY: as above.
        match unsafe { dlopen(&name, libc::RTLD_LAZY) } {
            Ok(library) => return Ok(Loaded { library, file: name, origin: place }),
            Err(reason) => tried.push(Attempt { place, reason }),
        }
    }
    let place = format!(
        "the dynamic loader's search (LD_LIBRARY_PATH={})",
        env("LD_LIBRARY_PATH").unwrap_or_else(|| "unset".into())
    );
    // SAFETY: as above.
    match unsafe { dlopen(file, libc::RTLD_LAZY) } {
        Ok(library) => Ok(Loaded { library, file: file.to_string(), origin: place }),
        Err(reason) => {
            tried.push(Attempt { place, reason });
            Err(LoadError::NotFound { library: file.to_string(), tried, hint: hint(file) })
        }
    }
}

/// The directories of the search, in order, each with its name in messages (`None`: its
/// variable is unset).
fn directories(env: Env<'_>) -> Vec<(String, Option<PathBuf>)> {
    let mut dirs = Vec::new();
    for var in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
        dirs.push((format!("${var}/lib64"), env(var).map(|v| PathBuf::from(v).join("lib64"))));
    }
    for prefix in ["/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"] {
        let dir = PathBuf::from(prefix).join("lib64");
        dirs.push((dir.display().to_string(), Some(dir)));
    }
    dirs
}

/// The file name of a library path.
fn library_name(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// What to do about a library that is missing, by library.
fn hint(file: &str) -> &'static str {
    match file {
        "libshmem.so" => {
            "install Ascend SHMEM (hicann/shmem, v1.0 or later) and add the directory holding libshmem.so \
             (with aclshmem_bootstrap_config_store.so beside it) to LD_LIBRARY_PATH"
        }
        "libhccl.so" => {
            "install the CANN toolkit with HCCL (from CANN 8.5 libhccl.so ships in the per-SoC ops package, \
             Ascend-cann-<soc>-ops) and source its set_env.sh, which sets ASCEND_HOME_PATH and LD_LIBRARY_PATH"
        }
        "libopapi.so" | "libnnopbase.so" => {
            "install the CANN toolkit with its operator package (the aclnn operators) and source its set_env.sh, \
             which sets ASCEND_HOME_PATH and LD_LIBRARY_PATH"
        }
        _ => "install the CANN toolkit and source its set_env.sh, which sets ASCEND_HOME_PATH and LD_LIBRARY_PATH",
    }
}

/// `dlopen(name, flags)`, the loader's message on failure.
///
/// # Safety
/// Loading a library runs its initialisers.
unsafe fn dlopen(name: &str, flags: i32) -> Result<libloading::Library, String> {
    // SAFETY: forwarded (this function's contract).
    unsafe { libloading::os::unix::Library::open(Some(name), flags) }.map(Into::into).map_err(|e| e.to_string())
}
