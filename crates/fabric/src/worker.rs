//! `ucp_worker`: progress, the operations in flight (and what they keep
//! alive), the active messages received, failed endpoints, and the wait on
//! the worker's event fd.

use crate::context::Context;
use crate::error::{check, Error, Result};
use crate::memory::MemInner;
use crate::sys;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One active message received: its id, header and data (copied out of
/// UCX's buffers), and the endpoint it came on when the sender asked for a
/// reply endpoint and it is one of this worker's (`Endpoint::tag`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmMessage {
    pub id: u32,
    pub header: Vec<u8>,
    pub data: Vec<u8>,
    pub from: Option<u64>,
}

/// What an operation in flight keeps alive until UCX completes it.
pub(crate) enum Keep {
    Nothing,
    Bytes(#[allow(dead_code)] Vec<u8>, #[allow(dead_code)] Vec<u8>),
    Mem(#[allow(dead_code)] Arc<MemInner>),
    /// A rendezvous receive: the message fills its place in the queue
    /// (`seq`) when it completes.
    Recv(u64, AmMessage),
}

struct Pending {
    request: *mut libc::c_void,
    ep: Option<u64>,
    keep: Keep,
}

/// A rendezvous message announced by the AM callback (its data is still at
/// the sender); received with `ucp_am_recv_data_nbx` after progress.
struct Rndv {
    desc: *mut libc::c_void,
    msg: AmMessage,
    len: usize,
    seq: u64,
}

/// A received message in arrival order: a rendezvous one holds its place
/// (`msg` None) until its data is in, so that messages of one endpoint
/// are taken in the order they were sent (a later eager message does not
/// overtake an earlier large one; the channel's spans depend on it).
struct Arrived {
    seq: u64,
    from: Option<u64>,
    msg: Option<AmMessage>,
}

struct Handler {
    id: u32,
    worker: *const WorkerInner,
}

pub(crate) struct WorkerInner {
    _ctx: Context,
    pub(crate) raw: sys::ucp_worker_h,
    efd: i32,
    am: RefCell<VecDeque<Arrived>>,
    next_seq: Cell<u64>,
    rndv: RefCell<Vec<Rndv>>,
    /// Boxed: the callbacks' `arg` points into each, so they must not move.
    #[allow(clippy::vec_box)]
    handlers: RefCell<Vec<Box<Handler>>>,
    pending: RefCell<Vec<Pending>>,
    /// Raw endpoint → its tag, to name the sender of a message.
    pub(crate) eps: RefCell<HashMap<usize, u64>>,
    pub(crate) failed: RefCell<Vec<(u64, i32)>>,
    pub(crate) next_tag: Cell<u64>,
}

impl WorkerInner {
    /// Starts tracking an operation's request (or finishes a null/error
    /// result at once).
    pub(crate) fn track(
        &self,
        p: sys::ucs_status_ptr_t,
        ep: Option<u64>,
        keep: Keep,
        what: &'static str,
    ) -> Result<()> {
        if p.is_null() {
            self.finished(keep);
            return Ok(());
        }
        if sys::ptr_is_err(p) {
            return Err(Error::new(sys::ptr_status(p), what));
        }
        self.pending.borrow_mut().push(Pending {
            request: p,
            ep,
            keep,
        });
        Ok(())
    }

    fn finished(&self, keep: Keep) {
        if let Keep::Recv(seq, msg) = keep {
            if let Some(a) = self.am.borrow_mut().iter_mut().find(|a| a.seq == seq) {
                a.msg = Some(msg);
            }
        }
    }

    /// A message's place in the queue.
    fn arrive(&self, from: Option<u64>, msg: Option<AmMessage>) -> u64 {
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        self.am.borrow_mut().push_back(Arrived { seq, from, msg });
        seq
    }

    /// A rendezvous receive that failed gives up its place.
    fn forget(&self, seq: u64) {
        self.am.borrow_mut().retain(|a| a.seq != seq);
    }

    /// Messages ready to take.
    fn ready(&self) -> usize {
        self.am.borrow().iter().filter(|a| a.msg.is_some()).count()
    }

    /// Moves completed operations' keeps out (drops them, queues received
    /// rendezvous messages).
    fn reap_keeps(&self) -> usize {
        let mut keeps = Vec::new();
        let mut requests = Vec::new();
        self.pending.borrow_mut().retain_mut(|p| {
            // SAFETY: a live request of this worker (freed only below).
            let status = unsafe { sys::ucp_request_check_status(p.request) };
            if status == sys::UCS_INPROGRESS {
                return true;
            }
            requests.push((p.request as usize, status, p.ep));
            keeps.push((status, std::mem::replace(&mut p.keep, Keep::Nothing)));
            false
        });
        let n = requests.len();
        for (req, status, ep) in requests {
            // SAFETY: a completed request, freed once.
            unsafe { sys::ucp_request_free(req as *mut libc::c_void) };
            if status != sys::UCS_OK {
                if let Some(tag) = ep {
                    self.failed.borrow_mut().push((tag, status));
                }
            }
        }
        for (status, keep) in keeps {
            match keep {
                Keep::Recv(seq, _) if status != sys::UCS_OK => self.forget(seq),
                keep if status == sys::UCS_OK => self.finished(keep),
                _ => {}
            }
        }
        n
    }

    fn start_rndv(&self) {
        let list: Vec<Rndv> = std::mem::take(&mut *self.rndv.borrow_mut());
        for r in list {
            let mut msg = r.msg;
            msg.data = vec![0u8; r.len];
            // SAFETY: all-zero is a valid request param (no callback: the
            // request is polled by `reap_keeps`).
            let param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
            // SAFETY: desc came from the AM callback (which returned
            // UCS_INPROGRESS, so it is still valid); the buffer is the
            // message's own heap buffer, kept in `Keep::Recv` until the
            // request completes (a Vec's heap buffer does not move).
            let p = unsafe {
                sys::ucp_am_recv_data_nbx(
                    self.raw,
                    r.desc,
                    msg.data.as_mut_ptr().cast(),
                    r.len,
                    &param,
                )
            };
            // A failed rendezvous drops the message (its sender's endpoint
            // reports the failure).
            let seq = r.seq;
            if self
                .track(p, None, Keep::Recv(seq, msg), "ucp_am_recv_data_nbx")
                .is_err()
            {
                self.forget(seq);
            }
        }
    }
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        for p in self.pending.get_mut().drain(..) {
            // SAFETY: live requests of this worker: cancelled, then freed
            // (UCX releases a freed request when it completes).
            unsafe {
                sys::ucp_request_cancel(self.raw, p.request);
                sys::ucp_request_free(p.request);
            }
        }
        // SAFETY: every endpoint and listener holds an Rc of this, so all
        // are closed; the worker is destroyed once.
        unsafe { sys::ucp_worker_destroy(self.raw) };
    }
}

unsafe extern "C" fn am_callback(
    arg: *mut libc::c_void,
    header: *const libc::c_void,
    header_len: libc::size_t,
    data: *mut libc::c_void,
    len: libc::size_t,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the Box<Handler> registered for this id, alive as
    // long as the worker; the worker outlives every callback (callbacks
    // run only inside ucp_worker_progress on it).
    let h = unsafe { &*(arg as *const Handler) };
    // SAFETY: as above.
    let w = unsafe { &*h.worker };
    // SAFETY: UCX passes a valid param for the duration of the call.
    let param = unsafe { &*param };
    let from = if param.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP != 0 {
        w.eps.borrow().get(&(param.reply_ep as usize)).copied()
    } else {
        None
    };
    let header = if header_len == 0 {
        Vec::new()
    } else {
        // SAFETY: UCX passes header_len readable bytes at header.
        unsafe { std::slice::from_raw_parts(header as *const u8, header_len) }.to_vec()
    };
    let mut msg = AmMessage {
        id: h.id,
        header,
        data: Vec::new(),
        from,
    };
    if param.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 {
        let seq = w.arrive(from, None);
        w.rndv.borrow_mut().push(Rndv {
            desc: data,
            msg,
            len,
            seq,
        });
        return sys::UCS_INPROGRESS;
    }
    if len > 0 {
        // SAFETY: an eager message: len readable bytes at data, valid for
        // the duration of the call (UCS_OK is returned: UCX keeps them).
        msg.data = unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec();
    }
    w.arrive(from, Some(msg));
    sys::UCS_OK
}

/// A UCX worker: one per thread that talks over the fabric. Not `Send`
/// (everything made from it refers to it).
pub struct Worker(pub(crate) Rc<WorkerInner>);

impl Worker {
    pub fn new(ctx: &Context) -> Result<Worker> {
        // SAFETY: all-zero is a valid ucp_worker_params_t.
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        params.thread_mode = sys::UCS_THREAD_MODE_SERIALIZED;
        let mut raw: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: the context is live; params valid; raw an out pointer.
        check(
            unsafe { sys::ucp_worker_create(ctx.0.raw, &params, &mut raw) },
            "ucp_worker_create",
        )?;
        let mut efd = -1;
        // SAFETY: raw is the worker just made; efd an out pointer. The fd
        // belongs to the worker (not closed by us).
        let status = unsafe { sys::ucp_worker_get_efd(raw, &mut efd) };
        if status != sys::UCS_OK {
            // SAFETY: the worker just made, destroyed once.
            unsafe { sys::ucp_worker_destroy(raw) };
            return Err(Error::new(status, "ucp_worker_get_efd"));
        }
        Ok(Worker(Rc::new(WorkerInner {
            _ctx: ctx.clone(),
            raw,
            efd,
            am: RefCell::new(VecDeque::new()),
            rndv: RefCell::new(Vec::new()),
            next_seq: Cell::new(0),
            handlers: RefCell::new(Vec::new()),
            pending: RefCell::new(Vec::new()),
            eps: RefCell::new(HashMap::new()),
            failed: RefCell::new(Vec::new()),
            next_tag: Cell::new(1),
        })))
    }

