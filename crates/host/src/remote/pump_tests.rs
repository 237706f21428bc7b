//! The host pump's tests (`pump.rs`): spans shipped in order, rebinds,
//! wake-ups, refusals.

use super::*;
use std::os::fd::AsFd;
use tcps_proto::msg::{Completion, Request};
use tcps_proto::ring::ServerCursor;

fn layout() -> Layout {
    Layout {
        n_channels: 2,
        ring_entries: 8,
        arena_size: 4096,
        send_queues: 2,
        sq_entries: 8,
        recv_rings: 2,
        rq_bytes: 4096,
    }
}

fn region(l: Layout) -> (std::fs::File, Region) {
    let f = crate::remote::tests_memfd(l.region_size());
    let r = Region::map(f.as_fd(), l).unwrap();
    r.init_header();
    (f, r)
}

fn apply_all(to: &Region, who: Writer, s: &mut Spans) {
    let (h, d) = s.take();
    for span in wire::spans(&h, &d) {
        let (off, b) = span.unwrap();
        to.apply_span(who, off as usize, b).unwrap();
    }
}

#[test]
fn a_send_crosses_to_the_server_and_its_answer_back() {
    let l = layout();
    let ((_a, host), (_b, server)) = (region(l), region(l));
    HostPump::init(&host);
    let mut pump = HostPump::new(l);
    // The library: channels_used, arguments in the arena, the request.
    host.apply_span(Writer::Host, CHANNELS_USED, &1u32.to_le_bytes())
        .unwrap();
    let arena = l.channel_offset(0) + l.arena_offset();
    host.apply_span(Writer::Host, arena + 8, b"GET / HTTP/1.0")
        .unwrap();
    let mut hc = HostCursor::default();
    let req = Request {
        user_data: 5,
        op: Op::Send as u16,
        sock: 2,
        buf_off: 8,
        buf_len: 14,
        ..Default::default()
    };
    hc.submit(&host.channel(0).unwrap(), &req).unwrap();
    let mut out = Spans::new();
    pump.collect(&host, &mut out);
    apply_all(&server, Writer::Host, &mut out);
    // The worker takes it, reads the bytes and answers.
    let ch = server.channel(0).unwrap();
    let mut sc = ServerCursor::default();
    let got = sc.pop(&ch).unwrap().expect("the worker sees the request");
    assert_eq!((got.user_data, got.buf_len), (5, 14));
    let mut data = [0u8; 14];
    server.read_span(arena + 8, &mut data).unwrap();
    assert_eq!(&data, b"GET / HTTP/1.0");
    sc.complete(
        &ch,
        &Completion {
            user_data: 5,
            op: Op::Send as u16,
            result: 14,
            ..Default::default()
        },
    )
    .unwrap();
    // The server pump's batch (by hand here): the slot, then line 2,
    // then the header words with server_sleeping = 0.
    let mut back = Spans::new();
    let slot = l.channel_offset(0) + l.completions_offset();
    for (off, len) in [
        (slot, 32),
        (l.channel_offset(0) + 128, 12),
        (SERVER_WORDS, 12),
    ] {
        let mut b = vec![0u8; len];
        server.read_span(off, &mut b).unwrap();
        back.push(off as u32, &b);
    }
    let (h, d) = back.take();
    pump.apply(&host, &h, &d).unwrap();
    let c = hc
        .reap(&host.channel(0).unwrap())
        .expect("the host sees the answer");
    assert_eq!((c.user_data, c.result), (5, 14));
    let mut sleeping = [0u8; 4];
    host.read_span(SERVER_WORDS, &mut sleeping).unwrap();
    assert_eq!(
        u32::from_le_bytes(sleeping),
        1,
        "the pump keeps the doorbell rung by posts"
    );
    // The consumed completion's credit goes back; nothing else.
    pump.collect(&host, &mut out);
    let (h, d) = out.take();
    let spans: Vec<_> = wire::spans(&h, &d).map(|s| s.unwrap().0 as usize).collect();
    assert_eq!(
        spans,
        vec![l.channel_offset(0)],
        "only line 0 (cq_head) changed"
    );
}

