//! What the server keeps per attached host: its credentials, its mapped
//! region with one private cursor per channel, and its sockets.

use crate::calls::eager::pullbuf::PullAccount;
use crate::calls::eager::ring::Eager;
use crate::guard::{self, HostHeld};
use crate::registry::Registry;
use crate::slab::Slab;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use tcps_proto::msg::{ArenaRange, Call};
use tcps_proto::ring::ServerCursor;
use tcps_proto::{Layout, Op, Region};

/// A host as the acceptor hands it to a worker.
pub struct NewHost {
    pub id: u64,
    pub pid: u32,
    pub uid: u32,
    pub region: Region,
    pub control: OwnedFd,
    /// The host's own doorbell eventfd (a copy went out in its Welcome).
    pub doorbell: OwnedFd,
    /// On another node (`fabric`): its `Socket` and `Bind` run here.
    pub remote: bool,
    /// A remote host's fabric address (its node): who may claim its fork
    /// snapshots (`inherit`).
    pub fabric_peer: Option<std::net::IpAddr>,
    /// The region's memfd, kept for a hot upgrade to map it again (None:
    /// a remote host's copy, which no upgrade carries).
    pub memfd: Option<OwnedFd>,
}

/// A control reply the host's socket could not take yet (it does not read
/// its replies): sent when the socket is writable again.
pub struct Outgoing {
    pub bytes: [u8; tcps_proto::handshake::CONTROL_MSG_LEN],
    pub fd: Option<OwnedFd>,
}

/// A wake of listener `lid`'s sleeping acceptors owed until connection
/// `sid` (generation `sid_gen`) has data, or until `due`
/// (`calls::eager::acceptwake`).
#[derive(Clone, Copy, Debug)]
pub struct AcceptWake {
    pub lid: u32,
    pub sid: u32,
    pub sid_gen: u16,
    pub due: std::time::Instant,
}

/// Most parked-call queue pairs a host keeps from closed sockets.
pub const SPARE_QUEUES: usize = 1024;

