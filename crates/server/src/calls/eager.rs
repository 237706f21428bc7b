//! Process-ahead at the server (`docs/PROTOCOL.md` §10): receive ahead into
//! a socket's byte ring (*push*) or into a buffer of the server's own
//! (*pull*), and accept ahead into a listener's accept ring.
//!
//! Everything is driven by readiness: a socket that reads (accepts) ahead
//! stays armed for POLLIN in the engine; when it is readable the worker
//! `recv(2)`s straight into the free span of the ring (no intermediate
//! buffer) or `accept4`s and writes one `AcceptRecord` per connection, then
//! publishes `tail` once. A full ring pauses (`paused = 1`, disarmed) until
//! the host kicks (`Op::RecvKick`) or the periodic sweep sees room.
//!
//! Everything the host writes (`head`, `host_waiting`) is untrusted: `head`
//! is clamped to `[consumed, tail]` with [`recvq::used`] before use.

use super::blocking::rearm;
use super::{asyncq, check_quota, insert_accepted, Ctx, Res};
use crate::config::{EagerPolicy, EagerRecv};
use crate::host::Host;
use crate::sys;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tcps_proto::futex;
use tcps_proto::recvq::{
    self, AcceptRecord, RecvRingCtl, ACCEPT_ERROR, ACCEPT_RECORD_SIZE, END_EOF, END_ERROR,
    END_STOPPED, KIND_ACCEPT, KIND_BYTES, KIND_FREE, RECV_MODE_NONE, RECV_MODE_PULL,
    RECV_MODE_RING, SETUP_RECV_PLAIN, SETUP_RECV_RING, SETUP_SENDQ, SOL_TCPS, TCPS_EAGER_ACCEPT,
    TCPS_EAGER_RECV, TCPS_EAGER_RECV_SIZE, TCPS_SETUP_WITH_ACCEPT,
};
use tcps_proto::region::RecvRingRef;
use tracing::debug;

/// Smallest and largest pull buffer (`TCPS_EAGER_RECV_SIZE`).
pub const MIN_RECV_SIZE: u32 = 4096;
pub const MAX_RECV_SIZE: u32 = 16 << 20;

/// A pull buffer's first allocation; it doubles as bytes arrive, up to the
/// socket's `recv_size` and within the host's budget ([`PullAccount`]).
const PULL_FIRST: usize = 16 << 10;
/// While a pull buffer has nothing allocated the server reads into a stack
/// buffer of this size first: memory is allocated only for bytes that
/// arrived (an idle pull socket holds none).
const PULL_PROBE: usize = 4096;

/// What a socket does ahead of its host.
#[derive(Debug, Default)]
pub enum Ahead {
    /// Nothing: requests go to the kernel.
    #[default]
    None,
    /// Byte ring `sid` is bound (push).
    Bytes(ByteRing),
    /// Accept ring `sid` is bound (a listener).
    Accept(AcceptRing),
    /// Reading ahead into a buffer at the server (pull).
    Pull(PullBuf),
}

impl Ahead {
    /// Whether POLLIN readiness of the socket comes from here rather than
    /// from the kernel. A pull socket that holds nothing and may not read
    /// ahead (its host's budget is spent) is served by the kernel meanwhile.
    pub fn is_active(&self) -> bool {
        match self {
            Ahead::None => false,
            Ahead::Pull(p) => !p.deferring(),
            _ => true,
        }
    }

    /// Whether the server wants to hear that the kernel socket is readable.
    pub fn wants_readable(&self) -> bool {
        match self {
            Ahead::None => false,
            Ahead::Bytes(b) => !b.paused && !b.ended,
            Ahead::Accept(a) => a.demanded && !a.paused,
            Ahead::Pull(p) => p.end.is_none() && !p.full() && !p.throttled,
        }
    }

    fn mode(&self) -> u64 {
        match self {
            Ahead::None => RECV_MODE_NONE,
            Ahead::Bytes(_) | Ahead::Accept(_) => RECV_MODE_RING,
            Ahead::Pull(_) => RECV_MODE_PULL,
        }
    }
}

/// The server's private state of a bound byte ring (never read back from
/// shared memory except the host's `head`, clamped).
#[derive(Debug, Default)]
pub struct ByteRing {
    /// What the host had consumed when the server last looked (clamped).
    consumed: u32,
    /// Bytes published.
    tail: u32,
    paused: bool,
    /// `end` was published: nothing more is read.
    ended: bool,
    /// What `end` was (kept here: the ring's copy is host-writable).
    end: Option<PullEnd>,
    kicks: u32,
}

/// The server's private state of a bound accept ring.
#[derive(Debug, Default)]
pub struct AcceptRing {
    consumed: u32,
    tail: u32,
    paused: bool,
    /// The host asked for connections (its first `RecvKick`).
    demanded: bool,
    kicks: u32,
    /// Connections published and maybe not yet taken: (position, socket id,
    /// generation), oldest first.
    published: VecDeque<(u32, u32, u16)>,
}

/// End of a pull socket's stream, delivered after the buffered data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullEnd {
    Eof,
    Error(i32),
}

/// The bytes a host's pull buffers hold allocated, against its budget
/// (`--max-pull-bytes-per-host`). Shared by the host's buffers: each one
/// adds what it allocates and gives it back when it shrinks or goes away
/// (whichever way its socket leaves: close, export, detach).
#[derive(Clone, Debug)]
pub struct PullAccount {
    held: Arc<AtomicUsize>,
    limit: usize,
}

impl PullAccount {
    pub fn new(limit: usize) -> PullAccount {
        PullAccount {
            held: Arc::default(),
            limit,
        }
    }

    /// Bytes allocated by the host's pull buffers.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Bytes the host may still allocate.
    fn room(&self) -> usize {
        self.limit.saturating_sub(self.held())
    }
}

/// A pull socket's read-ahead buffer: bytes `lo..hi` of `buf`. `buf` grows
/// as bytes arrive and is freed when drained; its allocation is counted in
/// the host's [`PullAccount`].
#[derive(Debug)]
pub struct PullBuf {
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
    /// Most bytes held (the socket's `recv_size`).
    cap: usize,
    end: Option<PullEnd>,
    /// The host's budget stopped this buffer growing: the socket reads
    /// ahead no more (bytes stay in the kernel, TCP's window holds the
    /// peer) until the sweep finds room again.
    throttled: bool,
    account: PullAccount,
    /// What this buffer added to `account` (its allocation).
    counted: usize,
}