    /// Receives active messages with this id into the worker's queue
    /// (`take_am`). Messages with ids no one registered are dropped.
    pub fn set_am_handler(&self, id: u32) -> Result<()> {
        let h = Box::new(Handler {
            id,
            worker: Rc::as_ptr(&self.0),
        });
        let arg = &*h as *const Handler as *mut libc::c_void;
        self.0.handlers.borrow_mut().push(h);
        // SAFETY: all-zero is a valid handler param.
        let mut p: sys::ucp_am_handler_param_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::UCP_AM_HANDLER_PARAM_FIELD_ID
            | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
            | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
            | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG;
        p.id = id;
        p.flags = sys::UCP_AM_FLAG_WHOLE_MSG;
        p.cb = Some(am_callback);
        p.arg = arg;
        // SAFETY: the worker is live; arg points into a Box kept in
        // `handlers` for the worker's life.
        check(
            unsafe { sys::ucp_worker_set_am_recv_handler(self.0.raw, &p) },
            "set_am_recv_handler",
        )
    }

    /// Makes progress: runs callbacks (messages, connection requests,
    /// endpoint errors), starts rendezvous receives, reaps finished
    /// operations. Returns how much happened (0: nothing).
    pub fn progress(&self) -> usize {
        let mut n = 0;
        loop {
            // SAFETY: the worker is live; no RefCell borrow is held across
            // the call (callbacks borrow).
            let k = unsafe { sys::ucp_worker_progress(self.0.raw) } as usize;
            self.0.start_rndv();
            let r = self.0.reap_keeps();
            n += k + r;
            if k == 0 && r == 0 {
                return n;
            }
        }
    }