pub struct Host {
    pub id: u64,
    pub pid: u32,
    pub uid: u32,
    /// On another node (`NewHost::remote`).
    pub remote: bool,
    /// Its fabric address (`NewHost::fabric_peer`).
    pub fabric_peer: Option<std::net::IpAddr>,
    /// Shared with operations in flight that read or write it (a receive
    /// into a ring, `Engine::submit_recv`): unmapped after the last one
    /// completed, also when the host went away before.
    pub region: std::sync::Arc<Region>,
    /// The server's own copy of the geometry: never re-read from shared memory.
    pub layout: Layout,
    pub cursors: Vec<ServerCursor>,
    pub control: OwnedFd,
    /// The region's memfd (`NewHost::memfd`).
    pub memfd: Option<OwnedFd>,
    /// Its doorbell: only this host rings it (`Token::HostBell`).
    pub doorbell: OwnedFd,
    /// The eventfd the server rings for this host's ring sleepers, once it
    /// asked for one (`host_doorbell`).
    pub host_doorbell: crate::host_doorbell::HostDoorbells,
    /// Control replies waiting for room in the control socket (bounded:
    /// `worker::messages::OUTBOX_MAX`).
    pub outbox: VecDeque<Outgoing>,
    pub sockets: Slab<Sock>,
    pub polls: Slab<ParkedPoll>,
    /// Entries of the parked polls (budget: `poll::MAX_PARKED_POLL_ENTRIES_PER_HOST`).
    pub poll_entries_parked: usize,
    /// Requests refused because the host was at a budget (registrations,
    /// fork snapshots): logged as warnings only on the 1st, 2nd, 4th, ...
    /// so a host cannot flood the log.
    pub budget_refusals: u64,
    /// `Inherit` claims that found nothing: a child claims once, so past
    /// `inherit::MAX_FAILED_CLAIMS` they are refused without a look.
    pub failed_claims: u32,
    pub next_gen: u16,
    pub stats: HostStats,
    /// Set when the host broke the protocol or hung up; the worker detaches it.
    pub doomed: Option<String>,
    /// A host that hung up with asynchronous sends still queued: its
    /// sockets are closing, and it stays (region mapped, sockets driven)
    /// until their last job finished or this time passed (`worker::reap`).
    pub draining_until: Option<std::time::Instant>,
    /// Guarded calls that found O_NONBLOCK cleared on a description the
    /// host shares (`Host::interrupted`); too many detach the host.
    pub blocking_strikes: u32,
    /// Registered memory (memfds mapped here).
    pub registry: Registry,
    /// Files the host opened for `Op::SendFile` (`ControlMsg::FileOpen`).
    /// Shared with the file jobs of send queues that name them (a job keeps
    /// its file open until it finishes, whatever `FileClose` says).
    pub files: std::collections::HashMap<u32, std::sync::Arc<OwnedFd>>,
    /// The server's private state of each send queue (index = queue).
    pub queues: Vec<QueueState>,
    /// The queues bound to a socket: all the 10 ms backstop sweep looks at
    /// (it grows with the host's sending sockets, not with its slots).
    pub bound_queues: Vec<u32>,
    /// Send queues the backstop sweeps looked at, in all (`tcps stat`'s
    /// `server.scan.queues_swept`).
    pub queues_swept: u64,
    /// Queues the worker watches on every pass (their `active` is set).
    pub hot: Vec<u32>,
    /// Queues that went cold, to be looked at once more at the given time
    /// (a host store of `head` that raced with clearing `active`).
    pub cooling: Vec<(u32, std::time::Instant)>,
    /// Sockets whose receive/accept ring is paused (full), whose accept
    /// ahead is stalled, or whose pull buffer is stopped by the budget: the
    /// periodic sweep resumes them when room appears.
    pub eager_paused: Vec<u32>,
    /// The parked-call queues of closed sockets, emptied, for new ones
    /// (connection caching: a connection's first queued send or parked
    /// call allocates nothing); at most `SPARE_QUEUES`.
    pub spare_queues: Vec<(VecDeque<Parked>, VecDeque<Parked>)>,
    /// Wakes of sleeping acceptors owed until their connection has data
    /// (`calls::eager::acceptwake`).
    pub accept_wakes: Vec<AcceptWake>,
    /// Bytes of this host's pull buffers, against `--max-pull-bytes-per-host`.
    pub pull: PullAccount,
    /// Sockets to re-arm at the next sweep: their last readiness answered
    /// none of the polls parked on them (`calls::blocking::on_socket_ready`).
    pub rearm_later: Vec<u32>,
    /// `Poll` calls taken in this pass, started after the worker swept the
    /// engine (`calls::start_polls`): (channel, user_data, entries,
    /// timeout ms).
    pub polls_to_start: Vec<(u32, u64, tcps_proto::msg::ArenaRange, i64)>,
    /// Channels whose sleeping host threads are woken at the end of the
    /// worker's pass (`calls::wake_owed`).
    pub wakes_owed: Vec<u32>,
    /// Arrivals observed (free-running): the number of the next one
    /// (`Arrival::next`).
    pub arrivals: u32,
    /// Balancing: the share of new connections handed over directly, and
    /// those waiting to be taken (`crate::balance`).
    pub balance: crate::balance::HostBalance,
    /// The worker no longer looks at this host's channels: they brought no
    /// request for a while; its next request rings its doorbell, which
    /// wakes it (`worker::scan`, `ServerCursor::announce_dormant`).
    pub dormant: bool,
    /// When a scan last took a request from this host.
    pub last_request: std::time::Instant,
}

/// What the server keeps of one send queue; the shared control block is
/// only ever written from this, never trusted back.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueState {
    /// The socket it is bound to.
    pub owner: Option<u32>,
    /// Descriptors taken into the socket's write queue (free-running).
    pub ingested: u32,
    /// Descriptors finished.
    pub done: u32,
    /// errno of the first failure (sticky), 0 if none.
    pub error: i32,
    /// The host overran its credits: the queue failed for good (EPROTO)
    /// and the server takes no more descriptors from it.
    pub overrun: bool,
    pub hot: bool,
    /// Kicks taken (published as `kicks_seen`).
    pub kicks: u32,
    /// Last time new descriptors arrived (hot queues cool down after a while).
    pub last_activity: Option<std::time::Instant>,
}

