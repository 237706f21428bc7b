//! A worker: one thread, pinned to its core, that polls the channels of its
//! hosts, executes their calls and handles engine events.
//!
//! The loop is: take new requests from the channels of every awake host
//! (waking the threads their completions were for; idle hosts are dormant
//! until they ring, `scan.rs`); collect engine events (readiness of parked
//! sockets and receive rings, host hang-ups, the doorbell) after an idle
//! pass, and every 5 µs while busy; fire expired poll timeouts. With no work it spins (`busy`), spins for a
//! while and then sleeps (`adaptive`), or sleeps at once (`block`). Before
//! sleeping it raises `server_sleeping` in every host's region so hosts ring
//! the doorbell eventfd, which wakes the engine.

mod messages;
mod panics;
mod pause;
mod reap;
mod scan;

use crate::calls::{self, Ctx, Timers};
use crate::config::{Config, PollMode};
use crate::engine::{self, Engine, Event};
use crate::host::{Host, NewHost};
use crate::shared::Shared;
use crate::slab::Slab;
use crate::sys;
use crate::token::{Token, MAX_HOSTS_PER_WORKER};
use messages::read_control;
use panics::guarded;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Hosts handed over by the acceptor, waiting to be adopted by a worker.
#[derive(Default)]
pub struct Inbox {
    pub hosts: Mutex<Vec<NewHost>>,
}

/// How often engine events are collected while the worker is busy (every
/// pass found work). A pass after an idle one always collects: an idle
/// worker has nothing better to do, and readiness is what the hosts wait
/// for, most often without a call parked here (a receive ring waiting for
/// read-ahead data, an accept ring). Collecting only every 200 µs when no
/// call was parked cost a blocking receive up to that much (issue 15).
const ENGINE_POLL_BUSY: Duration = Duration::from_micros(5);
/// Longest sleep, so housekeeping never stalls.
const MAX_SLEEP: Duration = Duration::from_millis(500);
/// How often every bound send queue is looked at, hot or not (a backstop;
/// see `calls::sendq`).
const SWEEP_EVERY: Duration = Duration::from_millis(10);
/// How often hot send queues are looked at. Not on every pass: each look
/// pulls the queue's `head` line away from the host, whose next send then
/// waits for it back; looking every couple of microseconds lets a burst of
/// sends hit the host's own cache, and an asynchronous send can afford the
/// wait (a kick or a write-side call takes the queue at once).
const HOT_POLL_EVERY: Duration = Duration::from_micros(2);

pub struct Worker {
    index: usize,
    cfg: Arc<Config>,
    shared: Arc<Shared>,
    engine: Box<dyn Engine>,
    hosts: Slab<Host>,
    doorbell: Arc<OwnedFd>,
    inbox: Arc<Inbox>,
    shutdown_fd: RawFd,
    timers: Timers,
    next_serial: u64,
    events: Vec<Event>,
    /// The wakes taken from `proto::futex` for the engine (kept for its room).
    deferred_wakes: Vec<(usize, i32)>,
    /// `arrival_order`'s scratch: (arrival, position, event).
    keyed_events: Vec<(u64, usize, Event)>,
    next_sweep: Instant,
    next_hot_poll: Instant,
    /// When the hosts' snapshots are next published (`tcps stat`), and
    /// whether there was work since the last time.
    next_publish: Instant,
    stats_dirty: bool,
    /// This worker's load, for balancing.
    meter: crate::balance::Meter,
    /// The hosts whose channels a pass reads (`scan`).
    awake: scan::Awake,
}

