//! SQL over the system tables.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A query.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QueryRequest {
    /// The SQL, e.g. `SELECT * FROM sys_user_limits`.
    pub query: String,
    /// Cluster mode: read only what this node holds (the partitions its store keeps, as
    /// leader or standby, and the live state of those it leads) instead of every partition
    /// from its leader. Ignored on an embedded node, which holds everything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local: bool,
}
