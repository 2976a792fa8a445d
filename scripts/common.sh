# Shared by the scripts in this folder (sourced, not run): finds cargo, or installs the Rust
# toolchain with the official rustup-init when it can, or says how to; adds the components and
# the nightly toolchain scripts/test.sh needs.

# Makes `cargo` callable, or exits with instructions.
ensure_cargo() {
    if command -v cargo >/dev/null 2>&1; then
        return 0
    fi
    # Installed by rustup but not on PATH in this shell (a fresh login would add it).
    if [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
        return 0
    fi
    echo "cargo (the Rust toolchain) is not installed." >&2
    local installer
    installer="$(mktemp)"
    if command -v curl >/dev/null 2>&1 &&
        curl --proto '=https' --tlsv1.2 -fsS --max-time 30 https://sh.rustup.rs -o "$installer"; then
        echo "Installing it with rustup (https://rustup.rs): stable toolchain, minimal profile, into ~/.cargo ..." >&2
        # -y: no questions; the minimal profile and the linters scripts/test.sh runs.
        sh "$installer" -y --profile minimal --default-toolchain stable -c clippy -c rustfmt
        rm -f "$installer"
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    else
        rm -f "$installer"
        cat >&2 <<'MSG'
Could not download the Rust installer (no curl, or https://sh.rustup.rs is unreachable).
Install the Rust toolchain (1.87 or newer) yourself, for example with:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh
or with your distribution's packages (cargo, rustc), then run this script again.
MSG
        exit 1
    fi
}

# Makes `cargo <tool>` callable for a component of the default toolchain (clippy, rustfmt),
# adding it with rustup, or exits saying how.
ensure_component() {
    local tool="$1" sub="$1"
    [ "$tool" = rustfmt ] && sub=fmt
    if cargo "$sub" --version >/dev/null 2>&1; then
        return 0
    fi
    if command -v rustup >/dev/null 2>&1 && rustup component add "$tool"; then
        return 0
    fi
    echo "cargo $sub is missing: install the Rust component $tool (rustup component add $tool)." >&2
    exit 1
}

# Makes `cargo +nightly miri` callable: the nightly toolchain with miri and rust-src, installed
# with rustup when missing (a download), or exits saying how.
ensure_miri() {
    if ! command -v rustup >/dev/null 2>&1; then
        echo "miri needs rustup (https://rustup.rs) for a nightly toolchain; rustup is not installed." >&2
        exit 1
    fi
    if ! rustup run nightly rustc --version >/dev/null 2>&1; then
        echo "installing the nightly toolchain (minimal, with miri and rust-src) for the miri step" >&2
        rustup toolchain install nightly --profile minimal -c miri,rust-src || {
            echo "could not install the nightly toolchain: rustup toolchain install nightly --profile minimal -c miri,rust-src" >&2
            exit 1
        }
    fi
    # Does nothing when both are installed.
    rustup component add --toolchain nightly miri rust-src || {
        echo "could not add miri and rust-src to the nightly toolchain: rustup component add --toolchain nightly miri rust-src" >&2
        exit 1
    }
    # Builds miri's standard library once (cached in ~/.cache/miri).
    cargo +nightly miri setup >/dev/null
}

# A C++ compiler: the header check compiles against the ACL/HCCL headers, and torch.compile's
# Inductor (the Python tests) compiles its CPU kernels. Installed with apt where we are root.
ensure_cxx() {
    command -v "${CXX:-c++}" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing g++ (a C++ compiler: the header check and torch.compile's Inductor need one)" >&2
        apt-get install -y -q g++ >&2 || { apt-get update -q >&2 && apt-get install -y -q g++ >&2; }
    else
        echo "a C++ compiler is needed (the header check, torch.compile's Inductor): install g++ (or set CXX)" >&2
        exit 1
    fi
}
