//! Restarting a completed invocation as a new one from a journal prefix: the entries up to
//! `from` are copied, with the notifications that complete the commands among them (wherever
//! they were journaled), so the new invocation replays that much and runs on from there.

use bytes::Bytes;
use prost::Message as _;

use sluice_protocol::message::Kind;
use sluice_protocol::proto::{self, notification_template};
use sluice_protocol::{Frame, Message, MessageType, ProtocolVersion};

/// Entries `0..=from` of `journal`, then the later notifications completing their commands.
/// Fails (saying why) when `from` is past the end, an entry does not decode, or a command in
/// the prefix was never completed.
pub fn journal_prefix(
    journal: &[Frame],
    from: u32,
    version: ProtocolVersion,
) -> Result<Vec<Frame>, String> {
    let end = usize::try_from(from).unwrap_or(usize::MAX);
    if end >= journal.len() {
        return Err(format!(
            "'from' is {from}, but the journal has {} entries (0 to {})",
            journal.len(),
            journal.len().saturating_sub(1)
        ));
    }
    let mut prefix = journal[..=end].to_vec();
    let mut awaited = Vec::new();
    for (index, frame) in prefix.iter().enumerate() {
        if kind(frame) == Some(Kind::Command) {
            let message = Message::decode(frame, version)
                .map_err(|e| format!("journal entry {index} does not decode: {e}"))?;
            awaited.extend(message.awaited_completions());
        }
    }
    let in_prefix: Vec<u32> = prefix.iter().filter_map(completion_of).collect();
    awaited.retain(|c| !in_prefix.contains(c));
    for frame in &journal[end + 1..] {
        if let Some(completion) = completion_of(frame)
            && let Some(at) = awaited.iter().position(|c| *c == completion)
        {
            awaited.swap_remove(at);
            prefix.push(frame.clone());
        }
    }
    match awaited.first() {
        None => Ok(prefix),
        Some(missing) => Err(format!(
            "a command in the first {} entries was never completed (completion {missing}): pick a 'from' before it",
            end + 1
        )),
    }
}

fn kind(frame: &Frame) -> Option<Kind> {
    MessageType::from_id(frame.ty).map(MessageType::kind)
}

/// The completion id a notification carries (not a signal's).
fn completion_of(frame: &Frame) -> Option<u32> {
    if kind(frame) != Some(Kind::Notification) {
        return None;
    }
    match proto::NotificationTemplate::decode(Bytes::clone(&frame.payload))
        .ok()?
        .id?
    {
        notification_template::Id::CompletionId(c) => Some(c),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: ProtocolVersion = ProtocolVersion::V5;

    fn input() -> Frame {
        Message::Input(proto::InputCommandMessage::default()).to_frame(false)
    }

    fn run(completion: u32) -> Frame {
        Message::Run(proto::RunCommandMessage {
            result_completion_id: completion,
            ..Default::default()
        })
        .to_frame(false)
    }

    fn done(completion: u32) -> Frame {
        Message::RunCompletion(proto::NotificationTemplate {
            id: Some(notification_template::Id::CompletionId(completion)),
            result: Some(notification_template::Result::Void(proto::Void {})),
        })
        .to_frame(false)
    }

    #[test]
    fn a_prefix_takes_the_completions_of_its_commands() {
        // input, run 1, run 2, done 2, done 1, output-ish run 3, done 3
        let journal = [input(), run(1), run(2), done(2), done(1), run(3), done(3)];
        let prefix = journal_prefix(&journal, 1, V).unwrap();
        assert_eq!(prefix, vec![input(), run(1), done(1)]);
        let prefix = journal_prefix(&journal, 3, V).unwrap();
        assert_eq!(prefix, vec![input(), run(1), run(2), done(2), done(1)]);
        assert_eq!(journal_prefix(&journal, 0, V).unwrap(), vec![input()]);
    }

    #[test]
    fn uncompleted_commands_and_a_far_from_are_refused() {
        let journal = [input(), run(1), run(2), done(2)];
        let why = journal_prefix(&journal, 1, V).unwrap_err();
        assert!(why.contains("never completed (completion 1)"), "{why}");
        let why = journal_prefix(&journal, 9, V).unwrap_err();
        assert!(why.contains("journal has 4 entries"), "{why}");
        assert!(journal_prefix(&journal, u32::MAX, V).is_err());
    }
}