#[test]
fn ring_heads_are_shipped_and_reset_by_a_rebind() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    let ring = l.recv_ring_offset(1);
    // The server binds ring 1 (owner 4) and publishes 10 bytes.
    let mut s = Spans::new();
    s.push((ring + 64) as u32, &10u32.to_le_bytes());
    s.push((ring + 128) as u32, &4u32.to_le_bytes());
    let (h, d) = s.take();
    pump.apply(&host, &h, &d).unwrap();
    // The host consumes them: its head goes to the server.
    host.apply_span(Writer::Host, ring, &10u32.to_le_bytes())
        .unwrap();
    let mut out = Spans::new();
    pump.collect(&host, &mut out);
    let (h, d) = out.take();
    let got: Vec<_> = wire::spans(&h, &d).map(|s| s.unwrap()).collect();
    assert!(
        got.contains(&(ring as u32, &10u32.to_le_bytes()[..])),
        "{got:?}"
    );
    // Bound anew (owner 5): head is 0 again, and nothing to ship.
    let mut s = Spans::new();
    s.push((ring + 64) as u32, &0u32.to_le_bytes());
    s.push((ring + 128) as u32, &5u32.to_le_bytes());
    let (h, d) = s.take();
    pump.apply(&host, &h, &d).unwrap();
    let mut head = [0u8; 4];
    host.read_span(ring, &mut head).unwrap();
    assert_eq!(head, [0; 4]);
    pump.collect(&host, &mut out);
    assert!(out.is_empty());
}

/// The same socket id bound again (same `owner`, a new `binds`): the
/// host's `head` restarts at 0 as for a new owner.
#[test]
fn a_rebind_to_the_same_socket_id_resets_the_head() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    let ring = l.recv_ring_offset(1);
    let line2 = |binds: u32| {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&2u32.to_le_bytes()); // owner
        b[12..].copy_from_slice(&binds.to_le_bytes());
        b
    };
    let mut s = Spans::new();
    s.push((ring + 128) as u32, &line2(1));
    let (h, d) = s.take();
    pump.apply(&host, &h, &d).unwrap();
    host.apply_span(Writer::Host, ring, &10u32.to_le_bytes())
        .unwrap();
    let mut s = Spans::new();
    s.push((ring + 128) as u32, &line2(2));
    let (h, d) = s.take();
    pump.apply(&host, &h, &d).unwrap();
    let mut head = [0u8; 4];
    host.read_span(ring, &mut head).unwrap();
    assert_eq!(head, [0; 4], "bound again: head restarts");
    // Unchanged lines shipped again: no reset.
    host.apply_span(Writer::Host, ring, &7u32.to_le_bytes())
        .unwrap();
    let mut s = Spans::new();
    s.push((ring + 128) as u32, &line2(2));
    let (h, d) = s.take();
    pump.apply(&host, &h, &d).unwrap();
    host.read_span(ring, &mut head).unwrap();
    assert_eq!(u32::from_le_bytes(head), 7);
}

/// A publish into a ring a doorbell sleeper watches (and into the
/// ready log) reports its doorbell slot, as the server's publish does.
#[test]
fn a_publish_reports_the_doorbell_sleepers_of_the_ring_and_the_log() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    let ring = l.recv_ring_offset(1);
    let tail = |t: u32| {
        let mut s = Spans::new();
        s.push((ring + 64) as u32, &t.to_le_bytes());
        s.take()
    };
    let (h, d) = tail(5);
    assert_eq!(pump.apply(&host, &h, &d).unwrap().bells, 0, "nobody waits");
    // A sleeper on doorbell 3 registers on the ring (host_waiting,
    // bell_slots), one on doorbell 5 on the ready log.
    let mut w = [0u8; 12];
    w[..4].copy_from_slice(&tcps_proto::eager::ctl::BELL_SLEEPER.to_le_bytes());
    w[4..].copy_from_slice(&(1u64 << 3).to_le_bytes());
    host.apply_span(Writer::Host, ring + 4, &w).unwrap();
    let (h, d) = tail(9);
    let woke = pump.apply(&host, &h, &d).unwrap();
    assert!(woke.bell && woke.bells == 1 << 3, "{woke:?}");
    // The log's `host_waiting`, padding, `bell_slots`.
    let log = READY_LOG_OFFSET + 64;
    host.apply_span(Writer::Host, log, &w[..4]).unwrap();
    host.apply_span(Writer::Host, log + 8, &(1u64 << 5).to_le_bytes())
        .unwrap();
    let mut s = Spans::new();
    s.push(READY_LOG_OFFSET as u32, &1u32.to_le_bytes());
    let (h, d) = s.take();
    assert_eq!(pump.apply(&host, &h, &d).unwrap().bells, 1 << 5);
}

