//! Dynamic host/server balancing (`docs/ARCHITECTURE.md` "Balancing").
//!
//! Every [`WINDOW`] a worker measures its own load (the share of the
//! window it spent in loop passes that found work or waiting for its core:
//! [`Meter`]) and each of its hosts' (utime + stime of `/proc/<pid>/stat`
//! and its threads' run delay over the window, against the cores the host
//! may run on that no worker is pinned to). From the
//! two it moves each host's *direct share* — the fraction of new
//! connections handed to the host as kernel sockets instead of being
//! offloaded — by [`STEP`] percent at most per window, with a dead band
//! between the thresholds so the share does not flap. Each new connection
//! on a listener that allows it (`TCPS_BALANCE`, default 1) is decided on
//! its own (an error-diffusion counter, so a 30 % share hands out 3 of
//! every 10 connections, evenly spread); connections already placed stay
//! where they are.
//!
//! A direct connection waits here, under a handle, until its host takes
//! the kernel socket over its control socket (`ControlMsg::Direct`, with
//! SCM_RIGHTS): descriptors cannot travel through shared memory.

use crate::config::BalanceConfig;
use crate::procstat::{read_at_start, schedstat_delay, ProcStat};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// How often the share may move.
pub const WINDOW: Duration = Duration::from_millis(250);
/// Percent points the share moves per window.
pub const STEP: u8 = 10;
/// A side is "the bottleneck" when it is at least this busy (percent) ...
const BUSY: u8 = 40;
/// ... and at least this many points busier than the other side, which
/// then has idle CPU to take work over. Within the gap the share stays
/// (the dead band).
const GAP: u8 = 30;
/// Both sides below this: the load is light, offloading (the default)
/// comes back.
const LIGHT: u8 = 25;
/// Direct connections a host may leave untaken; beyond, new ones are
/// offloaded (a host that never takes them cannot pile up descriptors).
const MAX_PENDING: usize = 1024;
/// A direct connection its host has not taken after this is closed.
const PENDING_TTL: Duration = Duration::from_secs(10);

/// The generation an accept ring's list of published connections gives a
/// direct connection (whose "id" is its handle): no socket has it
/// (`token::GEN_MASK`), so the list's other users skip it, and closing the
/// listener closes the direct connections the host never took.
pub const DIRECT_GEN: u16 = u16::MAX;

/// Why the share is what it is (`tcps stat`, metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reason {
    /// No window measured yet.
    #[default]
    Start,
    /// `tcps server --balance off`.
    Off,
    /// The host does not take direct connections (e.g. the native API).
    HostCannot,
    /// `--balance-force-direct` (a testing aid).
    Forced,
    /// The server is the bottleneck and the host has idle CPU: share up.
    ServerBusy,
    /// The host is the bottleneck and the server has room: share down.
    HostBusy,
    /// Neither is busy: back to offloading (share down).
    Light,
    /// Both busy, or in the dead band: the share stays.
    Steady,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Off => "off",
            Reason::HostCannot => "host-cannot",
            Reason::Forced => "forced",
            Reason::ServerBusy => "server-busy",
            Reason::HostBusy => "host-busy",
            Reason::Light => "light",
            Reason::Steady => "steady",
        }
    }
}

/// What `tcps stat` shows of a host's balancing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Percent of new connections handed to the host directly.
    pub share_pct: u8,
    pub reason: Reason,
    /// The worker's and the host's CPU over the last window, percent.
    pub server_busy_pct: u8,
    pub host_busy_pct: u8,
    /// The host said it takes direct connections.
    pub takes_direct: bool,
    /// Direct connections waiting for the host to take them.
    pub pending: u32,
}

/// The direction of one step, from the worker's load and the host's
/// (percent): towards the side with idle CPU when the other is the
/// bottleneck, back to offloading when both are lightly loaded.
pub fn step(server: u8, host: u8) -> (i8, Reason) {
    if server >= BUSY && server >= host.saturating_add(GAP) {
        (1, Reason::ServerBusy)
    } else if host >= BUSY && host >= server.saturating_add(GAP) {
        (-1, Reason::HostBusy)
    } else if server < LIGHT && host < LIGHT {
        (-1, Reason::Light)
    } else {
        (0, Reason::Steady)
    }
}

