//! Model tests of the ring handshakes with loom: every interleaving (and
//! every weak-memory outcome loom models) of the two sides is run.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p tcps-proto --release --lib loom_tests`
//! (scripts/test.sh does, with `CARGO_TARGET_DIR=target/loom`).
//!
//! **Why a lib module over the control blocks, not the region types.**
//! loom cannot model memory shared through `mmap`: its atomics are objects
//! of its own, not views of a mapped word, and a `RecvRingRef` is a raw
//! pointer into a mapping. So under `--cfg loom` the control blocks
//! ([`RecvRingCtl`], [`SendQueueCtl`]) are built from loom's atomics
//! (crate::sync) and allocated on the heap, and the models call the very
//! functions the producer/consumer types are made of (the handshake cores
//! in `eager::recv` and `sendq::queue`, which are crate-private, hence a
//! lib module rather than `tests/loom.rs`). The ring bytes, descriptors and
//! futex syscalls are left out: the races are on the control words. A
//! futex wait is modelled as the *decision* to sleep; a lost wake-up is a
//! sleeper the waker did not see.
//!
//! Properties:
//!
//! * lost wake-up (receive ring, send queue): a host that decided to sleep
//!   was seen by the server's publish (`host_waiting != 0` after its fence);
//! * lost kick (receive/accept ring): a server that stays paused after its
//!   re-read of `head` is seen by the host's consume, which then kicks;
//!   and a host that skips a kick because its last one is unseen is seen
//!   by the server's handling of that kick. (This model found a real gap:
//!   the server stored `kicks_seen` and re-read `head` with no fence
//!   between, so both sides could miss each other and the ring stayed
//!   paused until the 10 ms sweep; `set_kicks_seen` now fences.)
//!
//! The send queue's cold transition is deliberately *not* a Dekker pair
//! (the host's hot path has no fence; the server's second look a little
//! later and its sweep bound the delay):
//! [`send_queue_cold_needs_the_second_look`] has loom find the interleaving
//! where neither side sees the other, so the second look stays necessary.
//! The channel rings' completion sleep handshakes (`ServerCursor`/`HostCursor`) are
//! not modelled here: their words live in the mapped channel block
//! (`layout::ChannelCtl`, std atomics) next to slots written through raw
//! pointers; they are the same store/fence/load pattern as the ones above.
//! The request ring's room handshake is: its cores (`ring::room_*`) take
//! any [`crate::sync::Word`], so the model runs them on loom's atomics;
//! so is a host's dormancy (`ring::announce_dormant`, `published_since`,
//! `publish_request`).

use crate::eager::ctl::{RecvRingCtl, ACCEPT_RECORD_SIZE};
use crate::eager::recv::{self, RecvCursor};
use crate::ready_log::{LogEntry, ReadyLogCtl, ReadyLogReader};
use crate::sendq::ctl::SendQueueCtl;
use crate::sendq::queue;
use loom::sync::atomic::Ordering;
use loom::sync::Arc;
use loom::thread;

const SIZE: u32 = 4096;
/// `pause_threshold(4096)` at the server.
const THRESHOLD: u32 = 1024;

/// Runs `host` on a thread of its own against `server` on this one, both
/// on `ctl`; returns their results.
fn race<C: Send + Sync + 'static>(
    ctl: C,
    host: impl FnOnce(&C) -> bool + Send + 'static,
    server: impl FnOnce(&C) -> bool,
) -> (bool, bool) {
    let ctl = Arc::new(ctl);
    let h = {
        let ctl = ctl.clone();
        thread::spawn(move || host(&ctl))
    };
    let s = server(&ctl);
    (h.join().unwrap(), s)
}

/// The host registers and re-checks `tail`; true: it futex-waits (and
/// stays registered until woken, so no `wait_done` in the model).
fn ring_sleeper(ctl: &RecvRingCtl) -> bool {
    recv::wait_prepare(ctl, 1);
    recv::is_quiet(ctl, 0)
}

#[test]
fn receive_ring_publish_never_misses_a_sleeper() {
    loom::model(|| {
        let (slept, woke) = race(RecvRingCtl::zeroed(), ring_sleeper, |c| {
            recv::publish(c, None, 100, None).thread
        });
        assert!(!slept || woke, "lost wake-up: the host sleeps, unseen");
    });
}

/// A doorbell sleeper registers with `BELL_SLEEPER` and re-checks `tail`.
fn bell_sleeper(ctl: &RecvRingCtl) -> bool {
    recv::wait_prepare(ctl, crate::eager::BELL_SLEEPER);
    recv::is_quiet(ctl, 0)
}

#[test]
fn receive_ring_publish_never_misses_a_doorbell_sleeper() {
    loom::model(|| {
        let (slept, woke) = race(RecvRingCtl::zeroed(), bell_sleeper, |c| {
            let w = recv::publish(c, None, 100, None);
            // A doorbell sleeper is reported, never futex-woken.
            assert!(!w.thread);
            w.bell
        });
        assert!(!slept || woke, "lost wake-up: the doorbell is never rung");
    });
}

