//! What every Sluice crate shares and nothing else: invocation and deployment ids in the Restate
//! text format, the catalogue of coded errors, the clock, value types people write (durations,
//! sizes), and the seeded generator of the simulators. It depends on no other Sluice crate.

pub mod clock;
pub mod errors;
pub mod hash;
pub mod ids;
pub mod metrics;
pub mod retry;
pub mod simulation;
pub mod trace;
pub mod units;

/// Implements serde for a type through its `FromStr` and `Display`: it travels as its text, and
/// a bad text fails deserializing with the type's own message.
#[macro_export]
macro_rules! serde_via_str {
    ($ty:ty) => {
        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <String as ::serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}
