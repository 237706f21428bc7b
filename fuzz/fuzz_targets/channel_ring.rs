//! The server's side of a channel (`ServerCursor`) fed a channel block and
//! request slots the host wrote arbitrarily: requests are taken, decoded
//! and completed, or the channel is refused (`RingError`), never a panic,
//! and never more outstanding calls than ring slots.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use tcps_proto::ring::ServerCursor;
use tcps_proto::{Call, Completion};

fuzz_target!(|data: &[u8]| {
    let s = common::shared();
    let l = common::LAYOUT;
    // The whole channel 0 (control block, requests, completions) as the
    // host left it; the arena is not read by the cursor.
    s.scribble(l.channel_offset(0), l.arena_offset(), data);
    let ch = s.region.channel(0).expect("channel 0");
    let mut cur = ServerCursor::default();
    for step in 0..64usize {
        let req = match cur.pop(&ch) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => break,
        };
        assert!(cur.outstanding() <= l.ring_entries, "more calls than slots");
        let _ = Call::decode(&req, l.arena_size);
        if step % 3 != 2 {
            let c = Completion {
                user_data: req.user_data,
                ..Completion::default()
            };
            if cur.complete(&ch, &c).is_err() {
                break;
            }
        }
    }
});