impl Host {
    /// A newly attached host; `max_pull_bytes` is its pull-buffer budget
    /// (`--max-pull-bytes-per-host`).
    pub fn new(h: NewHost, max_pull_bytes: usize) -> Host {
        let layout = *h.region.layout();
        Host {
            id: h.id,
            pid: h.pid,
            uid: h.uid,
            remote: h.remote,
            fabric_peer: h.fabric_peer,
            cursors: vec![ServerCursor::default(); layout.n_channels as usize],
            layout,
            region: std::sync::Arc::new(h.region),
            control: h.control,
            memfd: h.memfd,
            doorbell: h.doorbell,
            host_doorbell: Default::default(),
            outbox: VecDeque::new(),
            sockets: Slab::default(),
            polls: Slab::default(),
            poll_entries_parked: 0,
            budget_refusals: 0,
            failed_claims: 0,
            next_gen: 0,
            stats: HostStats::default(),
            doomed: None,
            draining_until: None,
            blocking_strikes: 0,
            registry: Registry::default(),
            files: Default::default(),
            queues: vec![QueueState::default(); layout.send_queues as usize],
            bound_queues: Vec::new(),
            queues_swept: 0,
            hot: Vec::new(),
            cooling: Vec::new(),
            eager_paused: Vec::new(),
            spare_queues: Vec::new(),
            accept_wakes: Vec::new(),
            pull: PullAccount::new(max_pull_bytes),
            polls_to_start: Vec::new(),
            wakes_owed: Vec::new(),
            arrivals: 0,
            rearm_later: Vec::new(),
            balance: Default::default(),
            dormant: false,
            last_request: std::time::Instant::now(),
        }
    }

    /// Counts a request refused by a budget; whether to log it as a
    /// warning (the 1st, 2nd, 4th, 8th, ... refusal of this host).
    pub fn note_budget_refusal(&mut self) -> bool {
        self.budget_refusals += 1;
        self.budget_refusals.is_power_of_two()
    }

    /// Channels the host says it uses, clamped to the pool.
    pub fn channels_in_use(&self) -> u32 {
        let used = self
            .region
            .header()
            .channels_used
            .load(std::sync::atomic::Ordering::Acquire);
        used.min(self.layout.n_channels)
    }

    /// A socket the host may name (not one closed while its last
    /// asynchronous sends drain).
    pub fn socket(&self, id: u32) -> Option<&Sock> {
        self.sockets.get(id as usize).filter(|s| !s.closing)
    }

    pub fn socket_mut(&mut self, id: u32) -> Option<&mut Sock> {
        self.sockets.get_mut(id as usize).filter(|s| !s.closing)
    }

    /// A guarded call on `fd`, a description this host shares, returned
    /// EINTR (`guard`). If the host had cleared O_NONBLOCK it is set again
    /// and counted as a strike: each cost the worker up to a tick, so after
    /// [`guard::MAX_BLOCKING_STRIKES`] the host is detached.
    pub fn interrupted(&mut self, fd: libc::c_int) {
        if !guard::restore_nonblocking(fd) {
            return;
        }
        self.blocking_strikes += 1;
        tracing::debug!(
            host = self.id,
            strikes = self.blocking_strikes,
            "a call on a shared socket slept: the host cleared O_NONBLOCK"
        );
        if self.blocking_strikes >= guard::MAX_BLOCKING_STRIKES && self.doomed.is_none() {
            tracing::warn!(
                host = self.id,
                pid = self.pid,
                uid = self.uid,
                "detaching host: it keeps clearing O_NONBLOCK on sockets it shares with the server"
            );
            self.doomed = Some("cleared O_NONBLOCK on shared sockets".into());
        }
    }

    /// Any socket, also a closing one (readiness and timers still drive it).
    pub fn any_socket_mut(&mut self, id: u32) -> Option<&mut Sock> {
        self.sockets.get_mut(id as usize)
    }
}

