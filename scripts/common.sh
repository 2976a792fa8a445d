# Shared by the scripts in this folder (sourced, not run): finds cargo, or installs the Rust
# toolchain with the official rustup-init when it can, or says how to.

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
        # -y: no questions; the minimal profile is all the build and tests need.
        sh "$installer" -y --profile minimal --default-toolchain stable
        rm -f "$installer"
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    else
        rm -f "$installer"
        cat >&2 <<'MSG'
Could not download the Rust installer (no curl, or https://sh.rustup.rs is unreachable).
Install the Rust toolchain (1.80 or newer) yourself, for example with:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh
or with your distribution's packages (cargo, rustc), then run this script again.
MSG
        exit 1
    fi
}
