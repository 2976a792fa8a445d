//! Operation codes: reductions, signal updates and signal comparisons.
//!
//! The numeric codes are part of the public contract (see `docs/design.md`, "Codes"): bindings
//! and device backends pass them through unchanged, so they never change.

use std::fmt;
use std::str::FromStr;

use crate::error::ArgError;

macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $code:literal, $text:literal;)* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($(#[$vmeta])* $variant = $code,)* }

        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The stable numeric code.
            pub const fn code(self) -> u8 { self as u8 }

            /// The lower-case name accepted by [`FromStr`].
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// The value for a numeric code; an unknown code is an error listing the accepted ones.
            pub fn from_code(code: i64) -> Result<Self, ArgError> {
                match code {
                    $($code => Ok($name::$variant),)*
                    _ => Err(ArgError::UnknownCode { what: $what, value: code.to_string(), accepted: Self::accepted() }),
                }
            }

            fn accepted() -> String {
                [$(concat!(stringify!($code), "=", $text)),*].join(", ")
            }
        }

        impl FromStr for $name {
            type Err = ArgError;
            fn from_str(s: &str) -> Result<Self, ArgError> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($text => Ok($name::$variant),)*
                    other => match other.parse::<i64>() {
                        Ok(code) => Self::from_code(code),
                        Err(_) => Err(ArgError::UnknownCode { what: $what, value: s.to_string(), accepted: Self::accepted() }),
                    },
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
    };
}

code_enum! {
    /// A reduction. `Avg` is a sum followed by a division by the group size, floating dtypes only.
    ReduceOp, "reduce op" {
        Sum = 0, "sum";
        Avg = 1, "avg";
        Max = 2, "max";
        Min = 3, "min";
    }
}

code_enum! {
    /// How a signal word is updated (Ascend SHMEM's and HyperParallel's values).
    SignalOp, "signal op" {
        /// The signal becomes the value.
        Set = 0, "set";
        /// The value is added to the signal (wrapping).
        Add = 1, "add";
    }
}

code_enum! {
    /// How a wait compares the signal with the value: `signal <cmp> value` (Ascend SHMEM's values).
    CmpOp, "compare op" {
        Eq = 0, "eq";
        Ne = 1, "ne";
        Gt = 2, "gt";
        Ge = 3, "ge";
        Lt = 4, "lt";
        Le = 5, "le";
    }
}

impl CmpOp {
    /// Whether `signal <self> value` holds.
    pub fn holds(self, signal: i64, value: i64) -> bool {
        match self {
            CmpOp::Eq => signal == value,
            CmpOp::Ne => signal != value,
            CmpOp::Gt => signal > value,
            CmpOp::Ge => signal >= value,
            CmpOp::Lt => signal < value,
            CmpOp::Le => signal <= value,
        }
    }

    /// The operator as written in a condition (`>=`), for messages.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_codes_are_pinned() {
        assert_eq!((SignalOp::Set.code(), SignalOp::Add.code()), (0, 1));
        let cmp: Vec<u8> = CmpOp::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(cmp, [0, 1, 2, 3, 4, 5]);
        assert_eq!(CmpOp::ALL.iter().map(|c| c.name()).collect::<Vec<_>>(), ["eq", "ne", "gt", "ge", "lt", "le"]);
        assert_eq!(ReduceOp::ALL.iter().map(|c| c.code()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    }

    #[test]
    fn names_and_codes_parse_and_unknowns_are_errors() {
        assert_eq!("add".parse::<SignalOp>().unwrap(), SignalOp::Add);
        assert_eq!("1".parse::<SignalOp>().unwrap(), SignalOp::Add);
        assert_eq!("GE".parse::<CmpOp>().unwrap(), CmpOp::Ge);
        assert_eq!("avg".parse::<ReduceOp>().unwrap(), ReduceOp::Avg);
        let e = SignalOp::from_code(2).unwrap_err().to_string();
        assert!(e.contains("signal op") && e.contains('2') && e.contains("0=set"), "{e}");
        let e = CmpOp::from_code(-1).unwrap_err().to_string();
        assert!(e.contains("compare op") && e.contains("-1") && e.contains("5=le"), "{e}");
        let e = "prod".parse::<ReduceOp>().unwrap_err().to_string();
        assert!(e.contains("prod") && e.contains("3=min"), "{e}");
    }

    #[test]
    fn comparisons_follow_their_names() {
        assert!(CmpOp::Ge.holds(3, 3) && !CmpOp::Gt.holds(3, 3));
        assert!(CmpOp::Le.holds(-5, 0) && CmpOp::Ne.holds(1, 2) && CmpOp::Lt.holds(1, 2));
    }
}