/// A ring and its host's ready log.
struct RingAndLog {
    ring: RecvRingCtl,
    log: ReadyLogCtl,
}

fn ring_and_log() -> RingAndLog {
    RingAndLog {
        ring: RecvRingCtl::zeroed(),
        log: ReadyLogCtl::zeroed(),
    }
}

/// The server publishes 100 bytes into ring 3, announced in the log.
fn publish_logged(c: &RingAndLog) -> crate::eager::Woke {
    let entry = LogEntry { log: &c.log, id: 3 };
    recv::publish(&c.ring, Some(entry), 100, None)
}

/// A doorbell sleeper on the whole ready log (epoll's ready list) is seen
/// by a publish into any ring of the host.
#[test]
fn ready_log_append_never_misses_a_log_sleeper() {
    loom::model(|| {
        let (slept, woke) = race(
            ring_and_log(),
            |c| {
                let r = ReadyLogReader::new(&c.log);
                r.bell_wait_prepare(5);
                r.tail() == 0
            },
            |c| {
                let w = publish_logged(c);
                // The sleeper's doorbell is named whenever it is seen.
                assert!(!w.bell || w.bells == 1 << 5, "{w:?}");
                w.bell
            },
        );
        assert!(
            !slept || woke,
            "lost wake-up: the log's sleeper is never rung"
        );
    });
}

/// A reader that finds a ring in the log finds the ring's new bytes.
#[test]
fn ready_log_entry_shows_the_published_ring() {
    loom::model(|| {
        race(
            ring_and_log(),
            |c| {
                let mut cur = 0;
                let mut ids = Vec::new();
                ReadyLogReader::new(&c.log).read(&mut cur, &mut ids);
                if ids == [3] {
                    assert_eq!(c.ring.tail.load(Ordering::Acquire), 100, "stale ring");
                }
                true
            },
            |c| {
                publish_logged(c);
                true
            },
        );
    });
}

/// A reader the writer laps while it reads: whatever `read` returns as
/// whole (`true`) is exactly the ids appended since the cursor, in order,
/// none lost and none twice; a lapped read says so (`false`). The log has
/// [`crate::ready_log::READY_LOG_SLOTS`] = 4 slots under loom; the writer
/// appends six ids, so it overwrites slots the reader may be reading.
#[test]
fn ready_log_lapped_reader_is_told() {
    loom::model(|| {
        race(
            ReadyLogCtl::zeroed(),
            |log| {
                let r = ReadyLogReader::new(log);
                // The reader starts a little behind: slot 0 is the one the
                // writer's fifth append overwrites.
                let mut cur = 0;
                let mut ids = Vec::new();
                if r.read(&mut cur, &mut ids) {
                    let want: Vec<u32> = (0..cur).map(|seq| 10 + seq).collect();
                    assert_eq!(ids, want, "a whole read returned the wrong ids");
                }
                true
            },
            |log| {
                for seq in 0..6 {
                    crate::ready_log::append(log, 10 + seq);
                }
                true
            },
        );
    });
}

#[test]
fn receive_ring_end_never_misses_a_sleeper() {
    loom::model(|| {
        // EOF with no data: only `end` moves.
        let (slept, woke) = race(RecvRingCtl::zeroed(), ring_sleeper, |c| {
            recv::publish(c, None, 0, Some(Ok(()))).thread
        });
        assert!(!slept || woke, "lost wake-up at end of stream");
    });
}

/// The server paused a full byte ring while the host consumed half of it.
#[test]
fn receive_ring_pause_never_loses_the_kick() {
    loom::model(|| {
        let (kicked, stays_paused) = race(
            RecvRingCtl::zeroed(),
            |c| recv::consume(c, &mut RecvCursor::default(), SIZE / 2),
            |c| SIZE - recv::pause(c, SIZE, 0, 1).0 < THRESHOLD,
        );
        assert!(!stays_paused || kicked, "lost kick: paused, host unaware");
    });
}

/// The same on an accept ring (whole records, capacity 2).
#[test]
fn accept_ring_pause_never_loses_the_kick() {
    loom::model(|| {
        let cap = 2 * ACCEPT_RECORD_SIZE;
        let (kicked, stays_paused) = race(
            RecvRingCtl::zeroed(),
            |c| recv::consume(c, &mut RecvCursor::default(), ACCEPT_RECORD_SIZE),
            |c| recv::pause(c, cap, 0, ACCEPT_RECORD_SIZE).0 >= cap,
        );
        assert!(!stays_paused || kicked, "lost kick on an accept ring");
    });
}

/// A host whose kick is still unseen skips the next one; the server's
/// handling of that kick (`set_kicks_seen`, then `resume` reads `head`)
/// must then see the host's consume, or the host must see the kick counted
/// and kick again.
#[test]
fn receive_ring_unseen_kick_is_not_lost() {
    loom::model(|| {
        let ctl = RecvRingCtl::zeroed();
        ctl.paused.store(1, Ordering::Relaxed);
        let (kicked, stays_paused) = race(
            ctl,
            |c| {
                // One kick posted already (unseen so far).
                let mut cur = RecvCursor {
                    consumed: 0,
                    kicks_sent: 1,
                };
                recv::consume(c, &mut cur, SIZE / 2)
            },
            |c| {
                // The server takes that kick.
                recv::set_kicks_seen(c, 1);
                SIZE - recv::look_head(c, SIZE, 0, 1).0 < THRESHOLD
            },
        );
        assert!(!stays_paused || kicked, "lost kick behind an unseen one");
    });
}