impl PullBuf {
    fn new(cap: usize, account: PullAccount) -> PullBuf {
        PullBuf {
            buf: Vec::new(),
            lo: 0,
            hi: 0,
            cap,
            end: None,
            throttled: false,
            account,
            counted: 0,
        }
    }

    fn len(&self) -> usize {
        self.hi - self.lo
    }

    fn full(&self) -> bool {
        self.len() >= self.cap
    }

    /// Empty, open, and not allowed to read ahead: the kernel serves the
    /// socket meanwhile (recv requests and readiness go to it).
    fn deferring(&self) -> bool {
        self.throttled && self.len() == 0 && self.end.is_none()
    }

    /// Brings the account in line with the allocation.
    fn recount(&mut self) {
        let now = self.buf.capacity();
        if now >= self.counted {
            self.account
                .held
                .fetch_add(now - self.counted, Ordering::Relaxed);
        } else {
            self.account
                .held
                .fetch_sub(self.counted - now, Ordering::Relaxed);
        }
        self.counted = now;
    }

    /// Grows the allocation (doubling, from [`PULL_FIRST`]) by at least
    /// `need` bytes, within `cap` and the host's budget. False if the
    /// budget has no room for `need`.
    fn grow(&mut self, need: usize) -> bool {
        let len = self.buf.len();
        let target = (len * 2)
            .max(PULL_FIRST)
            .min(self.cap.max(self.hi + need))
            .max(len + need);
        let room = self.account.room();
        if room < need {
            return false;
        }
        let new_len = target.min(len + room);
        self.buf.reserve_exact(new_len - len);
        self.buf.resize(new_len, 0);
        self.recount();
        true
    }

    /// Drained: the allocation goes back to the host's budget.
    fn free_if_drained(&mut self) {
        if self.lo == self.hi {
            self.lo = 0;
            self.hi = 0;
            if self.counted > 0 {
                self.buf = Vec::new();
                self.recount();
            }
        }
    }
}

