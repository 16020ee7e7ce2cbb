//! Who should lead each partition, and who stands by for it: computed alike by every node from
//! the cluster group's members (its description, `group.rs`) and each partition's leader as
//! the node knows it (the log and the epochs topic). The group's own assignor decides nothing
//! here: librdkafka takes no assignor of ours, and its sticky one cannot know which node holds
//! a partition warm. The plan's rules:
//!
//! 1. A partition whose leader is a member stays with it (nothing moves that need not), unless
//!    that member leads more than its share (`⌈partitions / members⌉`): it lets its
//!    highest-numbered partitions go.
//! 2. A partition without a leader among the members goes, when its node died or left, to its
//!    standby if that one has room within its share (and leaves room for the others'); else
//!    (and when let go above) to the member that leads fewest (ties: the lowest node id).
//! 3. A member below `⌊partitions / members⌋` (a node that joined) takes the highest-numbered
//!    partition of the member that leads most, until it has its share.
//!
//! Standbys: the *i*-th partition led by *L* is stood by for by the `standbys` members that
//! follow `L` in node-id order (a ring), starting *i* places after it, so one leader's
//! partitions are stood by for by different nodes and, when it dies, they spread over the
//! survivors, each to the node that holds it already; and every node stands by for about as
//! many partitions as it leads. Rule 2 reads the standbys of the last plan in force (the node
//! remembers it), not of the leaders now: those change as the takeovers land.
//!
//! Views differ for a moment (a description or an announcement read late): two nodes may then
//! both want a partition. That costs a takeover, never safety: the log's epoch records decide
//! who leads (`leader.rs`). Each rule depends only on the members, the current leaders and the
//! last plan in force, so the views settle on one plan; after a loss, a plan applied in part
//! plans the same again (a join may move a partition more than needed while its takeovers
//! land, never past the shares).

use std::collections::{BTreeMap, BTreeSet};

/// The nodes of the cluster's group, by node id.
pub(super) type Members = BTreeSet<String>;

/// Which node should lead each partition (`None` only without members). `stood_by` names
/// each partition's standbys as the nodes kept them (the table of the last plan in force).
pub(super) fn plan(
    members: &Members,
    current: &[Option<String>],
    stood_by: &[Vec<String>],
) -> Vec<Option<String>> {
    let partitions = current.len();
    if members.is_empty() {
        return vec![None; partitions];
    }
    let most = partitions.div_ceil(members.len());
    let least = partitions / members.len();
    let extra = partitions - least * members.len();
    let mut lead: Vec<Option<&str>> = current
        .iter()
        .map(|l| l.as_deref().filter(|l| members.contains(*l)))
        .collect();
    let mut count: BTreeMap<&str, usize> = members.iter().map(|m| (m.as_str(), 0)).collect();
    for l in lead.iter().flatten() {
        *count.entry(l).or_default() += 1;
    }
    // Rule 1: above its share, a member lets its highest-numbered partitions go.
    for p in (0..partitions).rev() {
        if let Some(l) = lead[p]
            && count[l] > most
        {
            lead[p] = None;
            count.entry(l).and_modify(|c| *c -= 1);
        }
    }
    // Rule 2: each partition without a leader to its standby with room, else the least led.
    for p in 0..partitions {
        if lead[p].is_some() {
            continue;
        }
        // A partition its member let go goes to the member leading fewest (the one that
        // joined); only a gone node's goes to its standby.
        let gone = current[p].as_deref().filter(|was| !members.contains(*was));
        // Room: below the least share, or up to the most while fewer members lead that many
        // than can (`partitions mod members`), so no other member is left below its share.
        let at_most = count.values().filter(|c| **c >= most).count();
        let room = |s: &str| {
            count
                .get(s)
                .is_some_and(|c| *c < least || (*c + 1 == most && at_most < extra))
        };
        let standby = gone.and_then(|_| {
            stood_by
                .get(p)
                .and_then(|standbys| standbys.iter().map(String::as_str).find(|s| room(s)))
        });
        let to = standby.unwrap_or_else(|| fewest(&count));
        lead[p] = Some(to);
        count.entry(to).and_modify(|c| *c += 1);
    }
    // Rule 3: a member below its share takes from the one that leads most.
    loop {
        let taker = fewest(&count);
        if count[taker] >= least {
            break;
        }
        let giver = count
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(m, _)| *m)
            .unwrap_or(taker);
        if count[giver] <= least {
            break;
        }
        // A node that joined holds nothing yet: any partition is as cold as another.
        let Some(p) = (0..partitions).rev().find(|p| lead[*p] == Some(giver)) else {
            break;
        };
        lead[p] = Some(taker);
        count.entry(giver).and_modify(|c| *c -= 1);
        count.entry(taker).and_modify(|c| *c += 1);
    }
    lead.into_iter().map(|l| l.map(str::to_owned)).collect()
}

/// The member that leads fewest partitions (ties: the lowest node id).
fn fewest<'a>(count: &BTreeMap<&'a str, usize>) -> &'a str {
    count
        .iter()
        .min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))
        .map(|(m, _)| *m)
        .unwrap_or_default()
}

