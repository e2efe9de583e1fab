//! Flags that set configuration keys, each defined once with the key it sets.
//!
//! [`config_flags!`] makes, from one list, the clap group (a field per flag), the code that
//! sets each given flag's key, and the table of flag -> key that `proxy run --help`'s
//! readers and the tests use. A flag's key is a Rust place in the config struct, so it
//! compiles only if the field exists; the tests check the same path against the file's
//! schema (serde's key names), so the flag, the key a file uses and the code that acts on it
//! cannot drift apart. Written by hand rather than with a crate: clap derives the flags, and
//! none of the config crates of the field maps a flag onto a nested serde key.

/// A flag's value when it was given: an `Option` when it is `Some`, a repeatable flag when
/// it was given at least once (the file's list is then replaced, not extended).
pub(crate) trait Given {
    type Value;
    fn given(&self) -> Option<Self::Value>;
}

impl<T: Clone> Given for Option<T> {
    type Value = T;
    fn given(&self) -> Option<T> {
        self.clone()
    }
}

impl<T: Clone> Given for Vec<T> {
    type Value = Vec<T>;
    fn given(&self) -> Option<Vec<T>> {
        (!self.is_empty()).then(|| self.clone())
    }
}

/// One flag of a group: its clap field name and the key it sets, as path segments.
pub(crate) struct FlagKey {
    pub field: &'static str,
    pub key: &'static [&'static str],
}

impl FlagKey {
    /// The key as a file spells it, e.g. `limits.max_request_body_bytes`.
    pub fn dotted(&self) -> String {
        self.key.join(".")
    }
}

/// Defines a group of flags: each line is the flag's clap field (its doc comment is the
/// help), `=>`, the place in the target struct it sets, and optionally `via` a function
/// from the flag's value to the field's type (`Some` for an optional key).
macro_rules! config_flags {
    (
        $(#[$struct_attr:meta])*
        $vis:vis struct $name:ident sets $target:ty {
            $(
                $(#[$field_attr:meta])*
                $field:ident: $field_ty:ty => $($segment:ident).+ $(via $convert:expr)?,
            )+
        }
    ) => {
        $(#[$struct_attr])*
        $vis struct $name {
            $(
                $(#[$field_attr])*
                pub(super) $field: $field_ty,
            )+
        }

        impl $name {
            /// Every flag of the group with the key it sets.
            pub(crate) const KEYS: &'static [$crate::cli::config_flags::FlagKey] = &[
                $(
                    $crate::cli::config_flags::FlagKey {
                        field: stringify!($field),
                        key: &[$(stringify!($segment)),+],
                    },
                )+
            ];

            /// Sets the key of every flag given; the rest of `target` stays as it is.
            pub(crate) fn set(&self, target: &mut $target) {
                $(
                    if let Some(value) = $crate::cli::config_flags::Given::given(&self.$field) {
                        target.$($segment).+ = config_flags!(@convert value $(, $convert)?);
                    }
                )+
            }
        }
    };
    (@convert $value:ident) => {
        $value
    };
    (@convert $value:ident, $convert:expr) => {
        ($convert)($value)
    };
}

pub(crate) use config_flags;

#[cfg(test)]
pub(crate) mod schema {
    //! The file's schema, asked through serde: every config struct denies unknown fields,
    //! so a key is part of the schema exactly when a file setting it is not refused as
    //! unknown.

    /// Whether `key` is a key of the TOML document `prefix` opens (empty for the top
    /// level, or a `[[listener]]` header with the listener's required keys).
    pub fn knows<T: serde::de::DeserializeOwned>(prefix: &str, key: &[&str]) -> bool {
        // Whatever the value: a known key is refused for its type (or not at all), an
        // unknown one by name.
        let probe = format!("{prefix}\n{} = {{ no_key_is_this = 0 }}\n", key.join("."));
        let last = key.last().expect("a key has a segment");
        match toml::from_str::<T>(&probe) {
            Ok(_) => true,
            Err(e) => !e.message().contains(&format!("unknown field `{last}`")),
        }
    }

    #[test]
    fn the_probe_tells_known_keys_from_unknown_ones() {
        assert!(knows::<crate::config::Config>(
            "",
            &["limits", "idle_timeout"]
        ));
        assert!(knows::<crate::config::Config>("", &["provider"]));
        assert!(!knows::<crate::config::Config>("", &["limits", "idle"]));
        assert!(!knows::<crate::config::Config>("", &["idle_timeout"]));
    }
}
