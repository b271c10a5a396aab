//! The API's watch lines ([`forkvm_api::WatchEvent`]) in terms of the agent's watch
//! messages, so that the daemon's `files/watch` and the CLI's local `forkvm watch` say
//! the same thing the same way.

use forkvm_api::WatchEvent;
use forkvm_proto::{ChangeKind, ClientError, WatchMessage, WatchStream};
use std::io::{Read, Write};

/// The API's name of a change kind.
pub fn kind_name(k: ChangeKind) -> &'static str {
    match k {
        ChangeKind::Create => "create",
        ChangeKind::Write => "write",
        ChangeKind::Remove => "remove",
        ChangeKind::Rename => "rename",
        ChangeKind::Chmod => "chmod",
    }
}

/// The line for one message of the agent's watch.
pub fn event(m: WatchMessage) -> WatchEvent {
    match m {
        WatchMessage::Armed { directories } => WatchEvent::Armed { directories },
        WatchMessage::Change { kind, path } => WatchEvent::Change { kind: kind_name(kind).into(), path },
        WatchMessage::Keepalive => WatchEvent::Keepalive,
        WatchMessage::Overflow => WatchEvent::Overflow,
    }
}

/// Why a watch whose directory went away ended (its `end` line's reason).
pub const GONE: &str = "the watched directory went away";

/// Hands `on_event` an armed watch's lines, `armed` first, until it returns `false`
/// (the watch is then stopped in the guest: `Ok(None)`) or the watch ends there
/// (`Ok(Some(reason))`).
pub fn relay<S: Read + Write>(
    mut stream: WatchStream<S>,
    directories: u32,
    on_event: &mut dyn FnMut(WatchEvent) -> bool,
) -> Result<Option<String>, ClientError> {
    let mut next = Some(WatchEvent::Armed { directories });
    while let Some(line) = next {
        if !on_event(line) {
            let _ = stream.stop();
            return Ok(None);
        }
        next = stream.recv()?.map(event);
    }
    Ok(Some(GONE.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_tagged_lines() {
        let line = |m| serde_json::to_string(&event(m)).unwrap();
        assert_eq!(
            line(WatchMessage::Change { kind: ChangeKind::Write, path: "a/b".into() }),
            r#"{"type":"change","kind":"write","path":"a/b"}"#
        );
        assert_eq!(line(WatchMessage::Keepalive), r#"{"type":"keepalive"}"#);
        assert_eq!(line(WatchMessage::Armed { directories: 2 }), r#"{"type":"armed","directories":2}"#);
        assert_eq!(kind_name(ChangeKind::Chmod), "chmod");
    }
}
