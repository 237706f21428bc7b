//! The server's side of a send queue (`SendQueueConsumer`) fed a control
//! block and descriptors the host wrote arbitrarily: the new descriptors
//! are counted within the queue's credits or the host is told it overran
//! (`Overrun`), each one is copied out once and checked, never a panic.
#![no_main]

#[path = "common.rs"]
mod common;

use common::u32_at;
use libfuzzer_sys::fuzz_target;
use tcps_proto::sendq::SendQueueConsumer;

fuzz_target!(|data: &[u8]| {
    let s = common::shared();
    let l = common::LAYOUT;
    // The server's own cursor (never read back from shared memory).
    let (ingested, done) = (u32_at(data, 0), u32_at(data, 4));
    let host = data.get(8..).unwrap_or_default();
    s.scribble(l.send_queue_offset(0), l.sq_stride(), host);
    let q = SendQueueConsumer::new(s.region.send_queue(0).expect("queue 0"));
    let Ok(n) = q.pending(ingested, done) else {
        return;
    };
    assert!(
        n <= q.entries(),
        "{n} new descriptors in a queue of {}",
        q.entries()
    );
    for k in 0..n {
        let d = q.take_desc(ingested.wrapping_add(k));
        if SendQueueConsumer::desc_ok(&d) {
            let e = d.entry().expect("desc_ok means an entry");
            let _ = e;
        }
    }
});
