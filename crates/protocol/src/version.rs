//! Service protocol versions Sluice speaks (5 to 7) and how one is chosen for a deployment.

use std::fmt;

/// A service protocol version this build can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolVersion {
    /// Immutable journal: commands and notifications.
    V5,
    /// Adds `StartMessage.random_seed` and `Failure.metadata`.
    V6,
    /// Adds futures, `AwaitingOn`, scope and limit key on calls.
    V7,
}

impl ProtocolVersion {
    /// Oldest version accepted at registration.
    pub const MIN: i32 = 5;
    /// Newest version this build speaks.
    pub const MAX: i32 = 7;

    /// The version with this number, if spoken here.
    pub fn from_number(n: i32) -> Option<Self> {
        match n {
            5 => Some(Self::V5),
            6 => Some(Self::V6),
            7 => Some(Self::V7),
            _ => None,
        }
    }

    /// The version number.
    pub fn number(self) -> i32 {
        match self {
            Self::V5 => 5,
            Self::V6 => 6,
            Self::V7 => 7,
        }
    }

    /// `application/vnd.restate.invocation.vN`: request and response content type of an attempt.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::V5 => "application/vnd.restate.invocation.v5",
            Self::V6 => "application/vnd.restate.invocation.v6",
            Self::V7 => "application/vnd.restate.invocation.v7",
        }
    }

    /// The version of an exact invocation content type.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let n = content_type.strip_prefix("application/vnd.restate.invocation.v")?;
        Self::from_number(n.parse().ok()?)
    }

    /// Whether a deployment range `min..=max` overlaps what Sluice accepts at registration.
    pub fn acceptable_for_discovery(min: i32, max: i32) -> bool {
        min <= max && min <= Self::MAX && max >= Self::MIN
    }

    /// The version to run an invocation with on a deployment supporting `min..=max`: the highest
    /// both sides speak.
    pub fn pick(min: i32, max: i32) -> Option<Self> {
        if min > Self::MAX || max < Self::MIN || min > max {
            return None;
        }
        Self::from_number(max.min(Self::MAX))
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "V{}", self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picking_a_version() {
        assert_eq!(ProtocolVersion::pick(5, 7), Some(ProtocolVersion::V7));
        assert_eq!(ProtocolVersion::pick(5, 6), Some(ProtocolVersion::V6));
        assert_eq!(ProtocolVersion::pick(5, 9), Some(ProtocolVersion::V7));
        assert_eq!(ProtocolVersion::pick(5, 5), Some(ProtocolVersion::V5));
        assert_eq!(ProtocolVersion::pick(8, 9), None);
        assert_eq!(ProtocolVersion::pick(1, 3), None);
        assert!(ProtocolVersion::acceptable_for_discovery(5, 7));
        assert!(ProtocolVersion::acceptable_for_discovery(1, 5));
        assert!(!ProtocolVersion::acceptable_for_discovery(1, 3));
        assert!(!ProtocolVersion::acceptable_for_discovery(8, 9));
    }

    #[test]
    fn content_types() {
        for v in [
            ProtocolVersion::V5,
            ProtocolVersion::V6,
            ProtocolVersion::V7,
        ] {
            assert_eq!(
                ProtocolVersion::from_content_type(v.content_type()),
                Some(v)
            );
        }
        assert_eq!(
            ProtocolVersion::from_content_type("application/vnd.restate.invocation.v4"),
            None
        );
        assert_eq!(ProtocolVersion::from_content_type("application/json"), None);
    }
}