/// A kernel socket owned by a host, and the calls parked on it.
pub struct Sock {
    pub fd: OwnedFd,
    /// Its descriptor, counted against the host's uid (`fdbudget`) while
    /// it lives.
    pub charge: crate::fdbudget::Charge,
    pub gen: u16,
    /// O_NONBLOCK as the host set it; the kernel socket is always non-blocking.
    pub nonblocking: bool,
    /// Parked accept/recv calls, in the order the host issued them.
    pub readers: VecDeque<Parked>,
    /// Parked send/connect calls, in order.
    pub writers: VecDeque<Parked>,
    /// Parked polls that include this socket: (poll key, events wanted),
    /// one entry per poll (the events of its entries for this socket ORed).
    pub pollers: Vec<(usize, i16)>,
    /// Directions currently armed in the engine (0: none).
    pub armed_mask: u32,
    pub arm_seq: u8,
    /// SO_RCVTIMEO / SO_SNDTIMEO as the host set them: how long a parked
    /// recv/accept or send/connect may wait before it returns EAGAIN.
    pub rcv_timeout: Option<std::time::Duration>,
    pub snd_timeout: Option<std::time::Duration>,
    /// The error a `MSG_WAITALL` recv met after it had moved bytes (it
    /// returned them): the next recv returns it, as the kernel keeps the
    /// error for the next call.
    pub recv_error: Option<i32>,
    /// The send queue bound to it (`Op::AsyncBind`).
    pub queue: Option<u32>,
    /// Closed by the host while asynchronous sends were still queued: it
    /// closes for real once they are sent (like the kernel's close with
    /// data in the send buffer). The host cannot name it meanwhile.
    pub closing: bool,
    /// A listener: its live accepted connections (--max-conns-per-listener).
    pub live_accepted: u32,
    /// SO_LINGER may be on, so its close may block: close checks it (see
    /// `closer::close_socket`). True for sockets whose options the server did
    /// not all see (created or set by the host) and once the host sets
    /// SO_LINGER through the server; an accepted connection has its
    /// listener's linger (the kernel copies it).
    pub may_linger: bool,
    /// A listener: whether its SO_LINGER is on with a time (what accepted
    /// connections inherit), once looked up; `None`: look it up.
    pub listener_lingers: Option<bool>,
    /// An accepted connection: what it counts against until it closes.
    pub admitted: Admitted,
    /// Process-ahead policy (server defaults, `SOL_TCPS` options, or the
    /// listener's for an accepted connection).
    pub policy: crate::config::EagerPolicy,
    /// Process-ahead state: receive ring, accept ring or pull buffer.
    pub eager: Eager,
    /// The host holds this open file description too (adopted or
    /// duplicated): blocking calls on it are guarded (`guard`).
    pub host_held: Option<HostHeld>,
    /// The number of the send the engine executes for the front of
    /// `writers` (`calls::sendq::uring`), while it is in flight.
    pub send_op: Option<u8>,
    /// The number of the receive into its receive ring the engine executes
    /// (`calls::eager::recv`), while it is in flight.
    pub recv_op: Option<u8>,
    /// Numbers the engine's operations on this socket (`Token::Sent`,
    /// `Token::Received`).
    pub op_seq: u8,
    /// When a poll first found it readable with no arrival time of its own
    /// to rank by (a listener without an accept ring: its connections wait
    /// in the kernel's queue, which keeps no times); cleared when a poll
    /// finds it not readable (`calls::poll`).
    pub ready_since: Option<crate::arrival::Arrival>,
}

impl Sock {
    pub fn new(fd: OwnedFd, gen: u16, nonblocking: bool, uid: u32) -> Sock {
        Sock {
            fd,
            charge: crate::fdbudget::Charge::new(uid),
            gen,
            nonblocking,
            readers: VecDeque::new(),
            writers: VecDeque::new(),
            pollers: Vec::new(),
            armed_mask: 0,
            arm_seq: 0,
            rcv_timeout: None,
            snd_timeout: None,
            recv_error: None,
            queue: None,
            closing: false,
            live_accepted: 0,
            may_linger: true,
            listener_lingers: None,
            admitted: Default::default(),
            policy: crate::config::EagerPolicy::default(),
            eager: Eager::None,
            host_held: None,
            send_op: None,
            recv_op: None,
            op_seq: 0,
            ready_since: None,
        }
    }