/// A worker's load: the share of wall time spent in passes that found
/// work, plus the share it waited, runnable, for its core (scheduler run
/// delay: its core is taken by others, e.g. clients pinned there), over
/// each window. Not its CPU time: an adaptive worker spins (yielding) for
/// a while after each piece of work, so a worker serving a steady trickle
/// would look saturated.
#[derive(Default)]
pub struct Meter {
    /// The previous pass: when, and whether it found work.
    last_pass: Option<(Instant, bool)>,
    busy: Duration,
    window_start: Option<Instant>,
    /// The worker thread's run delay (ns) at the window's start.
    delay_start: u64,
    /// Its schedstat file, open from [`open`](Self::open) on, and its
    /// text (the buffer kept).
    schedstat: Option<std::fs::File>,
    text: String,
}

impl Meter {
    /// A pass of the worker loop at `now` found work or not. The time
    /// since the previous pass counts as busy if that one found work.
    #[inline]
    pub fn pass(&mut self, now: Instant, work: bool) {
        if let Some((t, true)) = self.last_pass {
            self.busy += now.saturating_duration_since(t);
        }
        self.last_pass = Some((now, work));
    }

    /// Opens the worker thread's schedstat file (called on that thread,
    /// before the server says it listens). Kept open and read again from
    /// its start at each sample: an idle server's descriptors stay the
    /// same set (one opened and closed every window would show, for a
    /// moment, in any count of them; the fault matrix counts them), and a
    /// sample costs one system call instead of three.
    pub fn open(&mut self) {
        self.schedstat = std::fs::File::open("/proc/thread-self/schedstat").ok();
    }

    /// The worker thread's run delay (ns) now, 0 if it cannot be read.
    fn run_delay(&mut self) -> u64 {
        let Some(f) = &self.schedstat else {
            return 0;
        };
        read_at_start(f, &mut self.text)
            .and_then(|()| schedstat_delay(&self.text))
            .unwrap_or(0)
    }

    /// The load in percent since the last sample, once a window has
    /// passed (called on the worker's own thread).
    pub fn sample(&mut self, now: Instant) -> Option<u8> {
        let delay = self.run_delay();
        let Some(t0) = self.window_start else {
            self.window_start = Some(now);
            self.busy = Duration::ZERO;
            self.delay_start = delay;
            return None;
        };
        let wall = now.saturating_duration_since(t0);
        if wall < WINDOW {
            return None;
        }
        let busy = std::mem::take(&mut self.busy).as_secs_f64();
        let waited = delay.saturating_sub(self.delay_start) as f64 / 1e9;
        self.window_start = Some(now);
        self.delay_start = delay;
        Some(percent((busy + waited) / wall.as_secs_f64()))
    }
}

fn percent(frac: f64) -> u8 {
    (frac * 100.0).round().clamp(0.0, 100.0) as u8
}

/// Cores process `pid` may run on that no worker is pinned to (at least 1).
fn host_cores(pid: u32, worker_cpus: &[usize]) -> f64 {
    // SAFETY: a zeroed cpu_set_t is valid; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: set is a writable cpu_set_t of `size` bytes.
    let ok = unsafe { libc::sched_getaffinity(pid as libc::pid_t, size, &mut set) } == 0;
    if !ok {
        return 1.0;
    }
    let mut n = 0usize;
    for cpu in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: cpu < CPU_SETSIZE.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            n += 1;
        }
    }
    // Unpinned workers (`--cpus` empty: one) take a core of the host's too.
    let taken = if worker_cpus.is_empty() {
        1
    } else {
        // SAFETY: each index is checked against CPU_SETSIZE.
        worker_cpus
            .iter()
            .filter(|&&c| c < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(c, &set) })
            .count()
    };
    n.saturating_sub(taken).max(1) as f64
}

/// One host's balancing state (kept in `Host`).
#[derive(Default)]
pub struct HostBalance {
    view: View,
    /// Error diffusion: percent points owed to direct.
    credit: u32,
    /// The host's CPU ticks and run delay (ns) at the last window.
    host_last: Option<(u64, u64, Instant)>,
    /// Direct connections not yet taken: handle → (socket, since).
    pending: HashMap<u32, (OwnedFd, Instant)>,
    next_handle: u32,
    /// The host process's /proc reader (buffers kept).
    proc_stat: ProcStat,
}

impl HostBalance {
    pub fn view(&self) -> View {
        let mut v = View {
            pending: self.pending.len() as u32,
            ..self.view
        };
        if !v.takes_direct && v.reason == Reason::Start {
            v.reason = Reason::HostCannot;
        }
        v
    }