/// The server bound send queue `q` (to socket `q`): its line 2 as the
/// server pump ships it. The host pump looks only at bound queues.
fn bind_queue(pump: &mut HostPump, host: &Region, l: &Layout, q: u32) {
    let mut b = [0u8; 16];
    b[8..12].copy_from_slice(&(q + 1).to_le_bytes()); // owner
    b[12..].copy_from_slice(&1u32.to_le_bytes()); // binds
    let mut s = Spans::new();
    s.push((l.send_queue_offset(q) + 128) as u32, &b);
    let (h, d) = s.take();
    pump.apply(host, &h, &d).unwrap();
}

#[test]
fn send_queue_descriptors_go_before_their_head_and_before_the_kick() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    bind_queue(&mut pump, &host, &l, 1);
    let q = l.send_queue_offset(1);
    for seq in 0..3u32 {
        let d = [seq as u8 + 1; 32];
        host.apply_span(Writer::Host, q + 192 + 32 * seq as usize, &d)
            .unwrap();
    }
    host.apply_span(Writer::Host, q, &3u32.to_le_bytes())
        .unwrap();
    host.apply_span(Writer::Host, CHANNELS_USED, &1u32.to_le_bytes())
        .unwrap();
    let mut hc = HostCursor::default();
    let kick = Request {
        user_data: 1,
        op: Op::AsyncKick as u16,
        sock: 1,
        ..Default::default()
    };
    hc.submit(&host.channel(0).unwrap(), &kick).unwrap();
    let mut out = Spans::new();
    pump.collect(&host, &mut out);
    let (h, d) = out.take();
    let offs: Vec<usize> = wire::spans(&h, &d).map(|s| s.unwrap().0 as usize).collect();
    let pos = |o: usize| offs.iter().position(|x| *x == o).unwrap();
    let slot = l.channel_offset(0) + l.requests_offset();
    assert!(
        pos(q + 192) < pos(q + 256) && pos(q + 256) < pos(q),
        "descriptors, then head: {offs:?}"
    );
    assert!(pos(q) < pos(slot), "the queue before the kick: {offs:?}");
    // Nothing new: nothing shipped for the queue.
    pump.collect(&host, &mut out);
    let (h, d) = out.take();
    assert!(wire::spans(&h, &d).all(|s| s.unwrap().0 as usize != q));
}

#[test]
fn a_bad_server_batch_is_refused() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    let mut s = Spans::new();
    s.push(CHANNELS_USED as u32, &[1, 0, 0, 0]); // a host field
    let (h, d) = s.take();
    assert_eq!(
        pump.apply(&host, &h, &d),
        Err(Refused::Span(SpanRefused::NotWriter))
    );
    assert_eq!(pump.apply(&host, &h[..2], &d), Err(Refused::Malformed));
}

/// A registration of `len` bytes: the library's memfd (its writes seen
/// through `RegCopy`s of it).
fn registration(len: usize) -> (std::fs::File, RegCopy) {
    let f = crate::remote::tests_memfd(len);
    let copy = RegCopy::map(f.as_fd(), len).unwrap();
    (f, copy)
}

