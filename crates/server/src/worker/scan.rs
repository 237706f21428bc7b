//! Which channels a pass reads: only those of *awake* hosts (issue 15 item
//! 2). A host whose channels brought no request for [`DORMANT_AFTER`] is
//! made dormant: the server-sleep handshake for its region alone
//! (`ServerCursor::announce_dormant`: `server_sleeping = HOST_DORMANT`, a
//! fence, a re-check of each channel's `req_tail`). Its next request then
//! rings its doorbell (as when the whole server sleeps), and the bell
//! wakes it (`wake`): back on the awake list, read by the next scan. So a
//! pass costs a look per channel of the hosts at work, not per host
//! attached; [`ScanCounters`] counts what the passes read (`tcps stat`).
//!
//! Everything else a pass does per host reads only the worker's own
//! memory (owed wake-ups, hot send-queue lists), and the engine reports
//! sockets; a dormant host's parked calls, send queues and rings are served
//! as before.

use super::panics::guarded;
use crate::calls::{self, Ctx};
use crate::host::Host;
use crate::slab::Slab;
use crate::stats::ScanCounters;
use std::time::{Duration, Instant};
use tcps_proto::ring::ServerCursor;

/// How long a host's channels must stay idle before it is made dormant.
/// Its next request then costs a doorbell (an eventfd write at the host,
/// an engine event here) once: as when the server sleeps.
pub(super) const DORMANT_AFTER: Duration = Duration::from_millis(2);
/// How often dormant hosts' channels are looked at regardless (`backstop`).
const BACKSTOP_EVERY: Duration = Duration::from_millis(100);
/// Requests taken from one channel per pass, so a chatty channel cannot starve others.
const BATCH_PER_CHANNEL: u32 = 32;

/// Takes and executes requests from every channel `host` uses; returns how
/// many, and how many channels it looked at.
pub(super) fn scan_host(cx: &mut Ctx<'_>, host: &mut Host) -> (usize, u32) {
    let mut handled = 0;
    let in_use = host.channels_in_use();
    for ch in 0..in_use {
        if host.doomed.is_some() {
            break; // a request broke its ring or panicked
        }
        let before = handled;
        for _ in 0..BATCH_PER_CHANNEL {
            let Some(chan) = host.region.channel(ch) else {
                break;
            };
            let req = match host.cursors[ch as usize].pop(&chan) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    host.doomed = Some(format!("channel {ch}: {e}"));
                    break;
                }
            };
            handled += 1;
            if guarded(host, "request", |h| calls::dispatch(cx, h, ch, req)).is_none() {
                break;
            }
        }
        // Host threads that found this request ring full sleep until
        // requests are taken (one fence per channel and pass).
        if handled > before {
            if let Some(chan) = host.region.channel(ch) {
                if ServerCursor::room_wanted(&chan) {
                    host.stats.wakes += 1;
                    ServerCursor::wake_room(&chan);
                }
            }
        }
    }
    if handled > 0 {
        host.last_request = Instant::now();
    }
    (handled, in_use)
}

/// Whether the host published a request on a channel it uses, by the
/// channels' `req_tail` (after `announce_dormant`).
fn has_published(h: &Host) -> bool {
    (0..h.channels_in_use()).any(|ch| {
        h.region
            .channel(ch)
            .is_some_and(|c| h.cursors[ch as usize].has_published(&c))
    })
}

/// The hosts whose channels a pass reads, and what the passes read.
#[derive(Default)]
pub(super) struct Awake {
    /// Host keys (in `Worker::hosts`); a key whose host is gone is dropped
    /// at the next look for idle hosts.
    pub keys: Vec<usize>,
    /// What the passes read since the last publication.
    pub counters: ScanCounters,
    /// When idle hosts are next looked for.
    next_check: Option<Instant>,
    /// When dormant hosts' channels are next looked at (`backstop`).
    next_backstop: Option<Instant>,
}