impl Drop for PullBuf {
    fn drop(&mut self) {
        self.account.held.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

/// With less free room than this a ring pauses (the host kicks after
/// consuming): `min(4096, size / 4)`.
pub fn pause_threshold(size: u32) -> u32 {
    4096.min(size / 4)
}

/// Most accept records outstanding in a ring of `size` bytes.
pub fn accept_capacity(accept_size: u32, size: u32) -> u32 {
    accept_size.min(size / ACCEPT_RECORD_SIZE).max(1)
}

/// Bytes a ring holds after the host stored `head`, and the new clamped
/// `consumed`. Accept rings count whole records: a `head` inside a record
/// leaves that record outstanding.
pub fn look(tail: u32, head: u32, consumed: u32, record: u32) -> (u32, u32) {
    let mut used = recvq::used(tail, head, consumed);
    if record > 1 {
        used = used.div_ceil(record) * record;
        used = used.min(tail.wrapping_sub(consumed));
    }
    (used, tail.wrapping_sub(used))
}

/// Whether a record published at `pos` is still in the window
/// `[consumed, tail)` (not yet taken by the host).
pub fn untaken(pos: u32, consumed: u32, tail: u32) -> bool {
    pos.wrapping_sub(consumed) < tail.wrapping_sub(consumed)
}

/// Stores `tail` (release), and the end of stream after it; fences and
/// wakes a host thread sleeping on `tail`.
fn publish(ctl: &RecvRingCtl, tail: u32, end: Option<Result<(), i32>>) {
    ctl.tail.store(tail, Ordering::Release);
    match end {
        Some(Ok(())) => ctl.end.store(END_EOF, Ordering::Release),
        Some(Err(e)) => {
            ctl.end_errno.store(e, Ordering::Relaxed);
            ctl.end.store(END_ERROR, Ordering::Release);
        }
        None => {}
    }
    // Dekker against the host's "host_waiting += 1; fence; load tail".
    fence(Ordering::SeqCst);
    if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
        futex::wake_all(&ctl.tail);
    }
}

/// Initialises ring `r`'s control block for a new owner.
fn init_ring(ring: &RecvRingRef<'_>, sid: u32, kind: u32) {
    let ctl = ring.ctl();
    ctl.head.store(0, Ordering::Relaxed);
    ctl.tail.store(0, Ordering::Relaxed);
    ctl.end.store(0, Ordering::Relaxed);
    ctl.end_errno.store(0, Ordering::Relaxed);
    ctl.paused.store(0, Ordering::Relaxed);
    ctl.kicks_seen.store(0, Ordering::Relaxed);
    ctl.kind.store(kind, Ordering::Relaxed);
    ctl.owner.store(sid + 1, Ordering::Release);
}

/// Binds byte ring `sid` to socket `sid` (push). False if it has none.
fn bind_bytes(host: &mut Host, sid: u32) -> bool {
    let Some(ring) = host.region.recv_ring(sid) else {
        return false;
    };
    let Some(s) = host.sockets.get_mut(sid as usize).filter(|s| !s.closing) else {
        return false;
    };
    init_ring(&ring, sid, KIND_BYTES);
    s.ahead = Ahead::Bytes(ByteRing::default());
    true
}

fn start_pull(host: &mut Host, sid: u32) {
    let account = host.pull.clone();
    if let Some(s) = host.socket_mut(sid) {
        s.ahead = Ahead::Pull(PullBuf::new(s.policy.recv_size as usize, account));
    }
}

/// Binds listener `sid`'s accept ring if its policy says so; its mode.
fn bind_accept(host: &mut Host, sid: u32) -> u64 {
    let Some(s) = host.socket(sid) else {
        return RECV_MODE_NONE;
    };
    if matches!(s.ahead, Ahead::Accept(_)) {
        return RECV_MODE_RING;
    }
    if !s.policy.accept || !matches!(s.ahead, Ahead::None) {
        return RECV_MODE_NONE;
    }
    let Some(ring) = host.region.recv_ring(sid) else {
        return RECV_MODE_NONE;
    };
    init_ring(&ring, sid, KIND_ACCEPT);
    if let Some(s) = host.socket_mut(sid) {
        s.ahead = Ahead::Accept(AcceptRing::default());
    }
    RECV_MODE_RING
}

/// `Op::Listen` succeeded: binds the accept ring per policy; the `aux`.
pub(super) fn on_listen(host: &mut Host, sid: u32) -> u64 {
    bind_accept(host, sid)
}

/// `Op::RecvBind`.
pub(super) fn recv_bind(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> Res {
    let s = host.socket_mut(sid).ok_or(libc::EBADF)?;
    if let Ahead::Accept(a) = &mut s.ahead {
        // A host whose non-blocking accept found the ring empty before it
        // ever asked for connections: accept ahead now, before answering,
        // so connections already in the backlog are in the ring when the
        // host looks again (the kernel's accept would have found them).
        a.demanded = true;
        advance(cx, host, sid);
        return Ok((RECV_MODE_RING as i64, 0));
    }
    if !matches!(s.ahead, Ahead::None) {
        return Ok((s.ahead.mode() as i64, 0));
    }
    let fd = s.fd.as_raw_fd();
    let policy = s.policy;
    if sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).unwrap_or(0) != 0 {
        if !s.readers.is_empty() {
            // Accept requests are parked: they keep the listener.
            return Ok((RECV_MODE_NONE as i64, 0));
        }
        return Ok((bind_accept(host, sid) as i64, 0));
    }
    if policy.recv == EagerRecv::Off || sys::getpeername(fd).is_err() {
        // Off, or not connected (yet): plain requests (the host may ask
        // again later).
        return Ok((RECV_MODE_NONE as i64, 0));
    }
    if !s.readers.is_empty() {
        return Err(libc::EBUSY);
    }
    let mode = start_receiving(host, sid, policy.recv);
    advance(cx, host, sid);
    Ok((mode as i64, 0))
}

/// Push with a ring (else pull) or pull; the mode set up.
fn start_receiving(host: &mut Host, sid: u32, recv: EagerRecv) -> u64 {
    match recv {
        EagerRecv::Off => RECV_MODE_NONE,
        EagerRecv::Push if bind_bytes(host, sid) => RECV_MODE_RING,
        EagerRecv::Push | EagerRecv::Pull => {
            start_pull(host, sid);
            RECV_MODE_PULL
        }
    }
}

/// A connection was just accepted (ahead or by an `Accept` request) into
/// socket `id`: it takes its listener's policy and, with setup on, gets its
/// send queue and receive ring bound and starts reading ahead. Returns the
/// `SETUP_*` flags.
pub(super) fn setup_accepted(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    id: u32,
    policy: EagerPolicy,
) -> u32 {
    let Some(s) = host.socket_mut(id) else {
        return 0;
    };
    s.policy = policy;
    if !policy.setup_with_accept {
        // Nothing is bound, but a mode that needs no ring is settled now:
        // pull reads ahead from the start, off never does.
        return match policy.recv {
            EagerRecv::Off => SETUP_RECV_PLAIN,
            EagerRecv::Pull => {
                start_pull(host, id);
                fill(cx, host, id);
                let hkey = cx.hkey;
                if let Some(s) = host.any_socket_mut(id) {
                    rearm(cx.engine, hkey, id, s);
                }
                SETUP_RECV_PLAIN
            }
            EagerRecv::Push => 0,
        };
    }
    let mut flags = 0;
    if let Some(sq) = host.region.send_queue(id) {
        // The host sends no AsyncBind: its side of the queue starts at 0 too.
        sq.ctl().head.store(0, Ordering::Relaxed);
        if asyncq::bind(host, id, id, 0, Instant::now()).is_ok() {
            flags |= SETUP_SENDQ;
        }
    }
    flags |= match start_receiving(host, id, policy.recv) {
        RECV_MODE_RING => SETUP_RECV_RING,
        _ => SETUP_RECV_PLAIN,
    };
    if policy.recv != EagerRecv::Off {
        fill(cx, host, id);
        let hkey = cx.hkey;
        if let Some(s) = host.any_socket_mut(id) {
            rearm(cx.engine, hkey, id, s);
        }
    }
    flags
}

/// Reads (accepts) ahead as far as the ring / buffer allows. Returns
/// whether anything was published (parked polls should look again).
pub(super) fn fill(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    let Some(s) = host.sockets.get(sid as usize) else {
        return false;
    };
    match s.ahead {
        Ahead::None => false,
        Ahead::Bytes(_) => fill_bytes(host, sid),
        Ahead::Pull(_) => fill_pull(host, sid),
        Ahead::Accept(_) => accept_ahead(cx, host, sid),
    }
}

/// Reads ahead, then lets parked polls look again and (re)arms the socket.
pub(super) fn advance(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    if fill(cx, host, sid) {
        recheck_pollers(host, sid);
    }
    if host
        .sockets
        .get(sid as usize)
        .is_some_and(|s| matches!(s.ahead, Ahead::Pull(_)) && !s.readers.is_empty())
    {
        super::blocking::drive_readers(cx, host, sid);
    }
    let hkey = cx.hkey;
    if let Some(s) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, s);
    }
}