#[test]
fn queued_registered_bytes_go_before_their_descriptor() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    let (file, copy) = registration(8192);
    pump.add_registration(3, copy);
    bind_queue(&mut pump, &host, &l, 0);
    // The library staged 6 bytes at 4000 of registration 3, then
    // published a descriptor naming them, and one for a file range.
    let lib = RegCopy::map(file.as_fd(), 8192).unwrap();
    lib.apply(4000, b"staged").unwrap();
    let q = l.send_queue_offset(0);
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&4000u64.to_le_bytes());
    d[8..12].copy_from_slice(&6u32.to_le_bytes());
    d[12..14].copy_from_slice(&3u16.to_le_bytes());
    host.apply_span(Writer::Host, q + 192, &d).unwrap();
    let mut f = [0u8; 32];
    f[8..12].copy_from_slice(&6u32.to_le_bytes());
    f[14..16].copy_from_slice(&DESC_FILE.to_le_bytes());
    host.apply_span(Writer::Host, q + 224, &f).unwrap();
    host.apply_span(Writer::Host, q, &2u32.to_le_bytes())
        .unwrap();
    let mut out = Spans::new();
    pump.collect(&host, &mut out);
    let (h, data) = out.take();
    let got: Vec<_> = wire::spans(&h, &data).map(|s| s.unwrap()).collect();
    let regs: Vec<_> = got
        .iter()
        .filter(|(o, _)| *o == wire::REG_SPAN)
        .map(|(_, b)| wire::reg_span(b).unwrap())
        .collect();
    assert_eq!(
        regs,
        vec![(3, 4000, &b"staged"[..])],
        "the file range ships none"
    );
    let pos = |off: u32| got.iter().position(|(o, _)| *o == off).unwrap();
    assert!(pos(wire::REG_SPAN) < pos((q + 192) as u32));
    assert!(
        pos((q + 224) as u32) < pos(q as u32),
        "descriptors, then head"
    );
    // An unknown registration ships nothing (the server fails the send).
    pump.drop_registration(3);
    host.apply_span(Writer::Host, q + 256, &d).unwrap();
    host.apply_span(Writer::Host, q, &3u32.to_le_bytes())
        .unwrap();
    pump.collect(&host, &mut out);
    let (h, data) = out.take();
    assert!(wire::spans(&h, &data).all(|s| s.unwrap().0 != wire::REG_SPAN));
}

/// The server binds a queue again (same owner, a new `binds`): the
/// host's copy restarts at `head = 0` and only new descriptors go.
#[test]
fn a_queue_bound_again_restarts_at_0() {
    let l = layout();
    let (_a, host) = region(l);
    let mut pump = HostPump::new(l);
    let q = l.send_queue_offset(1);
    host.apply_span(Writer::Host, q, &5u32.to_le_bytes())
        .unwrap();
    let mut out = Spans::new();
    pump.collect(&host, &mut out);
    out.take();
    let line2 = |binds: u32| {
        let mut b = [0u8; 16];
        b[8..12].copy_from_slice(&2u32.to_le_bytes()); // owner
        b[12..].copy_from_slice(&binds.to_le_bytes());
        let mut s = Spans::new();
        s.push((q + 128) as u32, &b);
        s.take()
    };
    let (h, d) = line2(1);
    pump.apply(&host, &h, &d).unwrap();
    let mut head = [0u8; 4];
    host.read_span(q, &mut head).unwrap();
    assert_eq!(head, [0; 4], "bound: head restarts");
    // One new descriptor: exactly it and head 1 go.
    host.apply_span(Writer::Host, q + 192, &[7; 32]).unwrap();
    host.apply_span(Writer::Host, q, &1u32.to_le_bytes())
        .unwrap();
    pump.collect(&host, &mut out);
    let (h, d) = out.take();
    let offs: Vec<usize> = wire::spans(&h, &d).map(|s| s.unwrap().0 as usize).collect();
    assert_eq!(offs, vec![q + 192, q]);
    // The same line again (done moved): no reset.
    let (h, d) = line2(1);
    pump.apply(&host, &h, &d).unwrap();
    host.read_span(q, &mut head).unwrap();
    assert_eq!(u32::from_le_bytes(head), 1);
}