impl Awake {
    /// Every `DORMANT_AFTER / 2`: makes the awake hosts whose channels
    /// stayed idle for `DORMANT_AFTER` dormant.
    pub fn put_idle_to_sleep(&mut self, hosts: &mut Slab<Host>, now: Instant) {
        if self.next_check.is_some_and(|t| now < t) {
            return;
        }
        self.next_check = Some(now + DORMANT_AFTER / 2);
        let mut i = 0;
        while i < self.keys.len() {
            let Some(h) = hosts.get_mut(self.keys[i]) else {
                self.keys.swap_remove(i);
                continue;
            };
            if h.doomed.is_some() || now.saturating_duration_since(h.last_request) < DORMANT_AFTER {
                i += 1;
                continue;
            }
            // Dekker against the host's publish: after the fence, a request
            // published before it is seen here, a later one rings.
            ServerCursor::announce_dormant(h.region.header());
            if has_published(h) {
                ServerCursor::end_sleep(h.region.header());
                h.last_request = now;
                i += 1;
                continue;
            }
            h.dormant = true;
            self.keys.swap_remove(i);
            self.counters.dormant_entered += 1;
        }
        self.backstop(hosts, now);
    }

    /// Every `BACKSTOP_EVERY`, one look at each dormant host's channels: a
    /// host that published without ringing (it breaks the protocol, or a
    /// bug) is still served, late, and counted (`dormant_backstop`; a ring
    /// on its way counts too, rarely).
    fn backstop(&mut self, hosts: &mut Slab<Host>, now: Instant) {
        if self.next_backstop.is_some_and(|t| now < t) {
            return;
        }
        self.next_backstop = Some(now + BACKSTOP_EVERY);
        for (hkey, h) in hosts.iter_mut() {
            if h.dormant && has_published(h) {
                h.dormant = false;
                h.last_request = now;
                ServerCursor::end_sleep(h.region.header());
                self.keys.push(hkey);
                self.counters.dormant_backstop += 1;
            }
        }
    }

    /// A host was adopted (`hkey` new) or removed: its key is on the awake
    /// list once, or not at all.
    pub fn adopted(&mut self, hkey: usize) {
        self.removed(hkey);
        self.keys.push(hkey);
    }

    pub fn removed(&mut self, hkey: usize) {
        self.keys.retain(|&k| k != hkey);
    }

    /// Host `hkey` rang its doorbell: if it was dormant, its channels are
    /// read again from the next scan on (its request was published before
    /// the ring).
    pub fn wake(&mut self, hosts: &mut Slab<Host>, hkey: usize) {
        let Some(h) = hosts.get_mut(hkey).filter(|h| h.dormant) else {
            return;
        };
        h.dormant = false;
        h.last_request = Instant::now();
        ServerCursor::end_sleep(h.region.header());
        self.keys.push(hkey);
        self.counters.dormant_woken += 1;
    }

    /// Before the worker sleeps: `server_sleeping = SERVER_ASLEEP` in every
    /// host's region (dormant ones too: the flag means "ring, and the
    /// server may be asleep"), one fence; whether an awake host has a
    /// request (a dormant one's request rang already).
    pub fn announce_sleep(&self, hosts: &Slab<Host>) -> bool {
        ServerCursor::announce_sleep(hosts.iter().map(|(_, h)| h.region.header()));
        self.keys.iter().any(|&hkey| {
            hosts.get(hkey).is_some_and(|h| {
                (0..h.channels_in_use()).any(|ch| {
                    h.region
                        .channel(ch)
                        .is_some_and(|c| h.cursors[ch as usize].has_requests(&c))
                })
            })
        })
    }

    /// After the worker slept: awake hosts need not ring any more, dormant
    /// ones still do (but may spin: `HOST_DORMANT`).
    pub fn end_sleep(hosts: &Slab<Host>) {
        for (_, h) in hosts.iter() {
            if h.dormant {
                ServerCursor::keep_dormant(h.region.header());
            } else {
                ServerCursor::end_sleep(h.region.header());
            }
        }
    }
}