    /// Whether asynchronous sends are queued on it.
    pub fn has_jobs(&self) -> bool {
        self.writers.iter().any(|p| p.job.is_some())
    }

    /// The readiness directions the parked calls on this socket wait for.
    pub fn wanted_mask(&self) -> u32 {
        let mut m = 0u32;
        // Reading (accepting) ahead: the server already took the kernel's
        // readability, so POLLIN is wanted only while it reads ahead; parked
        // calls and polls get theirs from the ring or the pull buffer.
        let ahead = self.eager.is_active();
        // A receive in flight into the ring waits for data by itself.
        if ahead && self.eager.wants_readable() && self.recv_op.is_none() {
            m |= (libc::POLLIN | libc::POLLRDHUP) as u32;
        }
        if !ahead && !self.readers.is_empty() {
            m |= (libc::POLLIN | libc::POLLRDHUP) as u32;
        }
        // A send in flight at the engine completes by itself: no
        // readiness is wanted for it (nor for the calls behind it).
        if !self.writers.is_empty() && self.send_op.is_none() {
            m |= libc::POLLOUT as u32;
        }
        // A poll is woken only by what would answer it: the kernel
        // conditions it asked for (POLLERR and POLLHUP are always
        // reported). Arming for more (POLLIN for a POLLPRI poll, say)
        // would fire again and again while the poll stays unanswered.
        for &(_, ev) in &self.pollers {
            // Reading ahead, readiness for POLLIN comes from the ring or
            // buffer, not from the kernel.
            if !ahead && ev & (libc::POLLIN | libc::POLLRDNORM) != 0 {
                m |= libc::POLLIN as u32;
            }
            if !ahead && ev & libc::POLLRDHUP != 0 {
                m |= libc::POLLRDHUP as u32;
            }
            if ev & libc::POLLPRI != 0 {
                m |= libc::POLLPRI as u32;
            }
            if ev & (libc::POLLOUT | libc::POLLWRNORM) != 0 {
                m |= libc::POLLOUT as u32;
            }
            // A poll for errors only still hears about errors and hang-ups
            // (always reported), and so does every other.
            m |= (libc::POLLERR | libc::POLLHUP) as u32;
        }
        m
    }
}

/// What an accepted connection counts against.
#[derive(Clone, Copy, Debug, Default)]
pub struct Admitted {
    /// The listener (socket id, generation) that accepted it.
    pub listener: Option<(u32, u16)>,
    /// The client address, when per-address limits are on.
    pub addr: Option<std::net::IpAddr>,
}

/// A call that would block, waiting at the server for its socket.
pub struct Parked {
    pub ch: u32,
    pub user_data: u64,
    pub op: Op,
    pub call: Call,
    /// Bytes already moved (send/recv), or 1 once a connect is in progress.
    pub progress: usize,
    /// Non-blocking for this call (O_NONBLOCK or MSG_DONTWAIT).
    pub nonblocking: bool,
    /// Names this call for its timeout timer (0: not parked yet).
    pub serial: u64,
    /// An asynchronous send: finishing it updates its send queue instead of
    /// publishing a completion.
    pub job: Option<Job>,
}

/// Descriptor `seq` of send queue `queue`.
#[derive(Clone, Debug)]
pub struct Job {
    pub queue: u32,
    pub seq: u32,
    /// Debug mode: the checksum the host computed at submit.
    pub checksum: Option<u64>,
    /// The descriptor was valid and its registration is held (released
    /// when the job finishes), or its file found (`file`).
    pub held: bool,
    /// A file range (`DESC_FILE`): the file, kept open by the job.
    pub file: Option<std::sync::Arc<OwnedFd>>,
}