fn recheck_pollers(host: &mut Host, sid: u32) {
    let pollers: Vec<usize> = host
        .sockets
        .get(sid as usize)
        .map(|s| s.pollers.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    for pkey in pollers {
        super::poll::recheck(host, pkey);
    }
}

fn note_paused(list: &mut Vec<u32>, sid: u32) {
    if !list.contains(&sid) {
        list.push(sid);
    }
}

// Both fills stop at a short read: a `recv` that returned less than it
// asked for emptied the socket's receive queue, so one more `recv` would
// only fetch EAGAIN (a system call per readiness event saved). Nothing is
// lost: the socket is re-armed, and a one-shot arm on a socket with data
// (or a FIN) already queued fires at once.

/// Most bytes read into one ring per readiness event, so one busy socket
/// cannot hold the worker (it stays armed and is served again).
const FILL_BUDGET_RINGS: u32 = 2;

fn fill_bytes(host: &mut Host, sid: u32) -> bool {
    let Host {
        region,
        sockets,
        stats,
        ahead_paused,
        ..
    } = host;
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return false;
    };
    let fd = sock.fd.as_raw_fd();
    let Ahead::Bytes(st) = &mut sock.ahead else {
        return false;
    };
    if st.paused || st.ended {
        return false;
    }
    let Some(ring) = region.recv_ring(sid) else {
        return false;
    };
    let ctl = ring.ctl();
    let size = ring.size();
    let threshold = pause_threshold(size);
    let start = st.tail;
    let (mut used, c) = look(st.tail, ctl.head.load(Ordering::Acquire), st.consumed, 1);
    st.consumed = c;
    let mut end = None;
    loop {
        let free = size - used;
        if st.tail.wrapping_sub(start) >= FILL_BUDGET_RINGS * size {
            break; // budget spent: the socket stays armed and comes back
        }
        if free < threshold {
            // Pause: publish, then `paused = 1; fence; re-read head`
            // (Dekker against the host's "store head; fence; load paused").
            ctl.tail.store(st.tail, Ordering::Release);
            ctl.paused.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let (u, c) = look(st.tail, ctl.head.load(Ordering::Acquire), st.consumed, 1);
            (used, st.consumed) = (u, c);
            if size - used >= threshold {
                ctl.paused.store(0, Ordering::Relaxed);
                continue;
            }
            st.paused = true;
            note_paused(ahead_paused, sid);
            break;
        }
        let (p, n) = ring.span_ptr(st.tail, free);
        // SAFETY: p..p+n is the free span of this socket's ring inside the
        // mapped region (span_ptr bounds it); the host reads only
        // head..tail, and a host that writes here only corrupts its own
        // stream. No Rust reference to the span is formed.
        match unsafe { sys::recv(fd, p, n, 0) } {
            Ok(0) => {
                end = Some(Ok(()));
                break;
            }
            Ok(k) => {
                st.tail = st.tail.wrapping_add(k as u32);
                used += k as u32;
                stats.recvs_eager += 1;
                stats.bytes_ahead += k as u64;
                stats.bytes_received += k as u64;
                if k < n {
                    break; // a short read: drained (see above FILL_BUDGET_RINGS)
                }
            }
            Err(libc::EINTR) => {}
            Err(libc::EAGAIN) => break,
            Err(e) => {
                end = Some(Err(e));
                break;
            }
        }
    }
    if let Some(e) = end {
        st.ended = true;
        st.end = Some(match e {
            Ok(()) => PullEnd::Eof,
            Err(e) => PullEnd::Error(e),
        });
    }
    let moved = st.tail != start || end.is_some();
    if moved {
        publish(ctl, st.tail, end);
    }
    moved
}

fn fill_pull(host: &mut Host, sid: u32) -> bool {
    let Host {
        sockets,
        stats,
        ahead_paused,
        ..
    } = host;
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return false;
    };
    let fd = sock.fd.as_raw_fd();
    let Ahead::Pull(pb) = &mut sock.ahead else {
        return false;
    };
    if pb.end.is_some() {
        return false;
    }
    let start = pb.len();
    pb.throttled = false;
    loop {
        if pb.lo == pb.hi {
            pb.lo = 0;
            pb.hi = 0;
        }
        let want = pb.cap.saturating_sub(pb.len());
        if want == 0 {
            break;
        }
        if pb.hi == pb.buf.len() && pb.lo > 0 {
            pb.buf.copy_within(pb.lo..pb.hi, 0);
            pb.hi -= pb.lo;
            pb.lo = 0;
        }
        // Room allocated; or a buffer holding bytes (data is flowing)
        // grows first; an empty one reads into a probe first.
        let step = if pb.hi < pb.buf.len() || (pb.hi > 0 && pb.grow(PULL_PROBE.min(want))) {
            recv_into_buf(fd, pb, want)
        } else if pb.account.room() < PULL_PROBE.min(want) {
            // At the host's budget: read ahead no more (see `PullBuf`).
            pb.throttled = true;
            note_paused(ahead_paused, sid);
            break;
        } else {
            probe_into_buf(fd, pb, want)
        };
        match step {
            Ok((k, asked)) => {
                stats.bytes_ahead += k as u64;
                stats.bytes_received += k as u64;
                if k < asked {
                    break; // a short read: drained (see above FILL_BUDGET_RINGS)
                }
            }
            Err(None) => break,
            Err(Some(end)) => {
                pb.end = Some(end);
                break;
            }
        }
    }
    pb.len() != start || pb.end.is_some()
}

/// One `recv` into the free room of a pull buffer: (bytes, bytes asked),
/// or `Err(None)` for nothing to read now, `Err(Some(end))` at the end.
fn recv_into_buf(
    fd: i32,
    pb: &mut PullBuf,
    want: usize,
) -> Result<(usize, usize), Option<PullEnd>> {
    let room = want.min(pb.buf.len() - pb.hi);
    let dst = &mut pb.buf[pb.hi..pb.hi + room];
    loop {
        // SAFETY: dst is private memory of `room` bytes.
        return match unsafe { sys::recv(fd, dst.as_mut_ptr(), dst.len(), 0) } {
            Ok(0) => Err(Some(PullEnd::Eof)),
            Ok(k) => {
                pb.hi += k;
                Ok((k, room))
            }
            Err(libc::EINTR) => continue,
            Err(libc::EAGAIN) => Err(None),
            Err(e) => Err(Some(PullEnd::Error(e))),
        };
    }
}

/// A pull buffer with no room allocated: `recv` into a stack buffer, then
/// grow the buffer for the bytes that arrived (never before they do).
fn probe_into_buf(
    fd: i32,
    pb: &mut PullBuf,
    want: usize,
) -> Result<(usize, usize), Option<PullEnd>> {
    let mut probe = [0u8; PULL_PROBE];
    let asked = want.min(PULL_PROBE);
    loop {
        // SAFETY: probe is a private stack buffer of at least `asked` bytes.
        return match unsafe { sys::recv(fd, probe.as_mut_ptr(), asked, 0) } {
            Ok(0) => Err(Some(PullEnd::Eof)),
            Ok(k) => {
                // The budget had room for `asked` bytes (checked by the
                // caller), so this cannot fail; bytes read are never lost.
                if !pb.grow(k) {
                    pb.buf.resize(pb.hi + k, 0);
                    pb.recount();
                }
                pb.buf[pb.hi..pb.hi + k].copy_from_slice(&probe[..k]);
                pb.hi += k;
                Ok((k, asked))
            }
            Err(libc::EINTR) => continue,
            Err(libc::EAGAIN) => Err(None),
            Err(e) => Err(Some(PullEnd::Error(e))),
        };
    }
}

/// What a `Recv` on a pull socket got from its buffer.
pub(super) enum PullTake {
    /// Not a pull socket, or its buffer is empty and the stream open: go
    /// to the kernel.
    Empty,
    /// Bytes copied (PEEK: copied and left).
    Data(usize),
    /// End of stream, after the data.
    End(PullEnd),
}

