//! The raw layer: the C declarations symm uses, in their C shapes, as tables of function
//! pointers resolved from the libraries at run time.
//!
//! Conventions (`../shared/reference/ascend-ffi.md`, §1): status codes are `i32`; every C enum
//! is a 4-byte integer alias with its values as constants, never a Rust `enum` (a value a newer
//! library adds must not be undefined behaviour); handles are raw pointers; `size_t` is
//! `usize`. Each table is declared once with `ffi_library!`: the struct of pointers, its
//! loader, and [`Signature`]s spelling every declared type, from which the header check
//! (`tests/headers.rs`) writes C assertions that the libraries' headers must satisfy.
//!
//! The macros are exported (`#[macro_export]`, re-exported here) so that the bindings of other
//! CANN libraries (`symm-hccl`'s HCCL) declare their tables, constants and layouts the same way,
//! load them through [`crate::loader`] and feed the same header check ([`header_check`]).

pub mod acl;
pub mod aclnn;
pub mod header_check;
pub mod shmem;

/// One declared C function, as the bindings spell its types (Rust tokens), for the header check.
#[derive(Clone, Copy, Debug)]
pub struct Signature {
    /// The C symbol.
    pub name: &'static str,
    /// The return type (`()` for `void`).
    pub ret: &'static str,
    /// The parameter types, in order.
    pub params: &'static [&'static str],
    /// Whether loading fails without it (else the table holds `None`).
    pub required: bool,
}

/// The return type of a declaration, as a string (used by [`ffi_library!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! ffi_ret {
    () => {
        "()"
    };
    ($r:ty) => {
        stringify!($r)
    };
}
#[doc(hidden)]
pub use crate::ffi_ret;

/// Declares a table of a library's functions: `required` ones fail the load when missing,
/// `optional` ones (newer versions only) are `None` then.
///
/// Generates the struct of function pointers (named as the C symbols), `LIBRARY` (the file
/// name), `SIGNATURES` (for the header check), `resolve` (from a [`crate::loader::Loaded`]) and
/// `loaded`.
#[macro_export]
macro_rules! ffi_library {
    (
        $(#[$meta:meta])*
        pub struct $api:ident in $lib:literal {
            required {
                $( $(#[$fm:meta])* fn $f:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)?; )*
            }
            optional {
                $( $(#[$om:meta])* fn $of:ident($($oa:ident: $ot:ty),* $(,)?) $(-> $or:ty)?; )*
            }
        }
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $api {
            $( $(#[$fm])* pub $f: unsafe extern "C" fn($($a: $t),*) $(-> $r)?, )*
            $( $(#[$om])* pub $of: Option<unsafe extern "C" fn($($oa: $ot),*) $(-> $or)?>, )*
            library: $crate::loader::Loaded,
        }

        impl $api {
            /// The library's file name.
            pub const LIBRARY: &'static str = $lib;

            /// Every function of the table, as declared here.
            pub const SIGNATURES: &'static [$crate::sys::Signature] = &[
                $( $crate::sys::Signature {
                    name: stringify!($f),
                    ret: $crate::ffi_ret!($($r)?),
                    params: &[$(stringify!($t)),*],
                    required: true,
                }, )*
                $( $crate::sys::Signature {
                    name: stringify!($of),
                    ret: $crate::ffi_ret!($($or)?),
                    params: &[$(stringify!($ot)),*],
                    required: false,
                }, )*
            ];

            /// Resolves every function of the table in `library`; a required one missing is an
            /// error naming it and the file.
            pub fn resolve(library: $crate::loader::Loaded) -> Result<Self, $crate::loader::LoadError> {
                Ok($api {
                    $(
                        // SAFETY: the declared type is the C function's (checked against the
                        // headers by the crate's tests/headers.rs), and the table owns `library`,
                        // so the pointer is used only while the library is open.
                        $f: unsafe { library.required(stringify!($f))? },
                    )*
                    $(
                        // SAFETY: as above.
                        $of: unsafe { library.optional(stringify!($of)) },
                    )*
                    library,
                })
            }

            /// The file it was loaded from.
            pub fn loaded(&self) -> &$crate::loader::Loaded {
                &self.library
            }
        }

        impl std::fmt::Debug for $api {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($api)).field("library", &self.library).finish_non_exhaustive()
            }
        }
    };
}
pub use crate::ffi_library;

/// One C constant (an enumerator or a macro) as the bindings define it, for the header check.
#[derive(Clone, Copy, Debug)]
pub struct Constant {
    /// Its C name.
    pub name: &'static str,
    /// Its value.
    pub value: i64,
}

/// Defines C constants of one alias type, and `$list` listing them (for the header check).
#[macro_export]
macro_rules! ffi_consts {
    ($list:ident: $( $ty:ty { $( $(#[$m:meta])* $name:ident = $value:expr, )* } )*) => {
        $( $(
            $(#[$m])*
            pub const $name: $ty = $value;
        )* )*
        /// Every constant above, with its value.
        pub const $list: &[$crate::sys::Constant] = &[
            $( $( $crate::sys::Constant { name: stringify!($name), value: $name as i64 }, )* )*
        ];
    };
}
pub use crate::ffi_consts;

/// A C type alias of the bindings and the size the Rust side gives it, for the header check.
#[derive(Clone, Copy, Debug)]
pub struct Alias {
    /// The C typedef's name, which the Rust alias shares.
    pub name: &'static str,
    /// `size_of` the Rust alias.
    pub size: usize,
}

/// Lists type aliases as [`Alias`]es named `$list`.
#[macro_export]
macro_rules! ffi_aliases {
    ($list:ident: $($ty:ident),* $(,)?) => {
        /// The type aliases above, with their Rust sizes.
        pub const $list: &[$crate::sys::Alias] =
            &[$( $crate::sys::Alias { name: stringify!($ty), size: std::mem::size_of::<$ty>() } ),*];
    };
}
pub use crate::ffi_aliases;

/// A C struct of the bindings as the Rust side lays it out, for the header check.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// The C typedef's name, which the Rust struct shares.
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    /// Each field's name and offset.
    pub fields: &'static [(&'static str, usize)],
}

/// The [`Layout`] of `#[repr(C)]` struct `$ty` with the fields listed.
#[macro_export]
macro_rules! ffi_layout {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        $crate::sys::Layout {
            name: stringify!($ty),
            size: std::mem::size_of::<$ty>(),
            align: std::mem::align_of::<$ty>(),
            fields: &[$( (stringify!($field), std::mem::offset_of!($ty, $field)) ),*],
        }
    };
}
pub use crate::ffi_layout;