    /// The next active message received, if any.
    /// Messages of one endpoint come in the order they were sent: one
    /// waits behind an earlier rendezvous message of its sender that is
    /// still being received.
    pub fn take_am(&self) -> Option<AmMessage> {
        let mut am = self.0.am.borrow_mut();
        let mut waiting: Vec<Option<u64>> = Vec::new();
        let i = am.iter().position(|a| {
            if a.msg.is_none() {
                waiting.push(a.from);
                return false;
            }
            !waiting.contains(&a.from)
        })?;
        am.remove(i).and_then(|a| a.msg)
    }

    /// Endpoints that failed since the last call (tag, UCX status): their
    /// peers are dead or unreachable.
    pub fn take_failures(&self) -> Vec<(u64, Error)> {
        std::mem::take(&mut *self.0.failed.borrow_mut())
            .into_iter()
            .map(|(t, s)| (t, Error::new(s, "endpoint failed")))
            .collect()
    }

    /// Operations still in flight.
    pub fn in_flight(&self) -> usize {
        self.0.pending.borrow().len()
    }

    /// The worker's event fd: readable when there may be something to
    /// progress after `arm` (poll it beside other fds).
    pub fn event_fd(&self) -> i32 {
        self.0.efd
    }

    /// Arms the event fd; `false` if there is work already (progress
    /// again instead of sleeping).
    pub fn arm(&self) -> bool {
        // SAFETY: the worker is live.
        let status = unsafe { sys::ucp_worker_arm(self.0.raw) };
        status != sys::UCS_ERR_BUSY
    }