/// Takes up to `len` bytes of socket `sid`'s pull buffer into `dst`.
///
/// # Safety
/// `dst..dst+len` must be memory the server may write (a checked arena or
/// registered range).
pub(super) unsafe fn pull_take(
    host: &mut Host,
    sid: u32,
    dst: *mut u8,
    len: usize,
    flags: i32,
) -> PullTake {
    let Some(Ahead::Pull(pb)) = host.sockets.get_mut(sid as usize).map(|s| &mut s.ahead) else {
        return PullTake::Empty;
    };
    if flags & libc::MSG_OOB != 0 {
        return PullTake::Empty;
    }
    if pb.len() == 0 {
        return match pb.end {
            None => PullTake::Empty,
            Some(e) => {
                if let PullEnd::Error(_) = e {
                    // Reported once; later recvs see end of file.
                    pb.end = Some(PullEnd::Eof);
                }
                PullTake::End(e)
            }
        };
    }
    let n = pb.len().min(len);
    if flags & libc::MSG_TRUNC == 0 {
        // SAFETY: the caller guarantees dst..dst+len; n <= len and
        // lo..lo+n is inside buf.
        unsafe { std::ptr::copy_nonoverlapping(pb.buf.as_ptr().add(pb.lo), dst, n) };
    }
    if flags & libc::MSG_PEEK == 0 {
        pb.lo += n;
        pb.free_if_drained();
    }
    PullTake::Data(n)
}

fn accept_ahead(cx: &mut Ctx<'_>, host: &mut Host, lid: u32) -> bool {
    let Some(l) = host.sockets.get_mut(lid as usize) else {
        return false;
    };
    let fd = l.fd.as_raw_fd();
    let policy = l.policy;
    let held = l.host_held;
    let Ahead::Accept(mut st) = std::mem::take(&mut l.ahead) else {
        return false;
    };
    let published = if st.demanded && !st.paused {
        // The whole batch: accept4 cannot sleep, and accepts as the
        // listener's owner (`guard`).
        let _guard = crate::guard::Guard::accept(held);
        accept_loop(cx, host, lid, fd, policy, &mut st)
    } else {
        false
    };
    if st.paused {
        note_paused(&mut host.ahead_paused, lid);
    }
    if let Some(l) = host.sockets.get_mut(lid as usize) {
        l.ahead = Ahead::Accept(st);
    }
    published
}

fn accept_loop(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    fd: i32,
    policy: EagerPolicy,
    st: &mut AcceptRing,
) -> bool {
    let Some(ring) = host.region.recv_ring(lid) else {
        return false;
    };
    let size = ring.size();
    let cap = accept_capacity(policy.accept_size, size) * ACCEPT_RECORD_SIZE;
    let start = st.tail;
    let head = ring.ctl().head.load(Ordering::Acquire);
    let (mut used, c) = look(st.tail, head, st.consumed, ACCEPT_RECORD_SIZE);
    st.consumed = c;
    forget_taken(st);
    loop {
        if used >= cap {
            let ctl = host.region.recv_ring(lid).map(|r| r.ctl());
            let Some(ctl) = ctl else { break };
            ctl.tail.store(st.tail, Ordering::Release);
            ctl.paused.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let (u, c) = look(
                st.tail,
                ctl.head.load(Ordering::Acquire),
                st.consumed,
                ACCEPT_RECORD_SIZE,
            );
            (used, st.consumed) = (u, c);
            forget_taken(st);
            if used < cap {
                ctl.paused.store(0, Ordering::Relaxed);
                continue;
            }
            st.paused = true;
            break;
        }
        // Refuse before accepting: the connection stays in the backlog,
        // and the host's accept sees EMFILE.
        if let Err(e) = check_quota(cx.cfg, host) {
            publish_error(host, lid, st, e);
            break;
        }
        let (nfd, peer) = match sys::accept(fd) {
            Ok(v) => v,
            Err(libc::ECONNABORTED) => continue,
            Err(libc::EINTR) => {
                // The guard cut short an accept the host made blocking:
                // again at the next readiness.
                host.interrupted(fd);
                break;
            }
            Err(libc::EAGAIN) => break,
            Err(e) => {
                debug!(
                    host = host.id,
                    listener = lid,
                    errno = e,
                    "accept ahead failed"
                );
                publish_error(host, lid, st, e);
                break;
            }
        };
        let Some(admitted) = crate::admission::admit(
            cx.cfg,
            &cx.shared.conns_per_addr,
            host,
            lid,
            peer.as_bytes(),
        ) else {
            crate::admission::reset(nfd);
            continue;
        };
        let id = match insert_accepted(cx, host, lid, nfd, false) {
            Ok(id) => id,
            Err(e) => {
                crate::admission::release(host, &cx.shared.conns_per_addr, &admitted);
                publish_error(host, lid, st, e);
                break;
            }
        };
        let gen = match host.sockets.get_mut(id as usize) {
            Some(s) => {
                s.admitted = admitted;
                s.gen
            }
            None => continue,
        };
        let flags = setup_accepted(cx, host, id, policy);
        let mut rec = AcceptRecord {
            sock: id,
            flags,
            ..AcceptRecord::default()
        };
        let a = peer.as_bytes();
        let n = a.len().min(rec.addr.len());
        rec.addr[..n].copy_from_slice(&a[..n]);
        rec.addr_len = n as u32;
        if let Some(ring) = host.region.recv_ring(lid) {
            ring.write_record(st.tail, &rec);
        }
        st.published.push_back((st.tail, id, gen));
        st.tail = st.tail.wrapping_add(ACCEPT_RECORD_SIZE);
        used += ACCEPT_RECORD_SIZE;
        host.stats.accepts_eager += 1;
    }
    let moved = st.tail != start;
    if moved {
        if let Some(ring) = host.region.recv_ring(lid) {
            publish(ring.ctl(), st.tail, None);
        }
    }
    moved
}

/// Writes an error record (`ACCEPT_ERROR`, the errno in `reserved`) and
/// stops accepting ahead until the host kicks again: each host `accept`
/// while the condition lasts then sees the error once, as with the kernel,
/// and a record never goes stale by being repeated on its own.
fn publish_error(host: &mut Host, lid: u32, st: &mut AcceptRing, errno: i32) {
    let rec = AcceptRecord {
        sock: u32::MAX,
        flags: ACCEPT_ERROR,
        reserved: errno as u32,
        ..AcceptRecord::default()
    };
    if let Some(ring) = host.region.recv_ring(lid) {
        ring.write_record(st.tail, &rec);
    }
    st.tail = st.tail.wrapping_add(ACCEPT_RECORD_SIZE);
    st.demanded = false;
}

