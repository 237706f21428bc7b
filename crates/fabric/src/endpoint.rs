//! `ucp_ep`: a connection to a peer's worker, with error handling mode
//! PEER (a peer that dies or a link that breaks is reported on the
//! endpoint and in `Worker::take_failures`, and its operations fail
//! instead of hanging); active-message sends, remote memory access.

use crate::addr;
use crate::error::{check, Error, Result};
use crate::memory::Memory;
use crate::sys;
use crate::worker::{Keep, Worker, WorkerInner};
use std::cell::Cell;
use std::net::SocketAddr;
use std::ptr;
use std::rc::Rc;
use std::time::Duration;

/// What the error callback writes: the endpoint's first failure.
struct EpState {
    tag: u64,
    worker: *const WorkerInner,
    status: Cell<i32>,
}

pub(crate) struct EpInner {
    w: Rc<WorkerInner>,
    raw: sys::ucp_ep_h,
    state: *mut EpState,
}

unsafe extern "C" fn err_callback(
    arg: *mut libc::c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: arg is the endpoint's Box<EpState>, freed only after the
    // endpoint is closed (after which UCX calls no callback of it); its
    // worker outlives it.
    let st = unsafe { &*(arg as *const EpState) };
    if st.status.get() == sys::UCS_OK {
        st.status.set(status);
        // SAFETY: as above.
        unsafe { &*st.worker }
            .failed
            .borrow_mut()
            .push((st.tag, status));
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        // SAFETY: all-zero is a valid param. The close is forced: it
        // waits for nothing from the peer (which may be dead, or a worker
        // of this thread that is not progressing); operations still in
        // flight fail with UCS_ERR_CANCELED (flush first to be sure the
        // peer has everything); the peer sees the endpoint fail.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        // SAFETY: the endpoint is live and closed once.
        let p = unsafe { sys::ucp_ep_close_nbx(self.raw, &param) };
        let worker = Worker(self.w.clone());
        let _ = worker.wait_request(p, Duration::from_secs(1), "ucp_ep_close_nbx");
        self.w.eps.borrow_mut().remove(&(self.raw as usize));
        // SAFETY: closed: no callback refers to the state any more.
        drop(unsafe { Box::from_raw(self.state) });
    }
}

/// A connected endpoint. Identified by its `tag` (unique in its worker),
/// which `AmMessage::from` and `Worker::take_failures` name.
pub struct Endpoint(pub(crate) Rc<EpInner>);

/// A peer's registered memory: its unpacked rkey, base address and length.
/// Puts and gets are checked against the length before they are issued.
pub struct RemoteRegion {
    ep: Rc<EpInner>,
    rkey: sys::ucp_rkey_h,
    base: u64,
    len: usize,
}

impl Drop for RemoteRegion {
    fn drop(&mut self) {
        // SAFETY: unpacked on `ep`, which this holds (so it is still open);
        // destroyed once.
        unsafe { sys::ucp_rkey_destroy(self.rkey) };
    }
}

impl RemoteRegion {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at(&self, off: usize, len: usize) -> Result<u64> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.base + off as u64),
            _ => Err(Error::new(-19, "remote range out of bounds")),
        }
    }
}

fn new_state(w: &Rc<WorkerInner>) -> *mut EpState {
    let tag = w.next_tag.get();
    w.next_tag.set(tag + 1);
    Box::into_raw(Box::new(EpState {
        tag,
        worker: Rc::as_ptr(w),
        status: Cell::new(sys::UCS_OK),
    }))
}

/// Makes an endpoint from `params` (the caller fills the address or the
/// connection request); adds error handling mode PEER and the callback.
pub(crate) fn create(w: &Rc<WorkerInner>, mut params: sys::ucp_ep_params_t) -> Result<Endpoint> {
    let state = new_state(w);
    params.field_mask |=
        sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler = sys::ucp_err_handler_t {
        cb: Some(err_callback),
        arg: state.cast(),
    };
    let mut raw: sys::ucp_ep_h = ptr::null_mut();
    // SAFETY: the worker is live; params (and the address it points to)
    // are valid for the call; raw is an out pointer.
    let status = unsafe { sys::ucp_ep_create(w.raw, &params, &mut raw) };
    if status != sys::UCS_OK {
        // SAFETY: no endpoint refers to the state.
        drop(unsafe { Box::from_raw(state) });
        return Err(Error::new(status, "ucp_ep_create"));
    }
    // SAFETY: state is live (owned by the endpoint from here on).
    let tag = unsafe { &*state }.tag;
    w.eps.borrow_mut().insert(raw as usize, tag);
    Ok(Endpoint(Rc::new(EpInner {
        w: w.clone(),
        raw,
        state,
    })))
}