/// A `Poll` call parked until one of its sockets is ready or it times out.
pub struct ParkedPoll {
    pub ch: u32,
    pub user_data: u64,
    pub entries: ArenaRange,
    pub socks: Vec<u32>,
    /// Distinguishes this poll from a later one in the same slab slot.
    pub serial: u64,
}

/// Per-host counters (logged at detach; read by `tcps stat` later).
#[derive(Default, Debug, Clone)]
pub struct HostStats {
    /// Calls by op code (index = `Op as usize`).
    pub calls: [u64; 32],
    pub parked: u64,
    pub invalid: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub refused_sockets: u64,
    /// Connections reset at accept by admission limits (never seen by the host).
    pub refused_conns: u64,
    /// Asynchronous sends finished, and those that failed.
    pub async_sends: u64,
    pub async_failed: u64,
    /// Kicks (`AsyncKick`) and sends taken without one (the queue was watched).
    pub kicks: u64,
    /// Completions published: channel round trips the host waited on
    /// (kicks get none).
    pub round_trips: u64,
    /// Connections accepted ahead into accept rings, and `Accept` requests
    /// that went to the kernel (on demand).
    pub accepts_eager: u64,
    pub accepts_on_demand: u64,
    /// Connections handed to the host as kernel sockets (balancing).
    pub accepts_direct: u64,
    /// Receives served ahead: `recv(2)`s into receive rings (push) and
    /// `Recv` requests answered from the pull buffer; and `Recv` requests
    /// that went to the kernel (on demand).
    pub recvs_eager: u64,
    pub recvs_on_demand: u64,
    /// Bytes received ahead (into rings or pull buffers).
    pub bytes_eager: u64,
    /// `RecvKick`s taken (the host resumed a paused ring).
    pub recv_kicks: u64,
    /// Futex wakes of sleeping host threads: a completion, a receive or
    /// accept ring publish, or a finished asynchronous send found a host
    /// thread waiting for it (wakes at server shutdown are not counted;
    /// doorbell rings are `doorbell_rings`).
    pub wakes: u64,
    /// Host doorbell rings (at most one per worker pass that found one of
    /// the host's doorbell sleepers on a ring it published; `host_doorbell`).
    pub doorbell_rings: u64,
    /// Ring publishes that found a doorbell sleeper.
    pub bell_wants: u64,
    /// Not a counter: the doorbells (bit per slot) those publishes named,
    /// rung and cleared at the end of the pass (`host_doorbell`).
    pub bells_owed: u64,
}

impl HostStats {
    /// Counts whom a ring publish found waiting (`tcps_proto::eager::Woke`).
    pub fn count_woke(&mut self, w: tcps_proto::eager::Woke) {
        // The futex wake itself is the engine's (`Worker::submit_wakes`:
        // an io_uring operation, or a counted system call with epoll).
        self.wakes += u64::from(w.thread);
        self.bell_wants += u64::from(w.bell);
        self.bells_owed |= w.bells;
    }
}

impl std::fmt::Display for HostStats {
    /// `Send=12 Recv=12 ... parked=1 invalid=0 sent=768B received=768B`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for op in Op::ALL {
            let n = self.calls[*op as usize % 32];
            if n > 0 {
                write!(f, "{}={} ", op.name(), n)?;
            }
        }
        write!(
            f,
            "round_trips={} wakes={} accepts_eager={} accepts_on_demand={} accepts_direct={} recvs_eager={} recvs_on_demand={} bytes_eager={} recv_kicks={} parked={} invalid={} refused_sockets={} refused_conns={} async_sends={} async_failed={} kicks={} sent={}B received={}B",
            self.round_trips,
            self.wakes,
            self.accepts_eager,
            self.accepts_on_demand,
            self.accepts_direct,
            self.recvs_eager,
            self.recvs_on_demand,
            self.bytes_eager,
            self.recv_kicks,
            self.parked,
            self.invalid,
            self.refused_sockets,
            self.refused_conns,
            self.async_sends,
            self.async_failed,
            self.kicks,
            self.bytes_sent,
            self.bytes_received
        )
    }
}
