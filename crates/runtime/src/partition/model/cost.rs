//! What an invocation spent, as its handler reports it: the results of its `ctx.run` steps
//! named [`COST_RUN`], summed. Every SDK can name a run and journal its result, and a run's
//! result is journaled once and replayed, never run again: read from the journal when the
//! invocation completes and stored with its completion, a charge is neither lost by a crash nor
//! counted twice. (A response header cannot carry it: an SDK sends its response's head before
//! the handler runs, the body being the stream of protocol messages.)

use bytes::Bytes;
use prost::Message as _;

use crate::protocol::proto::{self, notification_template};
use crate::protocol::{Frame, MessageType};

/// The name of a `ctx.run` step whose result is what the invocation spent.
pub const COST_RUN: &str = "sluice:cost";

/// Most digits a reported cost may have: a `u64` written out.
const MOST_DIGITS: usize = 20;

/// What the invocation whose journal is `journal` spent: the sum (saturating) of the values of
/// its completed [`COST_RUN`] steps, or `None` when it reported nothing. A step that failed,
/// or whose value is not a non-negative JSON integer that fits a `u64`, adds nothing and is
/// returned in `refused` by its completion id, so the caller can say so.
pub fn spent(journal: &[Frame], refused: &mut Vec<u32>) -> Option<u64> {
    let run = MessageType::Run.id();
    let completion = MessageType::RunCompletion.id();
    let mut steps: Vec<u32> = Vec::new();
    for frame in journal.iter().filter(|f| f.ty == run) {
        if let Ok(command) = proto::RunCommandMessage::decode(Bytes::clone(&frame.payload))
            && command.name == COST_RUN
        {
            steps.push(command.result_completion_id);
        }
    }
    if steps.is_empty() {
        return None;
    }
    let mut total: Option<u64> = None;
    for frame in journal.iter().filter(|f| f.ty == completion) {
        let Ok(done) = proto::NotificationTemplate::decode(Bytes::clone(&frame.payload)) else {
            continue;
        };
        let Some(notification_template::Id::CompletionId(id)) = done.id else {
            continue;
        };
        let Some(at) = steps.iter().position(|s| *s == id) else {
            continue;
        };
        // One completion per step: a second one (never written by the partition) is ignored.
        steps.swap_remove(at);
        match done.result.as_ref().and_then(amount) {
            Some(amount) => total = Some(total.unwrap_or(0).saturating_add(amount)),
            None => refused.push(id),
        }
    }
    total
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
    use crate::protocol::Message;

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
        let mut refused = Vec::new();
        assert_eq!(spent(&journal, &mut refused), Some(1540));
        assert!(refused.is_empty());
    }

    #[test]
    fn an_invocation_that_reports_nothing_spent_nothing_known() {
        let mut refused = Vec::new();
        assert_eq!(
            spent(&[input(), run(1, "fetch"), done(1, "5")], &mut refused),
            None
        );
        // A cost step not completed (the invocation was killed during it) charges nothing.
        assert_eq!(spent(&[input(), run(1, COST_RUN)], &mut refused), None);
        assert!(refused.is_empty());
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
        let mut refused = Vec::new();
        assert_eq!(spent(&journal, &mut refused), Some(7));
        assert_eq!(refused, vec![1, 2, 3, 4, 5]);
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
        assert_eq!(spent(&journal, &mut Vec::new()), Some(u64::MAX));
    }
}