#[test]
fn send_queue_done_never_misses_a_sleeper() {
    loom::model(|| {
        let (slept, woke) = race(
            SendQueueCtl::zeroed(),
            |c| queue::wait_prepare(c, 0),
            |c| queue::publish_done(c, 1).thread,
        );
        assert!(!slept || woke, "lost wake-up on a send queue");
    });
}

/// A doorbell sleeper waiting for room (POLLOUT) is always reported.
#[test]
fn send_queue_done_never_misses_a_doorbell_sleeper() {
    loom::model(|| {
        let (slept, woke) = race(
            SendQueueCtl::zeroed(),
            |c| {
                queue::bell_wait_prepare(c, 0);
                c.done.load(Ordering::Acquire) == 0
            },
            |c| {
                let w = queue::publish_done(c, 1);
                assert!(!w.thread);
                w.bell
            },
        );
        assert!(
            !slept || woke,
            "lost wake-up: room appears, the doorbell stays quiet"
        );
    });
}

/// The server's failure path wakes too (`fail_overrun`: error, then the
/// same fence and look).
#[test]
fn send_queue_error_never_misses_a_sleeper() {
    loom::model(|| {
        let (slept, woke) = race(
            SendQueueCtl::zeroed(),
            // A host out of credits sleeps until `done` moves or an error
            // appears; its re-check reads both.
            |c| queue::wait_prepare(c, 0) && c.error.load(Ordering::Acquire) == 0,
            |c| {
                c.error.store(libc::EPROTO, Ordering::Release);
                queue::wake_if_waiting(c).thread
            },
        );
        assert!(!slept || woke, "lost wake-up at a send queue error");
    });
}

/// The hot path has no fence: a host store of `head` racing the server's
/// `active = 0` may be missed by both sides (the host sees the stale
/// `active = 1`, the server the stale `head`). That is why a queue that
/// went cold gets a second look (`RECHECK_AFTER`) and the sweep. The model
/// asserts the strong property and expects loom to find the interleaving.
#[test]
#[should_panic(expected = "neither side saw the other")]
fn send_queue_cold_needs_the_second_look() {
    loom::model(|| {
        let ctl = SendQueueCtl::zeroed();
        ctl.active.store(1, Ordering::Relaxed);
        let (kicked, found) = race(
            ctl,
            |c| {
                queue::publish_head(c, 1);
                queue::needs_kick(c, &mut 0)
            },
            |c| {
                queue::deactivate(c);
                queue::has_new(c, 0)
            },
        );
        assert!(kicked || found, "neither side saw the other");
    });
}

/// A host thread finds the request ring full (4 entries, `req_head` 0,
/// next request 4) and registers for room while the server takes one
/// request (stores `req_head`, then looks for waiters).
#[test]
fn request_ring_room_never_misses_a_waiter() {
    use crate::ring::{room_prepare, room_wanted};
    use loom::sync::atomic::AtomicU32;
    loom::model(|| {
        let words = (AtomicU32::new(0), AtomicU32::new(0)); // (waiters, req_head)
        let (slept, woke) = race(
            words,
            |(waiters, head)| {
                let slept = room_prepare(waiters, head, 4, 4).is_some();
                if !slept {
                    // Room appeared: it unregistered itself.
                    assert_eq!(waiters.load(Ordering::Relaxed), 0);
                }
                slept
            },
            |(waiters, head)| {
                head.store(1, Ordering::Release);
                room_wanted(waiters)
            },
        );
        assert!(
            !slept || woke,
            "lost wake-up: the poster sleeps on a full ring, unseen"
        );
    });
}

/// The worker makes an idle host dormant (raises `server_sleeping` to
/// `HOST_DORMANT`, re-checks the channel's `req_tail`) while the host
/// publishes a request (stores `req_tail`, looks at `server_sleeping`):
/// either the server's re-check sees the request (the host stays awake) or
/// the host sees the flag and rings its doorbell. Neither seeing the other
/// would leave the request unread until the host's next call.
#[test]
fn dormant_host_never_misses_a_request() {
    use crate::ring::{announce_dormant, publish_request, published_since};
    use loom::sync::atomic::AtomicU32;
    loom::model(|| {
        let words = (AtomicU32::new(0), AtomicU32::new(0)); // (req_tail, server_sleeping)
        let (rang, seen) = race(
            words,
            |(tail, flag)| publish_request(tail, 1, flag) != 0,
            |(tail, flag)| {
                announce_dormant(flag);
                published_since(tail, 0)
            },
        );
        assert!(
            rang || seen,
            "lost request: the host does not ring, the server does not look"
        );
    });
}
