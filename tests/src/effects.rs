//! The side effects `Meter/work` logs in the test deployment, and what a kill -9 test
//! expects of them.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

/// Side effects of `Meter/work` per invocation id, from a deployment started with
/// [`TestDeployment::start_logging`]: `(runs, dones)`.
pub fn effects_per_invocation(effects: &Path) -> std::collections::BTreeMap<String, (u32, u32)> {
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut counts = std::collections::BTreeMap::<String, (u32, u32)>::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("run", id)) => counts.entry(id.to_owned()).or_default().0 += 1,
            Some(("done", id)) => counts.entry(id.to_owned()).or_default().1 += 1,
            _ => panic!("unexpected effects line {line:?}"),
        }
    }
    counts
}

/// Side effects per invocation as a kill -9 test expects them after the restart: every one of
/// `ids` ran each side effect once, or twice when it had run before the kill (its result was not
/// journaled yet: one re-run of what was under way). What the design promises is checked: a
/// `ctx.run` whose result was journaled never runs again. `Meter/work` runs its `done` effect
/// only after the `run` effect's result came back journaled, so an invocation whose `done` ran
/// before the kill must not run `run` again. Answers how many ran again.
pub fn assert_once_but_in_flight<'a>(
    ids: impl IntoIterator<Item = &'a String>,
    before: &std::collections::BTreeMap<String, (u32, u32)>,
    after: &std::collections::BTreeMap<String, (u32, u32)>,
) -> u32 {
    let mut reruns = 0;
    for id in ids {
        let (runs, dones) = after.get(id).copied().unwrap_or_default();
        let (runs_before, dones_before) = before.get(id).copied().unwrap_or_default();
        assert!(
            dones_before == 0 || runs == runs_before,
            "{id}: its journaled `run` ran again ({runs_before} before the kill, {runs} in all) though `done` had run after it"
        );
        for (what, total, before_kill) in
            [("run", runs, runs_before), ("done", dones, dones_before)]
        {
            assert!(total >= 1, "{id}: its {what} side effect never ran");
            assert!(
                total <= 1 + before_kill.min(1),
                "{id}: its {what} side effect ran {total} times ({before_kill} before the kill)"
            );
            reruns += total - 1;
        }
    }
    reruns
}

/// Waits until `Meter/work` completed its side effects for at least `count` invocations (at
/// most 60 s; `what` names the wait): how a kill -9 test lands mid-stream.
pub async fn until_done(effects: &Path, count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while effects_per_invocation(effects)
        .values()
        .filter(|(_, done)| *done > 0)
        .count()
        < count
    {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every one of `ids` completed its `Meter/work` side effects, at most `within`;
/// on time-out, how many had.
pub async fn all_done(effects: &Path, ids: &[String], within: Duration) -> Result<(), usize> {
    let deadline = Instant::now() + within;
    loop {
        let seen = effects_per_invocation(effects);
        let finished = ids
            .iter()
            .filter(|id| seen.get(*id).is_some_and(|(_, done)| *done > 0))
            .count();
        if finished == ids.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(finished);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`effects_per_invocation`] once the log has stopped growing for `quiet` (at most 30 s): after
/// a kill, handlers of the dead connections may still be running their side effects.
pub async fn effects_once_quiet(
    effects: &Path,
    quiet: Duration,
) -> std::collections::BTreeMap<String, (u32, u32)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut len = std::fs::metadata(effects).map_or(0, |m| m.len());
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        assert!(
            Instant::now() < deadline,
            "the side effects at {} never went quiet for {quiet:?} within 30 s",
            effects.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = std::fs::metadata(effects).map_or(0, |m| m.len());
        if now != len {
            len = now;
            since = Instant::now();
        }
    }
    effects_per_invocation(effects)
}
