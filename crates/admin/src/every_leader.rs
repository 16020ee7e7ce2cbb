//! Cluster mode: what an operator asks of every partition (a quota reset, a bulk cancel) is
//! done by the node asked on the partitions it leads and by every other leader on theirs, asked
//! as the caller; again for partitions whose leadership moved meanwhile, for a bounded while.

/// How long a cluster-wide quota reset keeps trying to reach every partition's leader: past a
/// takeover, which settles within the group's session timeout (10 s by default).
pub(crate) const RESET_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);
/// The longest pause between its tries.
pub(crate) const RESET_PAUSE_CAP: std::time::Duration = std::time::Duration::from_secs(2);

/// The partitions below `count` that `reset` does not name.
pub(crate) fn missing_partitions<V>(
    reset: &std::collections::BTreeMap<u32, V>,
    count: usize,
) -> Vec<u32> {
    (0..u32::try_from(count).unwrap_or(u32::MAX))
        .filter(|p| !reset.contains_key(p))
        .collect()
}

/// Asks every other leading node (`leaders`: their admin URLs, and how many partitions nobody
/// leads) to do `request` at `path` on the partitions it leads (a quota reset, a bulk cancel), as
/// the caller (`authorization`, which every node accepts); their answers. A partition without
/// a leader, or a node that did not answer, makes it incomplete (why, to try again).
pub(crate) async fn ask_other_leaders<A: serde::de::DeserializeOwned>(
    placement: &sluice_runtime::partition::placement::Placement,
    client: &reqwest::Client,
    leaders: &(Vec<String>, usize),
    path: &str,
    request: &impl serde::Serialize,
    authorization: Option<&http::HeaderValue>,
) -> Result<Vec<A>, String> {
    let (admins, nobody) = leaders;
    if *nobody > 0 {
        return Err(format!(
            "{nobody} partition(s) have no leader right now (a takeover)"
        ));
    }
    let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    let headers = sluice_runtime::replication::relay::json_as_caller(authorization);
    let mut answers = Vec::with_capacity(admins.len());
    for admin in admins {
        let answer = sluice_runtime::replication::relay::relay(
            placement,
            client,
            admin,
            http::Method::POST,
            path,
            &headers,
            body.clone().into(),
        )
        .await?;
        if !answer.status.is_success() {
            return Err(format!(
                "{admin} answered {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
        }
        answers.push(
            serde_json::from_slice(&answer.body)
                .map_err(|e| format!("{admin} answered what is not the route's answer: {e}"))?,
        );
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_is_complete_only_when_every_partition_was_reset_by_some_node() {
        let here: std::collections::BTreeMap<u32, u64> = [(0, 1), (2, 0)].into();
        assert_eq!(missing_partitions(&here, 4), [1, 3]);
        let mut all = here.clone();
        all.extend([(1, 0), (3, 2)]);
        assert!(missing_partitions(&all, 4).is_empty());
        // A partition reset twice (it moved between the two asks) is still one partition.
        all.extend([(3, 2)]);
        assert_eq!(all.values().sum::<u64>(), 3);
    }
}