/// Drops the published connections the host has taken (below `consumed`).
fn forget_taken(st: &mut AcceptRing) {
    while let Some(&(pos, _, _)) = st.published.front() {
        if untaken(pos, st.consumed, st.tail) {
            break;
        }
        st.published.pop_front();
    }
}

/// `Op::RecvKick`: the host consumed from (or wants from) the ring.
pub(super) fn kick(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    let Some(s) = host.sockets.get_mut(sid as usize).filter(|s| !s.closing) else {
        return;
    };
    let kicks = match &mut s.ahead {
        Ahead::Bytes(b) => {
            b.kicks = b.kicks.wrapping_add(1);
            b.kicks
        }
        Ahead::Accept(a) => {
            a.kicks = a.kicks.wrapping_add(1);
            a.demanded = true;
            a.kicks
        }
        _ => return,
    };
    host.stats.recv_kicks += 1;
    if let Some(r) = host.region.recv_ring(sid) {
        r.ctl().kicks_seen.store(kicks, Ordering::Release);
    }
    resume(cx, host, sid);
}

/// Clears a pause if the ring has room and reads (accepts)
/// ahead at once.
fn resume(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    let Some(ring) = host.region.recv_ring(sid) else {
        return;
    };
    let ctl = ring.ctl();
    let size = ring.size();
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return;
    };
    let head = ctl.head.load(Ordering::Acquire);
    let open = match &mut s.ahead {
        Ahead::Bytes(b) => {
            if b.paused {
                let (used, c) = look(b.tail, head, b.consumed, 1);
                b.consumed = c;
                if size - used >= pause_threshold(size) {
                    b.paused = false;
                    ctl.paused.store(0, Ordering::Relaxed);
                }
            }
            !b.paused
        }
        Ahead::Accept(a) => {
            if a.paused {
                let cap = accept_capacity(s.policy.accept_size, size) * ACCEPT_RECORD_SIZE;
                let (used, c) = look(a.tail, head, a.consumed, ACCEPT_RECORD_SIZE);
                a.consumed = c;
                if used < cap {
                    a.paused = false;
                    ctl.paused.store(0, Ordering::Relaxed);
                }
            }
            !a.paused
        }
        _ => false,
    };
    if open {
        host.ahead_paused.retain(|&p| p != sid);
        advance(cx, host, sid);
    }
}

/// The periodic sweep: resumes paused rings that have room (a host that
/// did not kick).
pub(super) fn sweep(cx: &mut Ctx<'_>, host: &mut Host) -> usize {
    if host.ahead_paused.is_empty() {
        return 0;
    }
    let mut work = 0;
    for sid in host.ahead_paused.clone() {
        let (paused, throttled) =
            host.sockets
                .get(sid as usize)
                .map_or((false, false), |s| match &s.ahead {
                    Ahead::Bytes(b) => (b.paused, false),
                    Ahead::Accept(a) => (a.paused, false),
                    Ahead::Pull(p) => (false, p.throttled),
                    Ahead::None => (false, false),
                });
        if throttled {
            work += usize::from(resume_pull(cx, host, sid));
            continue;
        }
        if !paused {
            host.ahead_paused.retain(|&p| p != sid);
            continue;
        }
        resume(cx, host, sid);
        work += usize::from(!host.ahead_paused.contains(&sid));
    }
    work
}

/// A pull socket the host's budget stopped reads ahead again once the
/// budget has room (other buffers drained); true if it did.
fn resume_pull(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    if host.pull.room() < PULL_FIRST {
        return false;
    }
    if let Some(Ahead::Pull(p)) = host.sockets.get_mut(sid as usize).map(|s| &mut s.ahead) {
        p.throttled = false;
    }
    host.ahead_paused.retain(|&p| p != sid);
    advance(cx, host, sid);
    true
}

/// The host closes socket `sid` (or the socket goes away): its ring is
/// unbound (`owner = 0`) before its id can be reused; connections an accept
/// ring published and the host never took are closed too.
pub(super) fn unbind(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return;
    };
    let ahead = std::mem::take(&mut s.ahead);
    host.ahead_paused.retain(|&p| p != sid);
    let ring = host.region.recv_ring(sid);
    let orphans = match ahead {
        Ahead::Accept(mut a) => {
            if let Some(r) = &ring {
                let (_, c) = look(
                    a.tail,
                    r.ctl().head.load(Ordering::Acquire),
                    a.consumed,
                    ACCEPT_RECORD_SIZE,
                );
                a.consumed = c;
                forget_taken(&mut a);
            }
            a.published
        }
        Ahead::None | Ahead::Pull(_) => return,
        Ahead::Bytes(_) => VecDeque::new(),
    };
    if let Some(r) = ring {
        let ctl = r.ctl();
        ctl.kind.store(KIND_FREE, Ordering::Relaxed);
        ctl.owner.store(0, Ordering::Release);
        fence(Ordering::SeqCst);
        if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
            futex::wake_all(&ctl.tail);
        }
    }
    for (_, id, gen) in orphans {
        if host.sockets.get(id as usize).is_some_and(|s| s.gen == gen) {
            debug!(
                host = host.id,
                listener = sid,
                sock = id,
                "closing a connection accepted ahead and never taken"
            );
            super::finalize_close(cx, host, id);
        }
    }
}

/// Socket ids published in accept rings and not (yet) taken by the host:
/// a fork snapshot leaves them out (the child could never name them).
pub fn untaken_ids(host: &Host) -> Vec<u32> {
    let mut ids = Vec::new();
    for (lid, s) in host.sockets.iter() {
        let Ahead::Accept(a) = &s.ahead else { continue };
        let Some(r) = host.region.recv_ring(lid as u32) else {
            continue;
        };
        let (_, consumed) = look(
            a.tail,
            r.ctl().head.load(Ordering::Acquire),
            a.consumed,
            ACCEPT_RECORD_SIZE,
        );
        for &(pos, id, gen) in &a.published {
            if untaken(pos, consumed, a.tail)
                && host.sockets.get(id as usize).is_some_and(|s| s.gen == gen)
            {
                ids.push(id);
            }
        }
    }
    ids
}

