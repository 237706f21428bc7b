//! `ucp_context`: the library's global state, with the features tcps uses
//! (active messages, remote memory access, wake-up on an event fd).

use crate::error::{check, Error, Result};
use crate::sys;
use std::ffi::CString;
use std::ptr;
use std::sync::Arc;

/// Options read before the context is made. Anything not set comes from
/// UCX's own environment (`UCX_TLS`, `UCX_NET_DEVICES`, …).
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// `UCX_TLS`, e.g. `"tcp"` or `"shm,tcp"` (transports to use).
    pub transports: Option<String>,
    /// Remote memory access (`UCP_FEATURE_RMA`): puts and gets, and being
    /// their target. **Only toward trusted peers**: where the transport has
    /// no RDMA (tcp, shm without cma), UCX emulates a put with an active
    /// message that writes at whatever address the initiator names, with
    /// no check against a registration — any peer connected to a worker
    /// of an RMA context can write anywhere in its process. A TCP server
    /// therefore leaves this off and takes host data as active messages.
    pub rma: bool,
    /// `UCX_CM_REUSEADDR=y` unless the environment says otherwise: a
    /// listener binds its address even while connections of a previous
    /// one on it are in TIME_WAIT (a server restarted at once; without it
    /// the bind fails with EADDRINUSE for a minute).
    pub reuse_addr: bool,
}

pub(crate) struct ContextInner {
    pub(crate) raw: sys::ucp_context_h,
}

// SAFETY: the context is made with `mt_workers_shared = 1`, so UCX makes
// its use from workers of several threads safe; this crate calls only
// worker creation and memory (un)mapping on it after init.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: every worker and memory holds an Arc of this context, so
        // none is left when the last reference drops.
        unsafe { sys::ucp_cleanup(self.raw) };
    }
}

/// `ucp_config_modify(config, name, value)` (UCP's own settings and the
/// transports', as the `UCX_` environment variable without its prefix).
fn modify(config: *mut sys::ucp_config_t, name: &str, value: &str) -> Result<()> {
    let n = CString::new(name).map_err(|_| Error::new(-5, "config name"))?;
    let v = CString::new(value).map_err(|_| Error::new(-5, "config value"))?;
    // SAFETY: config is live; both strings are NUL-terminated and outlive
    // the call (UCX copies them).
    check(
        unsafe { sys::ucp_config_modify(config, n.as_ptr(), v.as_ptr()) },
        "ucp_config_modify",
    )
}

/// A UCX context (cheap to clone; released when the last clone, worker
/// and memory of it are gone).
#[derive(Clone)]
pub struct Context(pub(crate) Arc<ContextInner>);

impl Context {
    pub fn new(opts: &ContextOptions) -> Result<Context> {
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: null prefix and file name mean the defaults; config is
        // an out pointer.
        check(
            unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) },
            "ucp_config_read",
        )?;
        let result = Self::init(opts, config);
        // SAFETY: config came from ucp_config_read and is released once.
        unsafe { sys::ucp_config_release(config) };
        result
    }

    fn init(opts: &ContextOptions, config: *mut sys::ucp_config_t) -> Result<Context> {
        if let Some(tls) = &opts.transports {
            modify(config, "TLS", tls)?;
        }
        let said = |v: &str| std::env::var_os(v).is_some();
        if opts.reuse_addr && !said("UCX_CM_REUSEADDR") && !said("UCX_TCP_CM_REUSEADDR") {
            modify(config, "CM_REUSEADDR", "y")?;
        }
        // SAFETY: all-zero is a valid ucp_params_t (null pointers, 0s).
        let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED;
        params.features = sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP;
        if opts.rma {
            params.features |= sys::UCP_FEATURE_RMA;
        }
        params.mt_workers_shared = 1;
        let mut raw: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params and config are valid for the call; raw is an out
        // pointer.
        check(
            unsafe {
                sys::ucp_init_version(
                    sys::UCP_API_MAJOR,
                    sys::UCP_API_MINOR,
                    &params,
                    config,
                    &mut raw,
                )
            },
            "ucp_init",
        )?;
        Ok(Context(Arc::new(ContextInner { raw })))
    }
}
