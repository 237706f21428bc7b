//! The host's side of an attachment: the pool of channels, checking a piece
//! of one out for a call, and the request/completion exchanges of that call
//! (submit, doorbell, spin, sleep, server liveness).
//!
//! # Several calls per channel
//!
//! A channel's rings have `ring_entries` slots and the server completes
//! requests in any order (a call that would block is parked and completed
//! later), so one channel carries calls of several host threads at once.
//! Each `Slot` (`conn`) keeps the host's state of its channel behind a mutex that
//! is held only for short critical sections (submit, drain, release), never
//! while waiting:
//!
//! * the `HostCursor` and the last request tag;
//! * the *users* table: one entry per call holding a piece of the channel
//!   (its current tag, its arena range, where its request is). It is the
//!   arena allocator (first fit over the gaps between ranges), the set of
//!   tags in flight (a completion whose tag is not in flight is stray:
//!   dropped and counted, nobody fails) and the index of
//! * the *mailbox*: completions a thread drained for another thread;
//! * how many host threads sleep on the channel's futex.
//!
//! A `users` counter mirrors the table's size outside the lock for checkout.
//!
//! **Checkout** prefers an idle channel (no users): the thread's last one,
//! then the first idle one. There a call gets what it asks for up to 15/16
//! of the arena (the rest stays free for calls that may come to share the
//! channel while this one is parked). When every channel is
//! in use (calls parked at the server: blocking recv/accept/poll on idle
//! connections) a call *shares* the channel with the fewest users that has
//! room: fewer than `ring_entries - 1` users (so the request ring never
//! fills and the server's completion credits never run out) and an arena
//! gap. A sharing call gets at most a sixteenth of the channel's free arena
//! (send and recv move less per request: a blocking send loops over chunks,
//! a recv returns less, as BSD allows), but at least what it must have (an
//! address, an option, a poll array). Only when no channel has ring and
//! arena room does a thread back off and retry.
//!
//! **Small calls** (at most `STAGE` bytes of arena: addresses, options,
//! small sends and recvs, no data at all) are *staged*: checkout only picks
//! a channel; the lease mirrors its range in a buffer of its own; `exchange`
//! reserves the range, copies the input in and submits under one lock, and
//! the drain that finds the completion copies the range out and releases
//! it. A small call therefore locks its channel twice (submit, drain), and
//! holds arena only while its request is in flight. Larger calls reserve
//! their range at checkout and release it on drop.
//!
//! **Waiting** for the completion tagged with the call's tag: spin (adaptive
//! budget, at most `TCPS_SPINNERS` threads, stop early when the server says
//! the call is parked) watching `cq_tail` without the lock; when it moved
//! past what was drained, lock and drain *every* available completion (ours
//! is taken, others go to the mailbox). Then sleep: under the lock drain,
//! register as a sleeper, set `host_waiting`, fence, re-read `cq_tail`;
//! sleep on the futex only if nothing new was published. The completion we
//! wait for is published after that read, so it changes `cq_tail` from the
//! value we sleep on, and the server wakes every waiter on `cq_tail` while
//! `host_waiting` is set (it stays set while any thread of the channel is
//! registered). A thread that files another thread's completion in the
//! mailbox also wakes the channel's sleepers.
//!
//! A call's range is freed once its completion was taken and its output
//! copied out. A lease dropped while its request is still in flight (the
//! thread unwinds, or gives up because the server died) leaves its entry
//! `Abandoned`: the range is freed when that completion is drained.
//!
//! Files: `conn` (the attachment: region, pool of channel slots, liveness,
//! posting requests that get no completion, counters), `checkout` (picking
//! a channel and an arena range), `lease` (one call's exchange: submit,
//! spin, sleep, drain), `state` (a channel's users table, arena allocator
//! and mailbox). They import downwards only: `checkout` → `lease` →
//! `conn` → `state`.

mod checkout;
mod conn;
mod lease;
mod state;

pub(crate) use conn::Conn;
pub use conn::HostStats;
pub(crate) use lease::Lease;