impl Worker {
    pub fn new(
        index: usize,
        cfg: Arc<Config>,
        shared: Arc<Shared>,
        doorbell: Arc<OwnedFd>,
        inbox: Arc<Inbox>,
        shutdown_fd: RawFd,
    ) -> std::io::Result<Worker> {
        let mut engine = engine::new(cfg.engine)?;
        engine.arm(
            doorbell.as_raw_fd(),
            Token::Doorbell.encode(),
            libc::POLLIN as u32,
        )?;
        engine.arm(shutdown_fd, Token::Shutdown.encode(), libc::POLLIN as u32)?;
        Ok(Worker {
            index,
            cfg,
            shared,
            engine,
            hosts: Slab::default(),
            doorbell,
            inbox,
            shutdown_fd,
            timers: Timers::new(),
            next_serial: 0,
            events: Vec::new(),
            keyed_events: Vec::new(),
            deferred_wakes: Vec::new(),
            next_sweep: Instant::now(),
            next_hot_poll: Instant::now(),
            next_publish: Instant::now(),
            stats_dirty: false,
            meter: Default::default(),
            awake: Default::default(),
        })
    }

    /// The worker loop, on its own thread; `running` is told once the
    /// thread holds every descriptor it keeps.
    pub fn run(mut self, running: std::sync::mpsc::Sender<()>) {
        if let Some(&cpu) = self.cfg.cpus.get(self.index) {
            if let Err(e) = sys::pin_to_cpu(cpu) {
                warn!(cpu, errno = e, "could not pin worker");
            }
        }
        self.meter.open();
        let _ = running.send(());
        drop(running);
        info!(
            worker = self.index,
            engine = self.engine.name(),
            poll = crate::config::poll_name(self.cfg.poll),
            "worker running"
        );
        // Wakes of host threads are made by the engine, with the pass's
        // batch (`submit_wakes`).
        tcps_proto::wake_batch::defer(true);
        let mut last_work = Instant::now();
        let mut next_engine_poll = Instant::now();
        // Whether the last pass found no work.
        let mut idle = false;
        while !self.shared.stopping.load(Ordering::Relaxed) {
            if self.upgrade_requested() {
                self.upgrade_pause();
            }
            let mut work = self.scan_channels();
            if work > 0 {
                // The threads sleeping for these completions are woken with
                // the pass's first submission (the engine harvest below, or
                // the flush at its end), not after the whole pass's work.
                self.wake_hosts();
            }
            if self.hosts.iter().any(|(_, h)| !h.polls_to_start.is_empty()) {
                // Sweep, then answer the polls (`calls::start_polls`).
                work += self.poll_engine(Some(Duration::ZERO));
                self.start_polls();
            }
            let now = Instant::now();
            work += self.poll_send_queues(now);
            if idle || now >= next_engine_poll {
                work += self.poll_engine(Some(Duration::ZERO));
                next_engine_poll = now + ENGINE_POLL_BUSY;
            }
            work += self.fire_timers(now);
            self.awake.put_idle_to_sleep(&mut self.hosts, now);
            // The threads (and doorbell sleepers) this pass's events woke
            // wake before the re-arms go in, not an enter (~1 µs) later;
            // also after a sleep: events handled while sleeping woke rings.
            self.wake_hosts();
            // Sockets re-armed in this pass are watched from now on.
            self.engine.flush();
            self.reap_doomed(false);
            self.stats_dirty |= work > 0;
            self.meter.pass(now, work > 0);
            if now >= self.next_publish {
                self.publish_stats(now);
            }
            idle = work == 0;
            if work > 0 {
                last_work = now;
                continue;
            }
            let spin = match self.cfg.poll {
                PollMode::Busy => true,
                PollMode::Adaptive => now.duration_since(last_work) < self.cfg.spin,
                PollMode::Block => false,
            };
            if spin && self.cfg.poll == PollMode::Adaptive {
                // Polite spinning: a thread that shares this core (a client,
                // the application) runs now if it is runnable; alone on the
                // core this returns at once.
                std::thread::yield_now();
            } else if spin {
                std::hint::spin_loop();
            } else {
                self.sleep();
                last_work = Instant::now();
            }
        }
        self.shutdown();
    }