    /// `ControlMsg::Direct { handle: 0 }`: the host takes direct
    /// connections (shown at once, before the next window).
    pub fn set_takes_direct(&mut self, cfg: &BalanceConfig) {
        self.view.takes_direct = true;
        (self.view.share_pct, self.view.reason) = match (cfg.on, cfg.force_direct_pct) {
            (false, _) => (0, Reason::Off),
            (true, Some(f)) => (f.min(100), Reason::Forced),
            (true, None) => (self.view.share_pct, Reason::Start),
        };
    }

    /// A window passed: the worker was `server_busy` percent busy. Measures
    /// the host and moves the share one step at most.
    pub fn update(
        &mut self,
        cfg: &BalanceConfig,
        worker_cpus: &[usize],
        pid: u32,
        server_busy: u8,
        now: Instant,
    ) {
        self.pending
            .retain(|_, (_, since)| now.saturating_duration_since(*since) < PENDING_TTL);
        let mut host_busy = self.view.host_busy_pct;
        if let Some(ticks) = self.proc_stat.ticks(pid) {
            let delay = self.proc_stat.run_delay_ns(pid, now);
            if let Some((t0, d0, at)) = self.host_last {
                let wall = now.saturating_duration_since(at).as_secs_f64();
                // SAFETY: sysconf has no preconditions.
                let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
                let cpu = ticks.saturating_sub(t0) as f64 / hz;
                // Waiting for a CPU is load too: the host's cores are taken.
                let waited = delay.saturating_sub(d0) as f64 / 1e9;
                if wall > 0.0 {
                    host_busy = percent((cpu + waited) / wall / host_cores(pid, worker_cpus));
                }
            }
            self.host_last = Some((ticks, delay, now));
        }
        // Each load averaged with the previous window's (a 250 ms window
        // on a shared machine is noisy; one outlier moves nothing).
        let smooth = |old: u8, new: u8| ((u16::from(old) + u16::from(new)) / 2) as u8;
        let server = smooth(self.view.server_busy_pct, server_busy);
        let host = smooth(self.view.host_busy_pct, host_busy);
        self.apply(cfg, server, host);
    }

    /// One window's step from the two loads (percent).
    fn apply(&mut self, cfg: &BalanceConfig, server_busy: u8, host_busy: u8) {
        self.view.server_busy_pct = server_busy;
        self.view.host_busy_pct = host_busy;
        let (share, reason) = if !cfg.on {
            (0, Reason::Off)
        } else if !self.view.takes_direct {
            (0, Reason::HostCannot)
        } else if let Some(f) = cfg.force_direct_pct {
            (f.min(100), Reason::Forced)
        } else {
            let (dir, why) = step(server_busy, host_busy);
            let s = i16::from(self.view.share_pct) + i16::from(dir) * i16::from(STEP);
            (s.clamp(0, 100) as u8, why)
        };
        self.view.share_pct = share;
        self.view.reason = reason;
    }

    /// A new connection on a listener whose `TCPS_BALANCE` is `allowed`:
    /// whether it goes to the host directly.
    pub fn decide(&mut self, cfg: &BalanceConfig, allowed: bool) -> bool {
        if !cfg.on || !allowed || !self.view.takes_direct {
            return false;
        }
        let share = cfg.force_direct_pct.unwrap_or(self.view.share_pct).min(100);
        if share == 0 || self.pending.len() >= MAX_PENDING {
            return false;
        }
        self.credit += u32::from(share);
        if self.credit >= 100 {
            self.credit -= 100;
            true
        } else {
            false
        }
    }

    /// Keeps direct connection `fd` until the host takes it; its handle
    /// (never 0).
    pub fn hand_over(&mut self, fd: OwnedFd, now: Instant) -> u32 {
        loop {
            self.next_handle = self.next_handle.wrapping_add(1);
            if self.next_handle != 0 && !self.pending.contains_key(&self.next_handle) {
                break;
            }
        }
        self.pending.insert(self.next_handle, (fd, now));
        self.next_handle
    }

