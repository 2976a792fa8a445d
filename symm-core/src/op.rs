//! Operation codes: reductions, signal updates and signal comparisons.
//!
//! The numeric codes are part of the public contract (the README's "Op codes"): bindings pass them
//! through unchanged, so they never change. A backend whose library numbers an operation
//! differently translates the enum inside the backend (see [`CmpOp::ascend_shmem_code`]).

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
    /// How a wait compares the signal with the value: `signal <cmp> value`.
    ///
    /// The codes are HyperParallel's (`compare_op` 0 = eq, 1 = gt, 2 = lt, as in its docstrings,
    /// manual, tests and `signal_wait_until` kernel), with `ne`, `ge` and `le` after them. A
    /// backend whose library numbers comparisons differently translates inside the backend
    /// ([`CmpOp::ascend_shmem_code`] for Ascend SHMEM).
    CmpOp, "compare op" {
        Eq = 0, "eq";
        Gt = 1, "gt";
        Lt = 2, "lt";
        Ne = 3, "ne";
        Ge = 4, "ge";
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

    /// Ascend SHMEM's value for this comparison (`aclshmem_cmp_op_type_t`: `CMP_EQ 0, CMP_NE 1,
    /// CMP_GT 2, CMP_GE 3, CMP_LT 4, CMP_LE 5`), what an Ascend backend passes as `cmp` to
    /// `aclshmem_signal_wait_until` and `aclshmemx_signal_wait_until_on_stream`. It differs from
    /// [`CmpOp::code`]: Ascend SHMEM's `1` is `Ne` and its `2` is `Gt`.
    pub const fn ascend_shmem_code(self) -> i32 {
        match self {
            CmpOp::Eq => 0,
            CmpOp::Ne => 1,
            CmpOp::Gt => 2,
            CmpOp::Ge => 3,
            CmpOp::Lt => 4,
            CmpOp::Le => 5,
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
        // HyperParallel's 0 = eq, 1 = gt, 2 = lt, then ne, ge, le.
        assert_eq!(CmpOp::ALL.iter().map(|c| c.name()).collect::<Vec<_>>(), ["eq", "gt", "lt", "ne", "ge", "le"]);
        assert_eq!(ReduceOp::ALL.iter().map(|c| c.code()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    }

    #[test]
    fn hyperparallel_compare_codes_mean_what_its_callers_wait_for() {
        // HyperParallel's wait_for_signal: the signal is 0 until a peer has written its data
        // and set the signal to 2; `compare_op = 1` ("greater than 1") must not hold before
        // that (read as Ascend SHMEM's `ne`, 0 != 1 held at once, before the data arrived).
        let greater = CmpOp::from_code(1).unwrap();
        assert_eq!(greater, CmpOp::Gt);
        assert!(!greater.holds(0, 1), "a wait for signal > 1 returned while the signal was still 0");
        assert!(greater.holds(2, 1));
        // `compare_op = 2` ("less than 5"): the signal drops from 5 to 3 (read as `gt`, the
        // wait never ended).
        let less = CmpOp::from_code(2).unwrap();
        assert_eq!(less, CmpOp::Lt);
        assert!(!less.holds(5, 5) && less.holds(3, 5));
        assert_eq!(CmpOp::from_code(0).unwrap(), CmpOp::Eq);
        assert_eq!([3, 4, 5].map(|c| CmpOp::from_code(c).unwrap()), [CmpOp::Ne, CmpOp::Ge, CmpOp::Le]);
        for (text, op) in [("eq", CmpOp::Eq), ("gt", CmpOp::Gt), ("lt", CmpOp::Lt), ("ne", CmpOp::Ne)] {
            assert_eq!(text.parse::<CmpOp>().unwrap(), op);
        }
        assert_eq!(
            ["ge", "LE", "1", " 2 "].map(|t| t.parse::<CmpOp>().unwrap()),
            [CmpOp::Ge, CmpOp::Le, CmpOp::Gt, CmpOp::Lt]
        );
        let e = CmpOp::from_code(6).unwrap_err().to_string();
        assert!(e.contains("0=eq, 1=gt, 2=lt, 3=ne, 4=ge, 5=le"), "{e}");
    }

    #[test]
    fn ascend_shmem_numbering_is_a_translation() {
        // aclshmem_cmp_op_type_t: CMP_EQ 0, CMP_NE 1, CMP_GT 2, CMP_GE 3, CMP_LT 4, CMP_LE 5.
        let ascend = [(CmpOp::Eq, 0), (CmpOp::Ne, 1), (CmpOp::Gt, 2), (CmpOp::Ge, 3), (CmpOp::Lt, 4), (CmpOp::Le, 5)];
        for (op, code) in ascend {
            assert_eq!(op.ascend_shmem_code(), code, "{op}");
        }
        // One Ascend value per comparison, and the ones HyperParallel's codes differ on.
        let mut seen: Vec<i32> = CmpOp::ALL.iter().map(|c| c.ascend_shmem_code()).collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
        assert_ne!(i32::from(CmpOp::Gt.code()), CmpOp::Gt.ascend_shmem_code());
        assert_ne!(i32::from(CmpOp::Lt.code()), CmpOp::Lt.ascend_shmem_code());
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