/// For `exec`: a socket whose ring or buffer holds nothing the host has not
/// read is unbound and may leave the server; otherwise false (EBUSY).
pub fn release_for_export(host: &mut Host, sid: u32) -> bool {
    let Some(s) = host.sockets.get(sid as usize) else {
        return false;
    };
    let ring = host.region.recv_ring(sid);
    let head = ring.map(|r| r.ctl().head.load(Ordering::Acquire));
    let idle = match &s.ahead {
        Ahead::None => return true,
        Ahead::Pull(p) => p.len() == 0,
        Ahead::Bytes(b) => head.is_some_and(|h| look(b.tail, h, b.consumed, 1).0 == 0),
        Ahead::Accept(a) => {
            head.is_some_and(|h| look(a.tail, h, a.consumed, ACCEPT_RECORD_SIZE).0 == 0)
        }
    };
    if !idle {
        return false;
    }
    if let Some(s) = host.sockets.get_mut(sid as usize) {
        s.ahead = Ahead::None;
    }
    host.ahead_paused.retain(|&p| p != sid);
    if let Some(r) = ring {
        r.ctl().kind.store(KIND_FREE, Ordering::Relaxed);
        r.ctl().owner.store(0, Ordering::Release);
    }
    true
}

/// POLLIN-side readiness of a socket that reads ahead, for the events
/// `events` asked: from its ring or buffer, never from the kernel.
pub(super) fn poll_revents(host: &Host, sid: u32, events: i16) -> i16 {
    let Some(s) = host.socket(sid) else {
        return 0;
    };
    let want_in = events & (libc::POLLIN | libc::POLLRDNORM);
    let want = want_in | (events & libc::POLLRDHUP);
    let ready = |end: Option<Result<(), i32>>, data: bool| -> i16 {
        let mut r = 0;
        if data {
            r |= want_in;
        }
        match end {
            Some(Ok(())) => r |= want_in | (want & libc::POLLRDHUP),
            Some(Err(_)) => r |= want_in | libc::POLLERR,
            None => {}
        }
        r
    };
    match &s.ahead {
        Ahead::None => 0,
        Ahead::Pull(p) => ready(
            p.end.map(|e| match e {
                PullEnd::Eof => Ok(()),
                PullEnd::Error(e) => Err(e),
            }),
            p.len() > 0,
        ),
        Ahead::Bytes(b) => {
            let Some(r) = host.region.recv_ring(sid) else {
                return 0;
            };
            let used = look(b.tail, r.ctl().head.load(Ordering::Acquire), b.consumed, 1).0;
            let end = if !b.ended {
                None
            } else if r.ctl().end.load(Ordering::Relaxed) == END_ERROR {
                Some(Err(r.ctl().end_errno.load(Ordering::Relaxed)))
            } else {
                Some(Ok(()))
            };
            ready(end, used > 0)
        }
        Ahead::Accept(a) => {
            let Some(r) = host.region.recv_ring(sid) else {
                return 0;
            };
            let used = look(
                a.tail,
                r.ctl().head.load(Ordering::Acquire),
                a.consumed,
                ACCEPT_RECORD_SIZE,
            )
            .0;
            ready(None, used > 0)
        }
    }
}

/// Whether socket `sid` is a pull socket the kernel serves meanwhile (empty
/// and stopped by its host's budget): a `Recv` goes to the kernel.
pub(super) fn pull_deferring(host: &Host, sid: u32) -> bool {
    matches!(host.sockets.get(sid as usize).map(|s| &s.ahead), Some(Ahead::Pull(p)) if p.deferring())
}

/// Whether socket `sid` reads ahead (its POLLIN readiness is ours).
pub(super) fn reads_ahead(host: &Host, sid: u32) -> bool {
    host.socket(sid).is_some_and(|s| s.ahead.is_active())
}

/// Whether a `Recv` must be refused (the socket's byte ring is bound: the
/// host reads the ring) or an `Accept` (its accept ring is bound).
pub(super) fn ring_bound(host: &Host, sid: u32) -> bool {
    host.socket(sid)
        .is_some_and(|s| matches!(s.ahead, Ahead::Bytes(_) | Ahead::Accept(_)))
}

/// Stops socket `sid` receiving ahead into its byte ring (its policy
/// becomes `Off`): the bytes already in the ring stay there for the host,
/// then `END_STOPPED` (stored after the last `tail`) tells it to go on with
/// requests; the kernel keeps everything newer. A ring that already ended
/// (EOF or error published) is left as it is: the host reads the end there.
/// Used by `setsockopt(TCPS_EAGER_RECV, 0)` (before exec) and by a fork
/// snapshot.
fn stop_ring(host: &mut Host, sid: u32) {
    let Some(s) = host.socket_mut(sid) else {
        return;
    };
    s.policy.recv = EagerRecv::Off;
    if !matches!(&s.ahead, Ahead::Bytes(b) if !b.ended) {
        return;
    }
    s.ahead = Ahead::None;
    host.ahead_paused.retain(|&p| p != sid);
    if let Some(ring) = host.region.recv_ring(sid) {
        let ctl = ring.ctl();
        ctl.end.store(END_STOPPED, Ordering::Release);
        fence(Ordering::SeqCst);
        if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
            futex::wake_all(&ctl.tail);
        }
    }
}

/// Bytes socket `sid` read ahead that its host has not taken, and the end
/// of stream after them: what a forked child gets with the socket.
#[derive(Debug)]
pub struct Unread {
    pub bytes: Vec<u8>,
    pub end: Option<PullEnd>,
}

/// For a fork snapshot: copies what socket `sid` read ahead and its host
/// has not taken (`None`: nothing, and no end). A byte ring is copied from
/// the server's `consumed` (clamped with the host's `head`, [`look`]) to
/// `tail`, and then stops receiving ahead ([`stop_ring`]), so later bytes
/// stay in the kernel for whichever process reads them; a pull buffer is
/// copied and left as it is.
pub fn take_unread_for_fork(host: &mut Host, sid: u32) -> Option<Unread> {
    let Host {
        region, sockets, ..
    } = host;
    let s = sockets.get_mut(sid as usize)?;
    let unread = match &mut s.ahead {
        Ahead::None | Ahead::Accept(_) => return None,
        Ahead::Pull(p) => Unread {
            bytes: p.buf[p.lo..p.hi].to_vec(),
            end: p.end,
        },
        Ahead::Bytes(b) => {
            let mut bytes = Vec::new();
            if let Some(ring) = region.recv_ring(sid) {
                let head = ring.ctl().head.load(Ordering::Acquire);
                let (used, c) = look(b.tail, head, b.consumed, 1);
                b.consumed = c;
                bytes.resize(used as usize, 0);
                ring.read_at(c, &mut bytes);
            }
            let unread = Unread { bytes, end: b.end };
            stop_ring(host, sid);
            unread
        }
    };
    (!unread.bytes.is_empty() || unread.end.is_some()).then_some(unread)
}