    /// The host takes direct connection `handle`.
    pub fn claim(&mut self, handle: u32) -> Option<OwnedFd> {
        self.pending.remove(&handle).map(|(fd, _)| fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(on: bool, force: Option<u8>) -> BalanceConfig {
        BalanceConfig {
            on,
            force_direct_pct: force,
        }
    }

    #[test]
    fn steps_have_a_dead_band() {
        assert_eq!(step(95, 20), (1, Reason::ServerBusy));
        assert_eq!(step(70, 13), (1, Reason::ServerBusy), "host idle");
        assert_eq!(step(95, 90), (0, Reason::Steady), "both busy: stay");
        assert_eq!(step(20, 95), (-1, Reason::HostBusy));
        assert_eq!(step(10, 10), (-1, Reason::Light));
        // Within the gap, or too little load to call a bottleneck: stay.
        assert_eq!(step(65, 40), (0, Reason::Steady));
        assert_eq!(step(40, 65), (0, Reason::Steady));
        assert_eq!(step(35, 0), (0, Reason::Steady));
        assert_eq!(step(30, 20), (0, Reason::Steady));
    }

    #[test]
    fn a_forced_share_is_spread_evenly() {
        let c = cfg(true, Some(30));
        let mut b = HostBalance::default();
        b.set_takes_direct(&c);
        let picks: Vec<bool> = (0..10).map(|_| b.decide(&c, true)).collect();
        assert_eq!(picks.iter().filter(|&&d| d).count(), 3);
        assert!(!picks[0] && !picks[1], "spread, not bunched: {picks:?}");
        // A listener that opted out, or a host that cannot, gets none.
        assert!(!(0..10).any(|_| b.decide(&c, false)));
        let mut b = HostBalance::default();
        assert!(!(0..10).any(|_| b.decide(&c, true)));
        // Off wins over the forced share.
        let off = cfg(false, Some(100));
        let mut b = HostBalance::default();
        b.set_takes_direct(&off);
        assert_eq!(b.view().reason, Reason::Off);
        assert!(!(0..10).any(|_| b.decide(&off, true)));
    }

    #[test]
    fn direct_gen_is_no_socket_generation() {
        const { assert!(DIRECT_GEN > crate::token::GEN_MASK) };
    }

    #[test]
    fn handles_are_claimed_once() {
        let mut b = HostBalance::default();
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let h = b.hand_over(fd, Instant::now());
        assert_ne!(h, 0);
        assert_eq!(b.view().pending, 1);
        assert!(b.claim(h).is_some());
        assert!(b.claim(h).is_none());
    }

    #[test]
    fn the_share_moves_one_step_per_window() {
        let c = cfg(true, None);
        let mut b = HostBalance::default();
        b.set_takes_direct(&c);
        let share = |b: &HostBalance| b.view().share_pct;
        // Server the bottleneck, host idle: up 10 points a window, to 100.
        for i in 1..=12u8 {
            b.apply(&c, 95, 30);
            assert_eq!(share(&b), (i * STEP).min(100));
            assert_eq!(b.view().reason, Reason::ServerBusy);
        }
        // In the dead band it stays, whichever way it came.
        for (srv, host) in [(70, 45), (95, 90), (35, 60)] {
            b.apply(&c, srv, host);
            assert_eq!((share(&b), b.view().reason), (100, Reason::Steady));
        }
        // The host the bottleneck, the server with room: down again.
        b.apply(&c, 30, 95);
        assert_eq!((share(&b), b.view().reason), (90, Reason::HostBusy));
        for _ in 0..3 {
            b.apply(&c, 10, 10);
        }
        assert_eq!((share(&b), b.view().reason), (60, Reason::Light));
        // Measured for real: the worker's own process as the host.
        b.update(&c, &[], std::process::id(), 100, Instant::now());
        b.update(
            &cfg(false, None),
            &[],
            std::process::id(),
            100,
            Instant::now(),
        );
        assert_eq!((share(&b), b.view().reason), (0, Reason::Off));
    }

    #[test]
    fn the_meter_counts_passes_with_work() {
        let mut m = Meter::default();
        let t = Instant::now();
        assert_eq!(m.sample(t), None);
        let ms = Duration::from_millis;
        // 100 ms of work, then 200 ms idle.
        m.pass(t, true);
        m.pass(t + ms(100), false);
        m.pass(t + ms(300), false);
        assert_eq!(m.sample(t + ms(200)), None, "not a window yet");
        // (Plus this thread's wait for a CPU in real time meanwhile: tiny.)
        assert!(matches!(m.sample(t + ms(400)), Some(25..=30)));
        assert!(matches!(m.sample(t + ms(700)), Some(0..=5)));
    }

    #[test]
    fn reads_its_own_cores() {
        assert!(host_cores(std::process::id(), &[]) >= 1.0);
    }
}
