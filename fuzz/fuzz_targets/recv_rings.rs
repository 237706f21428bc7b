//! Receive and accept rings, both roles, fed arbitrary memory: the
//! server's producers read the host's `head` once and clamp it (what they
//! then write stays inside the free room), and the host's consumers
//! clamp a forged `tail` to one ring (a copy-out never leaves the ring).
#![no_main]

#[path = "common.rs"]
mod common;

use common::u32_at;
use libfuzzer_sys::fuzz_target;
use tcps_proto::eager::{
    AcceptRingConsumer, AcceptRingProducer, RecvCursor, RecvRingConsumer, RecvRingProducer,
    ACCEPT_RECORD_SIZE,
};

fuzz_target!(|data: &[u8]| {
    let s = common::shared();
    let l = common::LAYOUT;
    // The server's private cursor: `tail` published, `consumed` last seen
    // (consistent, as the server keeps them: consumed ≤ tail ≤ consumed + size).
    let size = l.rq_bytes;
    let consumed = u32_at(data, 0);
    let tail = consumed.wrapping_add(u32_at(data, 4) % (size + 1));
    let host = data.get(8..).unwrap_or_default();
    s.scribble(l.recv_ring_offset(0), l.rq_stride(), host);
    s.scribble(l.recv_ring_offset(1), l.rq_stride(), host);

    let bytes = RecvRingProducer::new(s.region.recv_ring(0).expect("ring 0"));
    let (used, c) = bytes.look(tail, consumed, 1);
    assert!(used <= size, "used {used} of {size}");
    assert!(
        c.wrapping_sub(consumed) <= tail.wrapping_sub(consumed),
        "head past tail"
    );
    assert_eq!(tail.wrapping_sub(c), used);
    let (p, n) = bytes.span_ptr(tail, size - used);
    assert!(n as u32 <= size - used);
    let _ = p;

    let acc = AcceptRingProducer::new(s.region.recv_ring(1).expect("ring 1"));
    let atail = tail & !(ACCEPT_RECORD_SIZE - 1);
    let acons = consumed & !(ACCEPT_RECORD_SIZE - 1);
    if atail.wrapping_sub(acons) <= size {
        let (used, _) = acc.look(atail, acons);
        assert!(used <= size, "accept ring: used {used} of {size}");
    }

    // The host's side: whatever the server (or a scribbler) left there.
    let rc = RecvRingConsumer::new(s.region.recv_ring(0).expect("ring 0"));
    let t = rc.tail();
    let avail = rc.available(t, consumed);
    assert!(avail <= size);
    let mut buf = vec![0u8; size as usize + 64];
    assert!(rc.copy_out(consumed, t, &mut buf) <= size as usize);
    let _ = (rc.end(), rc.end_errno(), rc.since(), rc.kind());
    let ac = AcceptRingConsumer::new(s.region.recv_ring(1).expect("ring 1"));
    let mut cur = RecvCursor {
        consumed: acons,
        kicks_sent: 0,
    };
    for _ in 0..8 {
        if ac.take(&mut cur).is_none() {
            break;
        }
    }
});
