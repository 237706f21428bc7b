//! `ucp_listener`: accepts connections at a socket address; each arrives
//! as a [`ConnRequest`] the owner accepts (an endpoint) or rejects.

use crate::addr;
use crate::endpoint::{self, Endpoint};
use crate::error::{check, Error, Result};
use crate::sys;
use crate::worker::{Worker, WorkerInner};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ptr;
use std::rc::Rc;

pub(crate) struct ListenerInner {
    w: Rc<WorkerInner>,
    raw: sys::ucp_listener_h,
    queue: RefCell<VecDeque<sys::ucp_conn_request_h>>,
}

unsafe extern "C" fn conn_callback(req: sys::ucp_conn_request_h, arg: *mut libc::c_void) {
    // SAFETY: arg is the listener's inner state (inside an Rc), alive
    // until ucp_listener_destroy, after which no callback runs.
    let l = unsafe { &*(arg as *const ListenerInner) };
    l.queue.borrow_mut().push_back(req);
}

impl Drop for ListenerInner {
    fn drop(&mut self) {
        for req in self.queue.get_mut().drain(..) {
            // SAFETY: a request of this listener not accepted or rejected.
            unsafe { sys::ucp_listener_reject(self.raw, req) };
        }
        if self.raw.is_null() {
            return; // its creation failed (e.g. the address is in use)
        }
        // SAFETY: the listener is live and destroyed once; no ConnRequest
        // is left (each holds an Rc of this).
        unsafe { sys::ucp_listener_destroy(self.raw) };
    }
}

/// A listener. Its connection requests are queued by `Worker::progress`.
pub struct Listener(Rc<ListenerInner>);

/// A peer asking to connect: `accept` it or drop it (which rejects it).
pub struct ConnRequest {
    l: Rc<ListenerInner>,
    raw: sys::ucp_conn_request_h,
    done: bool,
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: a request of this listener, neither accepted nor
            // rejected before.
            unsafe { sys::ucp_listener_reject(self.l.raw, self.raw) };
        }
    }
}

impl Worker {
    /// Listens at `addr` (port 0: any free port, see `local_addr`).
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener> {
        let (ss, len) = addr::to_storage(&addr);
        let inner = Rc::new(ListenerInner {
            w: self.0.clone(),
            raw: ptr::null_mut(),
            queue: RefCell::new(VecDeque::new()),
        });
        // SAFETY: all-zero is a valid ucp_listener_params_t.
        let mut p: sys::ucp_listener_params_t = unsafe { std::mem::zeroed() };
        p.field_mask =
            sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        p.sockaddr = sys::ucs_sock_addr_t {
            addr: &ss as *const _ as *const libc::sockaddr,
            addrlen: len,
        };
        p.conn_handler = sys::ucp_listener_conn_handler_t {
            cb: Some(conn_callback),
            arg: Rc::as_ptr(&inner) as *mut libc::c_void,
        };
        let mut raw: sys::ucp_listener_h = ptr::null_mut();
        // SAFETY: the worker is live; p and the address are valid for the
        // call; the callback's arg lives as long as the listener.
        check(
            unsafe { sys::ucp_listener_create(self.0.raw, &p, &mut raw) },
            "ucp_listener_create",
        )?;
        // The Rc has one owner here, so the raw handle can be set in place.
        let mut inner = inner;
        match Rc::get_mut(&mut inner) {
            Some(i) => i.raw = raw,
            None => {
                // SAFETY: the listener just made, destroyed once.
                unsafe { sys::ucp_listener_destroy(raw) };
                return Err(Error::new(-5, "listener shared"));
            }
        }
        Ok(Listener(inner))
    }
}

impl Listener {
    /// The address it listens at (with the port chosen for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        // SAFETY: all-zero is a valid attr struct.
        let mut attr: sys::ucp_listener_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        // SAFETY: the listener is live; attr is an out struct.
        check(
            unsafe { sys::ucp_listener_query(self.0.raw, &mut attr) },
            "ucp_listener_query",
        )?;
        addr::from_storage(&attr.sockaddr).ok_or(Error::new(-7, "listener address"))
    }

    /// The next connection request, if one arrived (after progress).
    pub fn take_request(&self) -> Option<ConnRequest> {
        let raw = self.0.queue.borrow_mut().pop_front()?;
        Some(ConnRequest {
            l: self.0.clone(),
            raw,
            done: false,
        })
    }
}

impl ConnRequest {
    /// The connecting peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: all-zero is a valid attr struct.
        let mut attr: sys::ucp_conn_request_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
        // SAFETY: the request is live (not yet accepted or rejected).
        let status = unsafe { sys::ucp_conn_request_query(self.raw, &mut attr) };
        if status != sys::UCS_OK {
            return None;
        }
        addr::from_storage(&attr.client_address)
    }

    /// Accepts: an endpoint to the peer (error handling mode PEER).
    pub fn accept(mut self) -> Result<Endpoint> {
        // SAFETY: all-zero is a valid ucp_ep_params_t.
        let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_EP_PARAM_FIELD_CONN_REQUEST;
        params.conn_request = self.raw;
        // UCX consumes the request whether or not the endpoint is made.
        self.done = true;
        endpoint::create(&self.l.w, params)
    }
}