    /// Progresses; if nothing happened, sleeps on the event fd up to
    /// `timeout` (None: until something arrives). Returns what progressed.
    pub fn wait(&self, timeout: Option<Duration>) -> usize {
        let n = self.progress() + self.0.ready();
        if n > 0 {
            return n;
        }
        if !self.arm() {
            return 1;
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let mut pfd = libc::pollfd {
            fd: self.0.efd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        self.progress()
    }

    /// Orders remote memory operations: puts/gets issued after the fence
    /// are performed after those issued before it (`ucp_worker_fence`).
    pub fn rma_fence(&self) -> Result<()> {
        // SAFETY: the worker is live.
        check(
            unsafe { sys::ucp_worker_fence(self.0.raw) },
            "ucp_worker_fence",
        )
    }

    /// Waits until every operation of the worker is complete at its
    /// target, progressing, at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        // SAFETY: all-zero: no callback, polled below.
        let param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: the worker is live.
        let p = unsafe { sys::ucp_worker_flush_nbx(self.0.raw, &param) };
        self.wait_request(p, timeout, "ucp_worker_flush_nbx")
    }

    /// Progresses until a request completes (then frees it) or `timeout`.
    pub(crate) fn wait_request(
        &self,
        p: sys::ucs_status_ptr_t,
        timeout: Duration,
        what: &'static str,
    ) -> Result<()> {
        if p.is_null() || sys::ptr_is_err(p) {
            return check(sys::ptr_status(p), what);
        }
        let deadline = Instant::now() + timeout;
        loop {
            self.progress();
            // SAFETY: p is a live request of this worker until freed below.
            let status = unsafe { sys::ucp_request_check_status(p) };
            if status != sys::UCS_INPROGRESS {
                // SAFETY: completed, freed once.
                unsafe { sys::ucp_request_free(p) };
                return check(status, what);
            }
            if Instant::now() >= deadline {
                // SAFETY: cancelled and freed once: UCX releases it when
                // the cancellation completes.
                unsafe {
                    sys::ucp_request_cancel(self.0.raw, p);
                    sys::ucp_request_free(p);
                }
                return Err(Error::new(-20, what));
            }
            self.wait(Some(Duration::from_millis(10)));
        }
    }
}