impl Worker {
    /// Connects to a listener at `addr` (client-server mode).
    pub fn connect(&self, addr: SocketAddr) -> Result<Endpoint> {
        let (ss, len) = addr::to_storage(&addr);
        // SAFETY: all-zero is a valid ucp_ep_params_t.
        let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_EP_PARAM_FIELD_FLAGS | sys::UCP_EP_PARAM_FIELD_SOCK_ADDR;
        params.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        params.sockaddr = sys::ucs_sock_addr_t {
            addr: &ss as *const _ as *const libc::sockaddr,
            addrlen: len,
        };
        create(&self.0, params)
    }
}

impl Endpoint {
    pub fn tag(&self) -> u64 {
        // SAFETY: the state lives as long as the endpoint.
        unsafe { &*self.0.state }.tag
    }

    /// Ok while the endpoint works; its failure once the error callback
    /// reported one (the peer died, the link broke).
    pub fn status(&self) -> Result<()> {
        // SAFETY: as in `tag`.
        check(unsafe { &*self.0.state }.status.get(), "endpoint")
    }

    /// Sends an active message (header and data are copied into buffers the
    /// worker keeps until UCX is done with them). With `reply`, the
    /// receiver learns which of its endpoints it came on
    /// (`AmMessage::from`).
    pub fn am_send(&self, id: u32, header: &[u8], data: Vec<u8>, reply: bool) -> Result<()> {
        self.status()?;
        let header = header.to_vec();
        // SAFETY: all-zero is a valid param; flags only.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        if reply {
            param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = sys::UCP_AM_SEND_FLAG_REPLY;
        }
        // SAFETY: the endpoint is live; header and data are heap buffers
        // that move into the worker's keep list until the request
        // completes (a Vec's heap buffer does not move).
        let p = unsafe {
            sys::ucp_am_send_nbx(
                self.0.raw,
                id,
                header.as_ptr().cast(),
                header.len(),
                data.as_ptr().cast(),
                data.len(),
                &param,
            )
        };
        self.0.w.track(
            p,
            Some(self.tag()),
            Keep::Bytes(header, data),
            "ucp_am_send_nbx",
        )
    }

    /// Unpacks a peer's rkey (`Memory::pack_rkey`) describing `len` bytes
    /// at its address `base`.
    pub fn remote_region(&self, packed: &[u8], base: u64, len: usize) -> Result<RemoteRegion> {
        let mut rkey: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: the endpoint is live; UCX validates the packed bytes
        // (a bad buffer is an error status); rkey is an out pointer.
        check(
            unsafe { sys::ucp_ep_rkey_unpack(self.0.raw, packed.as_ptr().cast(), &mut rkey) },
            "ucp_ep_rkey_unpack",
        )?;
        Ok(RemoteRegion {
            ep: self.0.clone(),
            rkey,
            base,
            len,
        })
    }

    fn check_region(&self, r: &RemoteRegion) -> Result<()> {
        if !Rc::ptr_eq(&r.ep, &self.0) {
            return Err(Error::new(-5, "remote region of another endpoint"));
        }
        self.status()
    }

    /// Writes `len` bytes of `src` at `src_off` into the peer's region at
    /// `dst_off` (`ucp_put_nbx`). Complete at the target after a flush;
    /// ordered after earlier puts only across `Worker::fence`.
    pub fn put(
        &self,
        src: &Memory,
        src_off: usize,
        len: usize,
        dst: &RemoteRegion,
        dst_off: usize,
    ) -> Result<()> {
        self.check_region(dst)?;
        let from = src.range(src_off, len)?;
        let to = dst.at(dst_off, len)?;
        // SAFETY: all-zero: no callback (polled by the worker).
        let param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: from..from+len is inside `src`, kept alive (Keep::Mem)
        // until the request completes; the remote range was checked
        // against the region's length.
        let p = unsafe { sys::ucp_put_nbx(self.0.raw, from.cast(), len, to, dst.rkey, &param) };
        self.0
            .w
            .track(p, Some(self.tag()), Keep::Mem(src.0.clone()), "ucp_put_nbx")
    }

    /// Writes `data` into the peer's region at `dst_off`.
    pub fn put_bytes(&self, data: Vec<u8>, dst: &RemoteRegion, dst_off: usize) -> Result<()> {
        self.check_region(dst)?;
        let to = dst.at(dst_off, data.len())?;
        // SAFETY: all-zero: no callback.
        let param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: data's heap buffer is kept (Keep::Bytes) until the
        // request completes; the remote range was checked.
        let p = unsafe {
            sys::ucp_put_nbx(
                self.0.raw,
                data.as_ptr().cast(),
                data.len(),
                to,
                dst.rkey,
                &param,
            )
        };
        self.0.w.track(
            p,
            Some(self.tag()),
            Keep::Bytes(Vec::new(), data),
            "ucp_put_nbx",
        )
    }

    /// Reads `len` bytes of the peer's region at `src_off` into `dst` at
    /// `dst_off` (`ucp_get_nbx`); the bytes are there once the worker has
    /// reaped the operation (`Worker::in_flight`, `flush`).
    pub fn get(
        &self,
        dst: &Memory,
        dst_off: usize,
        len: usize,
        src: &RemoteRegion,
        src_off: usize,
    ) -> Result<()> {
        self.check_region(src)?;
        let to = dst.range(dst_off, len)?;
        let from = src.at(src_off, len)?;
        // SAFETY: all-zero: no callback.
        let param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: to..to+len is inside `dst`, kept alive until the request
        // completes; the remote range was checked.
        let p = unsafe { sys::ucp_get_nbx(self.0.raw, to.cast(), len, from, src.rkey, &param) };
        self.0
            .w
            .track(p, Some(self.tag()), Keep::Mem(dst.0.clone()), "ucp_get_nbx")
    }

    /// Waits until every operation on this endpoint is complete at the
    /// peer (`ucp_ep_flush_nbx`), at most `timeout`, progressing this
    /// worker only (the peer progresses on its own).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let mut f = self.flush_begin()?;
        let worker = Worker(self.0.w.clone());
        let deadline = std::time::Instant::now() + timeout;
        loop {
            worker.progress();
            if let Some(res) = f.poll() {
                res?;
                return self.status();
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::new(-20, "ucp_ep_flush_nbx"));
            }
            worker.wait(Some(Duration::from_millis(10)));
        }
    }

    /// Starts a flush without waiting: `Flushing::poll` after progress.
    pub fn flush_begin(&self) -> Result<Flushing> {
        self.status()?;
        // SAFETY: all-zero: no callback.
        let param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: the endpoint is live.
        let p = unsafe { sys::ucp_ep_flush_nbx(self.0.raw, &param) };
        if p.is_null() || sys::ptr_is_err(p) {
            return check(sys::ptr_status(p), "ucp_ep_flush_nbx").map(|_| Flushing {
                ep: self.0.clone(),
                req: None,
            });
        }
        Ok(Flushing {
            ep: self.0.clone(),
            req: Some(p),
        })
    }
}

/// A flush in progress (`Endpoint::flush_begin`); dropping it cancels it.
pub struct Flushing {
    ep: Rc<EpInner>,
    req: Option<sys::ucs_status_ptr_t>,
}

impl Flushing {
    /// `Some` once the flush finished (Ok: everything before it is
    /// complete at the peer).
    pub fn poll(&mut self) -> Option<Result<()>> {
        let Some(p) = self.req else {
            return Some(Ok(()));
        };
        // SAFETY: p is a live request of the endpoint's worker.
        let status = unsafe { sys::ucp_request_check_status(p) };
        if status == sys::UCS_INPROGRESS {
            return None;
        }
        // SAFETY: completed, freed once (req is cleared).
        unsafe { sys::ucp_request_free(p) };
        self.req = None;
        Some(check(status, "ucp_ep_flush_nbx"))
    }
}

impl Drop for Flushing {
    fn drop(&mut self) {
        if let Some(p) = self.req.take() {
            // SAFETY: a live request: cancelled and freed once (UCX
            // releases it when the cancellation completes).
            unsafe {
                sys::ucp_request_cancel(self.ep.w.raw, p);
                sys::ucp_request_free(p);
            }
        }
    }
}