/// For a forked child: socket `sid` (just inherited, nothing bound) starts
/// pulling with `unread` already in its buffer (its `Recv`s are answered
/// from there first, then from the kernel; its `RecvBind` gets
/// `RECV_MODE_PULL`). The buffer holds at least those bytes.
pub fn start_pull_with(host: &mut Host, sid: u32, unread: Unread) {
    let account = host.pull.clone();
    let Some(s) = host.socket_mut(sid) else {
        return;
    };
    s.policy.recv = EagerRecv::Pull;
    let n = unread.bytes.len();
    let mut pb = PullBuf::new((s.policy.recv_size as usize).max(n), account);
    pb.buf = unread.bytes;
    pb.hi = n;
    pb.end = unread.end;
    // Counted even beyond the budget: the bytes were read already.
    pb.recount();
    s.ahead = Ahead::Pull(pb);
}

/// `setsockopt(SOL_TCPS, ...)`.
pub(super) fn setsockopt(host: &mut Host, sid: u32, name: i32, value: &[u8]) -> Res {
    let s = host.socket_mut(sid).ok_or(libc::EBADF)?;
    let v = int_value(value)?;
    match name {
        TCPS_EAGER_RECV => {
            let recv = match v {
                0 => EagerRecv::Off,
                1 => EagerRecv::Pull,
                2 => EagerRecv::Push,
                _ => return Err(libc::EINVAL),
            };
            if recv == EagerRecv::Off && matches!(s.ahead, Ahead::Bytes(_)) {
                // A socket about to cross exec(2) must not leave data
                // behind in this process's ring.
                stop_ring(host, sid);
                return Ok((0, 0));
            }
            if matches!(s.ahead, Ahead::Bytes(_) | Ahead::Pull(_)) && recv != s.policy.recv {
                return Err(libc::EBUSY);
            }
            s.policy.recv = recv;
        }
        TCPS_EAGER_ACCEPT => {
            if v < 0 {
                return Err(libc::EINVAL);
            }
            if v == 0 {
                if matches!(s.ahead, Ahead::Accept(_)) {
                    return Err(libc::EBUSY);
                }
                s.policy.accept = false;
            } else {
                s.policy.accept = true;
                s.policy.accept_size = v as u32;
            }
        }
        TCPS_SETUP_WITH_ACCEPT => match v {
            0 | 1 => s.policy.setup_with_accept = v == 1,
            _ => return Err(libc::EINVAL),
        },
        TCPS_EAGER_RECV_SIZE => {
            if !(MIN_RECV_SIZE as i32..=MAX_RECV_SIZE as i32).contains(&v) {
                return Err(libc::EINVAL);
            }
            s.policy.recv_size = v as u32;
            if let Ahead::Pull(p) = &mut s.ahead {
                p.cap = v as usize;
            }
        }
        _ => return Err(libc::ENOPROTOOPT),
    }
    Ok((0, 0))
}

fn int_value(value: &[u8]) -> Result<i32, i32> {
    let b: [u8; 4] = value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(libc::EINVAL)?;
    Ok(i32::from_ne_bytes(b))
}

/// `getsockopt(SOL_TCPS, ...)`: the value as a C `int`.
pub(super) fn getsockopt(host: &Host, sid: u32, name: i32) -> Result<i32, i32> {
    let s = host.socket(sid).ok_or(libc::EBADF)?;
    let p = s.policy;
    Ok(match name {
        TCPS_EAGER_RECV => match p.recv {
            EagerRecv::Off => 0,
            EagerRecv::Pull => 1,
            EagerRecv::Push => 2,
        },
        TCPS_EAGER_ACCEPT => {
            if p.accept {
                p.accept_size.min(i32::MAX as u32) as i32
            } else {
                0
            }
        }
        TCPS_SETUP_WITH_ACCEPT => i32::from(p.setup_with_accept),
        TCPS_EAGER_RECV_SIZE => {
            let push_ring = p.recv == EagerRecv::Push && sid < host.layout.recv_rings
                || matches!(s.ahead, Ahead::Bytes(_));
            if push_ring {
                host.layout.rq_bytes as i32
            } else {
                p.recv_size as i32
            }
        }
        _ => return Err(libc::ENOPROTOOPT),
    })
}

/// Whether `level` is tcps' own option level.
pub(super) fn is_tcps_level(level: i32) -> bool {
    level == SOL_TCPS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_threshold_is_4k_or_a_quarter() {
        assert_eq!(pause_threshold(32 * 1024), 4096);
        assert_eq!(pause_threshold(4096), 1024);
        assert_eq!(pause_threshold(8192), 2048);
        assert_eq!(pause_threshold(16 << 20), 4096);
    }

    #[test]
    fn accept_capacity_is_bounded_by_the_ring() {
        assert_eq!(accept_capacity(64, 32 * 1024), 64);
        assert_eq!(accept_capacity(1000, 4096), 64);
        assert_eq!(accept_capacity(0, 4096), 1);
    }

    #[test]
    fn look_clamps_and_counts_whole_records() {
        // bytes: plain clamp
        assert_eq!(look(100, 40, 0, 1), (60, 40));
        assert_eq!(look(100, 1000, 40, 1), (60, 40)); // forged head ahead of tail
        assert_eq!(look(100, 0, 40, 1), (60, 40)); // head moving back
                                                   // records: a head inside a record leaves it outstanding
        assert_eq!(look(256, 64, 0, 64), (192, 64));
        assert_eq!(look(256, 70, 0, 64), (192, 64));
        assert_eq!(look(256, 256, 0, 64), (0, 256));
        assert_eq!(look(256, 5000, 64, 64), (192, 64));
        // across the wrap
        let t = 32u32;
        let c = u32::MAX - 31; // 64 bytes behind t, wrapped
        assert_eq!(look(t, c.wrapping_add(64), c, 64), (0, t));
        assert_eq!(look(t, c, c, 64), (64, c));
    }

    #[test]
    fn untaken_is_the_window_consumed_to_tail() {
        assert!(untaken(64, 64, 128));
        assert!(!untaken(0, 64, 128));
        assert!(!untaken(128, 64, 128));
        let c = u32::MAX - 63;
        assert!(untaken(c, c, c.wrapping_add(128)));
        assert!(untaken(c.wrapping_add(64), c, c.wrapping_add(128)));
        assert!(!untaken(c.wrapping_sub(64), c, c.wrapping_add(128)));
    }
}