    /// Publishes every host's counters and depths for `tcps stat`.
    fn publish_stats(&mut self, now: Instant) {
        if let Some(busy) = self.meter.sample(now) {
            for (_, h) in self.hosts.iter_mut() {
                let (cfg, cpus) = (&self.cfg.balance, &self.cfg.cpus);
                h.balance.update(cfg, cpus, h.pid, busy, now);
            }
        }
        self.shared.stats.publish(self.hosts.iter().map(|(_, h)| h));
        self.shared
            .stats
            .add_scan(&std::mem::take(&mut self.awake.counters));
        self.next_publish = now + crate::stats::PUBLISH_EVERY;
        self.stats_dirty = false;
    }

    /// Runs `f` on host `hkey` (if still attached) in its call context,
    /// `guarded` as `what`.
    fn for_host(&mut self, hkey: usize, what: &str, f: impl FnOnce(&mut Ctx<'_>, &mut Host)) {
        if let Some((host, mut cx)) = self.host_and_cx(hkey) {
            guarded(host, what, |h| f(&mut cx, h));
        }
    }

    /// A host and the context its calls run in, borrowed apart.
    fn host_and_cx(&mut self, hkey: usize) -> Option<(&mut Host, Ctx<'_>)> {
        let Worker {
            hosts,
            engine,
            cfg,
            timers,
            next_serial,
            shared,
            ..
        } = self;
        let host = hosts.get_mut(hkey)?;
        Some((
            host,
            Ctx {
                engine: engine.as_mut(),
                cfg,
                shared,
                hkey,
                timers,
                next_serial,
            },
        ))
    }

    /// Takes and executes requests from the channels of every awake host
    /// (`scan`); returns how many.
    fn scan_channels(&mut self) -> usize {
        let mut handled = 0;
        let (mut hosts, mut channels) = (0u64, 0u64);
        for i in 0..self.awake.keys.len() {
            let hkey = self.awake.keys[i];
            let Some((host, mut cx)) = self.host_and_cx(hkey) else {
                continue;
            };
            if host.doomed.is_some() {
                continue;
            }
            let (n, looked) = scan::scan_host(&mut cx, host);
            handled += n;
            hosts += 1;
            channels += u64::from(looked);
        }
        let c = &mut self.awake.counters;
        c.passes += 1;
        c.hosts_looked += hosts;
        c.channels_looked += channels;
        handled
    }

    /// The pass's wake-ups, once each however many events caused them: the
    /// host threads sleeping on channels that got completions (once per
    /// channel), and the host doorbell of every host a ring or queue
    /// publish found a doorbell sleeper of.
    fn wake_hosts(&mut self) -> bool {
        let mut now = None;
        for (_, h) in self.hosts.iter_mut() {
            if !h.accept_wakes.is_empty() {
                let now = *now.get_or_insert_with(Instant::now);
                calls::eager::acceptwake::due(h, now);
            }
            if h.remote && !h.wakes_owed.is_empty() {
                // Nobody sleeps on a remote host's copy: its fabric pump is
                // told instead, by doorbell 0 (`fabric::pump::ServerPump::init`).
                h.wakes_owed.clear();
                h.stats.bells_owed |= 1;
            }
            if !h.wakes_owed.is_empty() {
                calls::wake_owed(h);
            }
            if h.stats.bells_owed != 0 {
                let owed = std::mem::take(&mut h.stats.bells_owed);
                h.stats.doorbell_rings += u64::from(h.host_doorbell.ring(owed));
            }
        }
        self.submit_wakes()
    }

    /// Hands the futex wakes this thread deferred (completions, ring and
    /// queue publishes) to the engine: queued with the pass's batch, made
    /// by its next submission (`flush`, `wait`). Called before every wait
    /// and before a host's region may be unmapped. Whether there were any.
    fn submit_wakes(&mut self) -> bool {
        tcps_proto::wake_batch::take(&mut self.deferred_wakes);
        if self.deferred_wakes.is_empty() {
            return false;
        }
        self.engine.wake_futexes(&self.deferred_wakes);
        true
    }

    /// Starts the polls the hosts asked for in this pass.
    fn start_polls(&mut self) {
        for hkey in 0..self.hosts.key_bound() {
            let Some((host, mut cx)) = self.host_and_cx(hkey) else {
                continue;
            };
            if host.doomed.is_none() && !host.polls_to_start.is_empty() {
                guarded(host, "poll", |h| calls::start_polls(&mut cx, h));
            }
        }
    }

    /// Takes new asynchronous sends from the hosts' hot send queues (and,
    /// every `SWEEP_EVERY`, from all bound ones); returns how many.
    fn poll_send_queues(&mut self, now: Instant) -> usize {
        let sweep = now >= self.next_sweep;
        if sweep {
            self.next_sweep = now + SWEEP_EVERY;
            // Expired fork snapshots close their descriptors on time.
            crate::inherit::sweep();
        }
        if !sweep && now < self.next_hot_poll {
            return 0;
        }
        self.next_hot_poll = now + HOT_POLL_EVERY;
        let mut work = 0;
        let mut queues_swept = 0;
        for hkey in 0..self.hosts.key_bound() {
            let Some((host, mut cx)) = self.host_and_cx(hkey) else {
                continue;
            };
            if host.doomed.is_some() {
                continue;
            }
            if !host.hot.is_empty() || !host.cooling.is_empty() {
                work += guarded(host, "send queues", |h| calls::poll_queues(&mut cx, h, now))
                    .unwrap_or(0);
            }
            if sweep && host.doomed.is_none() {
                let looked = host.queues_swept;
                work += guarded(host, "sweep", |h| calls::sweep(&mut cx, h, now)).unwrap_or(0);
                queues_swept += host.queues_swept - looked;
            }
        }
        if sweep {
            self.awake.counters.sweeps += 1;
            self.awake.counters.queues_swept += queues_swept;
        }
        work
    }

    /// Collects engine events and handles them; returns how many.
    fn poll_engine(&mut self, timeout: Option<Duration>) -> usize {
        self.submit_wakes();
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        if let Err(e) = self.engine.wait(timeout, &mut events) {
            warn!(error = %e, "engine wait failed");
        }
        let n = events.len();
        self.arrival_order(&mut events);
        for ev in &events {
            self.handle_event(*ev);
        }
        self.events = events;
        n
    }

    /// Puts a harvest's socket events in the order their data arrived
    /// (the kernel's receive timestamps of the first unread bytes; events
    /// without one first, as they came). io_uring completes polls out of
    /// that order, and each event is published to its host at once, so a
    /// host could otherwise see a later arrival before an earlier one on
    /// another socket (issue 14 item 7). One peek per socket event, and
    /// only in harvests of two or more.
    fn arrival_order(&mut self, events: &mut [Event]) {
        if events.len() < 2 {
            return;
        }
        // The worker's own scratch vector: no allocation per harvest.
        let mut keyed = std::mem::take(&mut self.keyed_events);
        let key = |ev: &Event| -> u64 {
            let Some(Token::Socket { host, sock, .. }) = Token::decode(ev.token) else {
                return 0;
            };
            if ev.revents & libc::POLLIN as u32 == 0 {
                return 0;
            }
            self.hosts
                .get(host)
                .and_then(|h| h.sockets.get(sock))
                .and_then(|s| sys::arrival_ns(s.fd.as_raw_fd()))
                .unwrap_or(0)
        };
        keyed.clear();
        keyed.extend(events.iter().enumerate().map(|(i, e)| (key(e), i, *e)));
        // Unstable, by (arrival, position): as stable as a stable sort,
        // without its scratch buffer.
        keyed.sort_unstable_by_key(|k| (k.0, k.1));
        for (e, k) in events.iter_mut().zip(&keyed) {
            *e = k.2;
        }
        self.keyed_events = keyed;
    }

    fn handle_event(&mut self, ev: Event) {
        match Token::decode(ev.token) {
            Some(Token::Socket {
                host: hkey,
                sock,
                gen,
                seq,
            }) => {
                self.for_host(hkey, "socket event", |cx, h| {
                    calls::on_socket_ready(cx, h, sock, gen, seq)
                });
            }
            Some(Token::Sent {
                host: hkey,
                sock,
                gen,
                seq,
            }) => {
                self.for_host(hkey, "send completion", |cx, h| {
                    calls::on_sent(cx, h, sock, gen, seq, ev.res)
                });
            }
            Some(Token::Received {
                host: hkey,
                sock,
                gen,
                seq,
            }) => {
                self.for_host(hkey, "receive completion", |cx, h| {
                    calls::on_received(cx, h, sock, gen, seq, ev.res)
                });
            }
            Some(Token::Control { host: hkey }) => self.on_control(hkey),
            Some(Token::HostBell { host: hkey }) => {
                // The host rang: its requests are taken by the next scan
                // (a dormant host is awake again). Only this host holds
                // this eventfd, so draining it (or not) concerns no other
                // host.
                self.awake.wake(&mut self.hosts, hkey);
                if let Some(host) = self.hosts.get(hkey) {
                    let fd = host.doorbell.as_raw_fd();
                    sys::eventfd_drain(fd);
                    let token = Token::HostBell { host: hkey }.encode();
                    if let Err(e) = self.engine.arm(fd, token, libc::POLLIN as u32) {
                        warn!(host = host.id, error = %e, "cannot watch a host's doorbell");
                    }
                }
            }
            Some(Token::Doorbell) => {
                sys::eventfd_drain(self.doorbell.as_raw_fd());
                self.adopt_hosts();
                let _ = self.engine.arm(
                    self.doorbell.as_raw_fd(),
                    Token::Doorbell.encode(),
                    libc::POLLIN as u32,
                );
            }
            Some(Token::Shutdown) => self.shared.stopping.store(true, Ordering::Relaxed),
            None => debug!(token = ev.token, "unknown engine token"),
        }
    }

    /// The host's control socket is readable (a registration message, or
    /// it hung up or broke protocol) or writable again (its outbox).
    fn on_control(&mut self, hkey: usize) {
        let Some((host, mut cx)) = self.host_and_cx(hkey) else {
            return;
        };
        let fd = host.control.as_raw_fd();
        let verdict = guarded(host, "control message", |h| read_control(h, &mut cx))
            .unwrap_or_else(|| Some("internal error".to_string()));
        match verdict {
            None => {
                // Writable is wanted only while replies wait.
                let mut mask = libc::POLLIN as u32;
                if !host.outbox.is_empty() {
                    mask |= libc::POLLOUT as u32;
                }
                let _ = cx
                    .engine
                    .arm(fd, Token::Control { host: hkey }.encode(), mask);
            }
            Some(why) => {
                if host.doomed.is_none() {
                    host.doomed = Some(why);
                }
                self.reap_doomed(false);
            }
        }
    }

    fn adopt_hosts(&mut self) {
        let new: Vec<NewHost> = match self.inbox.hosts.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => return,
        };
        for nh in new {
            if self.hosts.len() >= MAX_HOSTS_PER_WORKER {
                warn!("worker full; dropping host");
                self.shared.host_gone(nh.uid);
                continue;
            }
            let host = Host::new(nh, self.cfg.max_pull_bytes_per_host);
            let (id, pid) = (host.id, host.pid);
            self.install(host);
            debug!(worker = self.index, host = id, pid, "host adopted");
        }
    }