/// Each partition's standbys under `leaders` (a plan over `members`): for the *i*-th partition
/// of a leader (in partition order), the `standbys` members after it in node-id order,
/// starting *i* places on. Each leader's partitions are spread over the others, so with the
/// plan's even shares every node stands by for about as many as it leads.
pub(super) fn standbys(
    leaders: &[Option<String>],
    members: &Members,
    standbys: usize,
) -> Vec<Vec<String>> {
    let ring: Vec<&String> = members.iter().collect();
    let others = ring.len().saturating_sub(1);
    let mut rank: BTreeMap<&str, usize> = BTreeMap::new();
    leaders
        .iter()
        .map(|leader| {
            let Some((leader, at)) = leader
                .as_deref()
                .and_then(|l| Some((l, ring.iter().position(|n| n.as_str() == l)?)))
            else {
                return Vec::new();
            };
            let i = rank.entry(leader).or_default();
            let theirs = (0..standbys.min(others))
                .map(|j| ring[(at + 1 + (*i + j) % others) % ring.len()].clone())
                .collect();
            *i += 1;
            theirs
        })
        .collect()
}

/// The partitions `node` stands by for in `table` (each partition's standbys, [`standbys`]).
pub(super) fn standing_by(table: &[Vec<String>], node: &str) -> BTreeSet<u32> {
    table
        .iter()
        .enumerate()
        .filter(|(_, standbys)| standbys.iter().any(|s| s == node))
        .filter_map(|(p, _)| u32::try_from(p).ok())
        .collect()
}

