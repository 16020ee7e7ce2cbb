//! What an invocation spent, as its handler reports it: the results of its `ctx.run` steps
//! named [`COST_RUN`], summed. Every SDK can name a run and journal its result, and a run's
//! result is journaled once and replayed, never run again: read from the journal when the
//! invocation completes and stored with its completion, a charge is neither lost by a crash nor
//! counted twice. (A response header cannot carry it: an SDK sends its response's head before
//! the handler runs, the body being the stream of protocol messages.)

use bytes::Bytes;
use prost::Message as _;

use sluice_protocol::proto::{self, notification_template};
use sluice_protocol::{Frame, MessageType};

/// The name of a `ctx.run` step whose result is what the invocation spent.
pub const COST_RUN: &str = "sluice:cost";

/// Most digits a reported cost may have: a `u64` written out.
const MOST_DIGITS: usize = 20;

/// Most cost reports counted for one invocation: past them its journal's further reports
/// add nothing (and are counted as passed over), so summing stays cheap whatever a handler
/// writes.
pub const MAX_REPORTS: usize = 10_000;

/// How many refused reports are named by their completion id (the rest are only counted).
const NAMED: usize = 5;

/// What an invocation's cost reports came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spent {
    /// The sum (saturating) of the values of its completed [`COST_RUN`] steps; `None` when it
    /// reported nothing.
    pub total: Option<u64>,
    /// Reports that failed or were not amounts, adding nothing.
    pub refused: usize,
    /// The completion ids of the first few of them, for the log.
    pub first_refused: Vec<u32>,
    /// Reports past [`MAX_REPORTS`], not counted.
    pub passed_over: usize,
}

/// What the invocation whose journal is `journal` spent, in one pass over it: the values of
/// its first [`MAX_REPORTS`] completed [`COST_RUN`] steps, summed. A step that failed, or
/// whose value is not a non-negative JSON integer that fits a `u64`, adds nothing and is
/// counted in `refused`, so the caller can say so.
pub fn spent(journal: &[Frame]) -> Spent {
    let run = MessageType::Run.id();
    let completion = MessageType::RunCompletion.id();
    // A step's run command comes before its completion in the journal.
    let mut steps: std::collections::HashSet<u32> = std::collections::HashSet::new();
    let mut out = Spent::default();
    let mut counted = 0usize;
    for frame in journal {
        if frame.ty == run {
            if let Ok(command) = proto::RunCommandMessage::decode(Bytes::clone(&frame.payload))
                && command.name == COST_RUN
            {
                if steps.len() + counted < MAX_REPORTS {
                    steps.insert(command.result_completion_id);
                } else {
                    out.passed_over += 1;
                }
            }
            continue;
        }
        if frame.ty != completion || steps.is_empty() {
            continue;
        }
        let Ok(done) = proto::NotificationTemplate::decode(Bytes::clone(&frame.payload)) else {
            continue;
        };
        let Some(notification_template::Id::CompletionId(id)) = done.id else {
            continue;
        };
        // One completion per step: a second one (never written by the partition) is ignored.
        if !steps.remove(&id) {
            continue;
        }
        counted += 1;
        match done.result.as_ref().and_then(amount) {
            Some(amount) => out.total = Some(out.total.unwrap_or(0).saturating_add(amount)),
            None => {
                out.refused += 1;
                if out.first_refused.len() < NAMED {
                    out.first_refused.push(id);
                }
            }
        }
    }
    out
}