    /// Takes `host` on: its key; its control socket and doorbell watched.
    fn install(&mut self, host: Host) -> usize {
        let control = host.control.as_raw_fd();
        let bell = host.doorbell.as_raw_fd();
        // Replies never block the worker (see `send_reply`).
        if let Err(e) = sys::set_nonblocking(control) {
            warn!(
                errno = e,
                "cannot make a host's control socket non-blocking"
            );
        }
        let hkey = self.hosts.insert(host);
        self.awake.adopted(hkey);
        for (fd, token) in [
            (control, Token::Control { host: hkey }),
            (bell, Token::HostBell { host: hkey }),
        ] {
            if let Err(e) = self.engine.arm(fd, token.encode(), libc::POLLIN as u32) {
                warn!(error = %e, "cannot watch a host's control socket or doorbell");
            }
        }
        if let Some(h) = self.hosts.get(hkey) {
            self.shared.stats.publish(std::iter::once(h));
        }
        hkey
    }

    fn fire_timers(&mut self, now: Instant) -> usize {
        let mut fired = 0;
        while let Some(std::cmp::Reverse((when, hkey, serial, key))) = self.timers.peek().copied() {
            if when > now {
                break;
            }
            self.timers.pop();
            if let Some((host, mut cx)) = self.host_and_cx(hkey) {
                if host.doomed.is_none() {
                    guarded(host, "timer", |h| calls::on_timer(&mut cx, h, serial, key));
                }
                fired += 1;
            }
        }
        fired
    }