/// The partitions `node` leads under `leaders`.
pub(super) fn leading(leaders: &[Option<String>], node: &str) -> BTreeSet<u32> {
    leaders
        .iter()
        .enumerate()
        .filter(|(_, l)| l.as_deref() == Some(node))
        .filter_map(|(p, _)| u32::try_from(p).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[&str]) -> Members {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    fn counts(leaders: &[Option<String>]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for l in leaders.iter().flatten() {
            *out.entry(l.clone()).or_default() += 1;
        }
        out
    }

    /// The plan over `now` after the plan `before` was in force over `was` (one standby).
    fn next(was: &Members, before: &[Option<String>], now: &Members) -> Vec<Option<String>> {
        plan(now, before, &standbys(before, was, 1))
    }

    /// The plan reached from nothing, one node joining at a time.
    fn grown(ids: &[&str], partitions: usize) -> Vec<Option<String>> {
        let mut leaders = vec![None; partitions];
        for n in 1..=ids.len() {
            leaders = next(&members(&ids[..n - 1]), &leaders, &members(&ids[..n]));
        }
        leaders
    }

    /// How many partitions each member keeps: those it leads and those it stands by for.
    fn kept(leaders: &[Option<String>], all: &Members) -> Vec<usize> {
        all.iter()
            .map(|m| leading(leaders, m).len() + standing_by(&standbys(leaders, all, 1), m).len())
            .collect()
    }

    const SIX: [&str; 6] = ["n1", "n2", "n3", "n4", "n5", "n6"];

    #[test]
    fn a_fresh_cluster_is_spread_evenly_and_every_partition_led_by_a_member() {
        for partitions in [1, 4, 7, 24, 25] {
            for n in 1..=6 {
                let all = members(&SIX[..n]);
                let leaders = plan(&all, &vec![None; partitions], &[]);
                assert!(
                    leaders
                        .iter()
                        .all(|l| l.as_ref().is_some_and(|l| all.contains(l)))
                );
                let counts = counts(&leaders);
                let (lo, hi) = (partitions / n, partitions.div_ceil(n));
                assert!(counts.values().all(|c| (lo..=hi).contains(c)), "{counts:?}");
                // Grown one node at a time: the same bounds.
                let counts = super::tests::counts(&grown(&SIX[..n], partitions));
                assert!(counts.values().all(|c| (lo..=hi).contains(c)), "{counts:?}");
            }
        }
        assert_eq!(plan(&Members::new(), &[None, None], &[]), vec![None, None]);
    }

    #[test]
    fn a_lost_node_moves_only_its_partitions_each_to_the_node_standing_by_for_it() {
        let before = grown(&SIX, 24);
        let survivors = members(&SIX[1..]);
        // Each node keeps its share: leads 4, stands by for 4.
        assert_eq!(kept(&before, &members(&SIX)), vec![8; 6]);
        let after = next(&members(&SIX), &before, &survivors);
        let table = standbys(&before, &members(&SIX), 1);
        let mut warm = 0;
        for (p, (was, is)) in before.iter().zip(&after).enumerate() {
            if was.as_deref() == Some("n1") {
                let stood_by = standing_by(&table, is.as_deref().unwrap());
                warm += usize::from(stood_by.contains(&(p as u32)));
            } else {
                assert_eq!(was, is, "partition {p} of a survivor moved");
            }
        }
        // n1 led 4 partitions; its standbys are 4 different nodes, each with room for one.
        assert_eq!(warm, 4, "{before:?} → {after:?}");
        let counts = counts(&after);
        assert!(counts.values().all(|c| (4..=5).contains(c)), "{counts:?}");
        // The plan once in force plans itself again: nothing more moves.
        assert_eq!(next(&survivors, &after, &survivors), after);
        assert!(
            kept(&after, &survivors)
                .iter()
                .all(|k| (9..=10).contains(k))
        );
    }

    #[test]
    fn a_joining_node_takes_its_share_and_nothing_else_moves() {
        let survivors = members(&SIX[1..]);
        let before = next(&members(&SIX), &grown(&SIX, 24), &survivors);
        let all = members(&["n2", "n3", "n4", "n5", "n6", "n7"]);
        let after = next(&survivors, &before, &all);
        let taken = after.iter().filter(|l| l.as_deref() == Some("n7")).count();
        assert_eq!(taken, 4);
        for (p, (was, is)) in before.iter().zip(&after).enumerate() {
            if is.as_deref() != Some("n7") {
                assert_eq!(was, is, "partition {p} moved between the others");
            }
        }
        assert_eq!(next(&all, &after, &all), after);
        assert_eq!(kept(&after, &all), vec![8; 6]);
    }

    #[test]
    fn after_a_loss_a_plan_applied_in_part_plans_the_same_again() {
        let before = grown(&SIX, 24);
        let survivors = members(&SIX[1..]);
        let table = standbys(&before, &members(&SIX), 1);
        let target = plan(&survivors, &before, &table);
        // Each move of the plan applied alone, as one takeover landing before the others.
        for (p, is) in target.iter().enumerate() {
            if before[p] != *is {
                let mut partial = before.clone();
                partial[p].clone_from(is);
                assert_eq!(
                    plan(&survivors, &partial, &table),
                    target,
                    "after partition {p} moved"
                );
            }
        }
    }

    #[test]
    fn each_partition_is_stood_by_for_by_others_than_its_leader_spread_over_the_ring() {
        let all = members(&["a", "b", "c"]);
        let leaders: Vec<Option<String>> = ["a", "a", "b", "c"]
            .iter()
            .map(|l| Some((*l).to_owned()))
            .collect();
        // a's partitions 0 and 1: one on b, one on c.
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 1), "b"),
            BTreeSet::from([0])
        );
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 1), "c"),
            BTreeSet::from([1, 2])
        );
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 1), "a"),
            BTreeSet::from([3])
        );
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 0), "b"),
            BTreeSet::new()
        );
        // More standbys than other nodes: every node keeps every partition it does not lead.
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 5), "a"),
            BTreeSet::from([2, 3])
        );
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 2), "c"),
            BTreeSet::from([0, 1, 2])
        );
        assert_eq!(
            standing_by(&standbys(&leaders, &all, 1), "stranger"),
            BTreeSet::new()
        );
        assert_eq!(leading(&leaders, "a"), BTreeSet::from([0, 1]));
        // Alone, a node stands by for nothing.
        assert_eq!(
            standing_by(&standbys(&leaders, &members(&["a"]), 1), "a"),
            BTreeSet::new()
        );
    }

    #[test]
    fn through_any_run_of_joins_and_losses_only_the_lost_or_the_joining_move() {
        let ids: Vec<String> = (1..=9).map(|i| format!("n{i}")).collect();
        let mut seed: u64 = 0x5eed;
        let mut draw = |below: usize| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) as usize % below
        };
        for partitions in [4, 24, 31] {
            let mut up = members(&["n1"]);
            let mut leaders = plan(&up, &vec![None; partitions], &[]);
            for _ in 0..200 {
                let (before, was) = (leaders.clone(), up.clone());
                let id = ids[draw(ids.len())].clone();
                let joining = !up.contains(&id);
                if joining {
                    up.insert(id.clone());
                } else if up.len() > 1 {
                    up.remove(&id);
                } else {
                    continue;
                }
                let table = standbys(&before, &was, 1);
                leaders = plan(&up, &before, &table);
                let counts = counts(&leaders);
                let (lo, hi) = (partitions / up.len(), partitions.div_ceil(up.len()));
                assert!(
                    up.iter()
                        .all(|m| (lo..=hi).contains(&counts.get(m).copied().unwrap_or(0))),
                    "{counts:?} over {up:?}"
                );
                for (p, (was, is)) in before.iter().zip(&leaders).enumerate() {
                    let moved = was != is;
                    let allowed = if joining {
                        is.as_deref() == Some(id.as_str())
                    } else {
                        was.as_deref() == Some(id.as_str())
                    };
                    assert!(
                        !moved || allowed,
                        "partition {p} moved {was:?} → {is:?}; joining {joining} {id}: {:?} → {counts:?}",
                        super::tests::counts(&before)
                    );
                }
                assert_eq!(next(&up, &leaders, &up), leaders, "a plan in force is kept");
                // A loss: one takeover landing before the others plans the same again.
                for (p, is) in leaders.iter().enumerate() {
                    if !joining && before[p] != *is {
                        let mut partial = before.clone();
                        partial[p].clone_from(is);
                        let again = plan(&up, &partial, &table);
                        assert_eq!(again, leaders, "after partition {p} moved");
                    }
                }
            }
        }
    }
}