/// A step's value as an amount: a JSON integer, `0` to `u64::MAX`, with surrounding
/// whitespace allowed (what every SDK's JSON serde writes for a number).
fn amount(result: &notification_template::Result) -> Option<u64> {
    let notification_template::Result::Value(value) = result else {
        return None;
    };
    let text = std::str::from_utf8(&value.content).ok()?.trim();
    if text.is_empty() || text.len() > MOST_DIGITS || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Tests: a handler's report of `value` as its journal holds it, a [`COST_RUN`] step and its
/// completion, `completion` being the step's id.
#[cfg(test)]
pub(in crate::partition) fn report(completion: u32, value: &str) -> [Frame; 2] {
    [
        tests::run(completion, COST_RUN),
        tests::done(completion, value),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::Message;

    pub(super) fn run(completion: u32, name: &str) -> Frame {
        Message::Run(proto::RunCommandMessage {
            result_completion_id: completion,
            name: name.to_owned(),
        })
        .to_frame(false)
    }

    pub(super) fn done(completion: u32, value: &str) -> Frame {
        Message::RunCompletion(proto::NotificationTemplate {
            id: Some(notification_template::Id::CompletionId(completion)),
            result: Some(notification_template::Result::Value(proto::Value {
                content: Bytes::copy_from_slice(value.as_bytes()),
            })),
        })
        .to_frame(false)
    }

    fn failed(completion: u32) -> Frame {
        Message::RunCompletion(proto::NotificationTemplate {
            id: Some(notification_template::Id::CompletionId(completion)),
            result: Some(notification_template::Result::Failure(proto::Failure {
                code: 500,
                message: "boom".into(),
                ..Default::default()
            })),
        })
        .to_frame(false)
    }

    fn input() -> Frame {
        Message::Input(proto::InputCommandMessage::default()).to_frame(false)
    }

    #[test]
    fn the_values_of_the_named_runs_are_summed_and_other_runs_ignored() {
        let journal = [
            input(),
            run(1, COST_RUN),
            run(2, "fetch"),
            done(2, "999"),
            done(1, "1532"),
            run(3, COST_RUN),
            done(3, " 8\n"),
        ];
        let spent = spent(&journal);
        assert_eq!(spent.total, Some(1540));
        assert_eq!(spent.refused, 0);
    }

    #[test]
    fn an_invocation_that_reports_nothing_spent_nothing_known() {
        assert_eq!(spent(&[input(), run(1, "fetch"), done(1, "5")]).total, None);
        // A cost step not completed (the invocation was killed during it) charges nothing.
        assert_eq!(spent(&[input(), run(1, COST_RUN)]), Spent::default());
    }

    #[test]
    fn a_malformed_or_failed_report_adds_nothing_and_is_named() {
        let journal = [
            input(),
            run(1, COST_RUN),
            done(1, "-3"),
            run(2, COST_RUN),
            done(2, "1.5"),
            run(3, COST_RUN),
            done(3, "\"12\""),
            run(4, COST_RUN),
            done(4, "123456789012345678901"),
            run(5, COST_RUN),
            failed(5),
            run(6, COST_RUN),
            done(6, "7"),
        ];
        let spent = spent(&journal);
        assert_eq!(spent.total, Some(7));
        assert_eq!(spent.refused, 5);
        assert_eq!(spent.first_refused, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn charges_saturate_instead_of_wrapping() {
        let max = u64::MAX.to_string();
        let journal = [
            run(1, COST_RUN),
            done(1, &max),
            run(2, COST_RUN),
            done(2, "5"),
        ];
        assert_eq!(spent(&journal).total, Some(u64::MAX));
    }

    #[test]
    fn reports_past_the_cap_are_passed_over_and_refusals_named_only_first() {
        let mut journal = Vec::new();
        for id in 1..=u32::try_from(MAX_REPORTS + 7).unwrap() {
            journal.push(run(id, COST_RUN));
            journal.push(done(id, if id % 2 == 0 { "x" } else { "1" }));
        }
        let spent = spent(&journal);
        assert_eq!(spent.total, Some(u64::try_from(MAX_REPORTS / 2).unwrap()));
        assert_eq!(spent.refused, MAX_REPORTS / 2);
        assert_eq!(spent.first_refused, vec![2, 4, 6, 8, 10]);
        assert_eq!(spent.passed_over, 7);
    }
}