    /// Sleeps until a host rings, an engine event, or the next timer.
    fn sleep(&mut self) {
        // `server_sleeping = 1` everywhere, one fence; then re-check every
        // awake host's channels (the lost wake-up handshake, `scan`).
        let mut pending = self.awake.announce_sleep(&self.hosts);
        // Hot send queues go cold, so their hosts kick (and ring) again; a
        // queue's second look bounds the sleep.
        let now = Instant::now();
        let mut wake_at = self
            .timers
            .peek()
            .map(|std::cmp::Reverse((when, ..))| *when);
        for hkey in 0..self.hosts.key_bound() {
            let Some(h) = self.hosts.get_mut(hkey) else {
                continue;
            };
            let (queued, recheck) = calls::prepare_sleep(h, now);
            pending |= queued;
            // Acceptors owed a wake by a deadline (`acceptwake`).
            let owed = calls::eager::acceptwake::due(h, now);
            for at in recheck.into_iter().chain(owed) {
                wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
            }
        }
        // Sockets to re-arm at the next sweep: wake for it.
        if self.hosts.iter().any(|(_, h)| !h.rearm_later.is_empty()) {
            wake_at = Some(wake_at.map_or(self.next_sweep, |w| w.min(self.next_sweep)));
        }
        // Counters changed since the last publication: publish them on time.
        if self.stats_dirty {
            wake_at = Some(wake_at.map_or(self.next_publish, |w| w.min(self.next_publish)));
        }
        if !pending {
            let timeout = match wake_at {
                Some(when) => when
                    .saturating_duration_since(Instant::now())
                    .min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            self.stats_dirty |= self.poll_engine(Some(timeout)) > 0;
        }
        scan::Awake::end_sleep(&self.hosts);
    }

    fn shutdown(&mut self) {
        // Wakes at once from here: every region is unmapped in this loop.
        self.submit_wakes();
        self.engine.flush();
        tcps_proto::wake_batch::defer(false);
        for hkey in self.hosts.keys() {
            if let Some(mut host) = self.hosts.remove(hkey) {
                host.region
                    .header()
                    .server_alive
                    .store(0, Ordering::Release);
                // Wake every sleeping host thread: they see server_alive == 0.
                for ch in 0..host.layout.n_channels {
                    if let Some(c) = host.region.channel(ch) {
                        tcps_proto::ring::ServerCursor::wake_host(&c);
                    }
                }
                calls::close_all(self.engine.as_mut(), &self.shared, &mut host);
                self.shared.stats.detach(&host);
                self.shared.host_gone(host.uid);
            }
        }
        let _ = self.shutdown_fd;
        info!(worker = self.index, "worker stopped");
    }
}
