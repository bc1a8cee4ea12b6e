//! String-valued enums whose schema carries its own admission rule, so a wrong value is refused
//! with a message that names the field and the allowed values (and the rule runs in unit tests).

/// Defines a unit-variant enum serialized as the given strings, with `Default`, `Display`,
/// `as_str`, `ALL` and a `JsonSchema` whose `self in [...]` rule lists the allowed values. The
/// enum and each variant take doc comments, as in a plain `enum`.
#[macro_export]
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($field:literal, default = $default:ident) {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(::serde::Serialize, ::serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $(
                $(#[$variant_meta])*
                #[serde(rename = $value)]
                $variant,
            )+
        }

        impl $name {
            /// Every value, in the order the schema lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value as the schema and serialization write it.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($name::$variant => $value,)+
                }
            }
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                let values = [$($value),+];
                let rule = $crate::rules::one_of($field, &values);
                // No `enum` keyword: the API server skips CEL rules once a schema check fails,
                // and our rule's message names the field and the allowed values.
                ::schemars::json_schema!({
                    "type": "string",
                    "maxLength": 32,
                    "x-kubernetes-validations": [rule],
                })
            }
        }
    };
}
