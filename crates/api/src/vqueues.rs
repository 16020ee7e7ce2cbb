//! Scheduler queues (virtual queues): one per scope, limit key, service, object key (exclusive
//! handlers) and priority, per partition.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One queue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VQueueResponse {
    /// `vq_1…` (the reference's form; the older `vq_{partition}_{queue}` is read too): what
    /// `/vqueues/{vqueue_id}/pause` takes.
    pub id: String,
    /// Its scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Its limit key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_key: Option<String>,
    /// Its service.
    pub service: String,
    /// The object key, for exclusive handlers of virtual objects and workflows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_key: Option<String>,
    /// Its entries' priority, 0-9.
    pub priority: u8,
    /// `empty`, `scheduled`, `ready`, `blocked` or `paused`.
    pub status: String,
    /// Why it waits (`queue-paused`, `limit-key-concurrency`, `rate-limit`, `lock`,
    /// `invoker-concurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_on: Option<String>,
    /// Entries waiting to run.
    pub queued: u64,
    /// Entries waiting for their time.
    pub scheduled: u64,
}

/// `GET /vqueues`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListVQueuesResponse {
    /// The live queues asked for (the busiest, of the scope asked for), by id.
    pub vqueues: Vec<VQueueResponse>,
    /// How many queues matched the scope asked for, before the limit.
    #[serde(default)]
    pub total: usize,
}
