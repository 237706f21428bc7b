//! Hand-written declarations of the part of the UCX ucp C API (version
//! 1.13, `/usr/include/ucp/api/ucp.h`) this crate uses. Every parameter
//! struct is passed with a `field_mask` naming only the fields declared
//! here, in the header's order and with its types; UCX reads no field the
//! mask does not name, and the trailing `_reserved` bytes keep any field
//! it might add after them zeroed.
#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_uint, c_void, size_t, sockaddr, sockaddr_storage, socklen_t};

pub type ucs_status_t = c_int;
pub type ucs_status_ptr_t = *mut c_void;
pub type ucp_context_h = *mut c_void;
pub type ucp_config_t = c_void;
pub type ucp_worker_h = *mut c_void;
pub type ucp_ep_h = *mut c_void;
pub type ucp_listener_h = *mut c_void;
pub type ucp_conn_request_h = *mut c_void;
pub type ucp_mem_h = *mut c_void;
pub type ucp_rkey_h = *mut c_void;

pub const UCP_API_MAJOR: c_uint = 1;
pub const UCP_API_MINOR: c_uint = 13;

pub const UCS_OK: ucs_status_t = 0;
pub const UCS_INPROGRESS: ucs_status_t = 1;
pub const UCS_ERR_BUSY: ucs_status_t = -15;
pub const UCS_ERR_CANCELED: ucs_status_t = -16;
pub const UCS_ERR_CONNECTION_RESET: ucs_status_t = -25;
pub const UCS_ERR_NOT_CONNECTED: ucs_status_t = -24;
pub const UCS_ERR_LAST: ucs_status_t = -100;

pub const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub const UCP_FEATURE_RMA: u64 = 1 << 1;
pub const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub const UCP_FEATURE_AM: u64 = 1 << 6;

pub const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub const UCS_THREAD_MODE_SERIALIZED: c_int = 1;

pub const UCP_LISTENER_PARAM_FIELD_SOCK_ADDR: u64 = 1 << 0;
pub const UCP_LISTENER_PARAM_FIELD_CONN_HANDLER: u64 = 1 << 2;
pub const UCP_LISTENER_ATTR_FIELD_SOCKADDR: u64 = 1 << 0;
pub const UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR: u64 = 1 << 0;

pub const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub const UCP_EP_PARAM_FIELD_SOCK_ADDR: u64 = 1 << 4;
pub const UCP_EP_PARAM_FIELD_FLAGS: u64 = 1 << 5;
pub const UCP_EP_PARAM_FIELD_CONN_REQUEST: u64 = 1 << 6;
pub const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
pub const UCP_EP_PARAMS_FLAGS_CLIENT_SERVER: c_uint = 1 << 0;
pub const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

pub const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;
pub const UCP_MEM_MAP_PARAM_FIELD_PROT: u64 = 1 << 3;
pub const UCP_MEM_MAP_PROT_LOCAL_READ: c_uint = 1 << 0;
pub const UCP_MEM_MAP_PROT_LOCAL_WRITE: c_uint = 1 << 1;
pub const UCP_MEM_MAP_PROT_REMOTE_READ: c_uint = 1 << 8;
pub const UCP_MEM_MAP_PROT_REMOTE_WRITE: c_uint = 1 << 9;

pub const UCP_OP_ATTR_FIELD_CALLBACK: u32 = 1 << 1;
pub const UCP_OP_ATTR_FIELD_USER_DATA: u32 = 1 << 2;
pub const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
pub const UCP_AM_SEND_FLAG_REPLY: u32 = 1 << 0;

pub const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub const UCP_AM_HANDLER_PARAM_FIELD_FLAGS: u64 = 1 << 1;
pub const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;
pub const UCP_AM_FLAG_WHOLE_MSG: u32 = 1 << 0;
pub const UCP_AM_RECV_ATTR_FIELD_REPLY_EP: u64 = 1 << 0;
pub const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

pub type ucp_err_handler_cb_t = Option<unsafe extern "C" fn(*mut c_void, ucp_ep_h, ucs_status_t)>;
pub type ucp_listener_conn_callback_t =
    Option<unsafe extern "C" fn(ucp_conn_request_h, *mut c_void)>;
pub type ucp_send_nbx_callback_t =
    Option<unsafe extern "C" fn(*mut c_void, ucs_status_t, *mut c_void)>;
pub type ucp_am_recv_callback_t = Option<
    unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        size_t,
        *mut c_void,
        size_t,
        *const ucp_am_recv_param_t,
    ) -> ucs_status_t,
>;

#[repr(C)]
pub struct ucp_params_t {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: size_t,
    pub request_init: *const c_void,
    pub request_cleanup: *const c_void,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: size_t,
    pub estimated_num_ppn: size_t,
    pub name: *const c_char,
    pub _reserved: [u8; 64],
}

#[repr(C)]
pub struct ucp_worker_params_t {
    pub field_mask: u64,
    pub thread_mode: c_int,
    /// `cpu_mask` and the rest: never named in `field_mask`.
    pub _reserved: [u8; 256],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucs_sock_addr_t {
    pub addr: *const sockaddr,
    pub addrlen: socklen_t,
}

#[repr(C)]
pub struct ucp_err_handler_t {
    pub cb: ucp_err_handler_cb_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_ep_params_t {
    pub field_mask: u64,
    pub address: *const c_void,
    pub err_mode: c_int,
    pub err_handler: ucp_err_handler_t,
    pub user_data: *mut c_void,
    pub flags: c_uint,
    pub sockaddr: ucs_sock_addr_t,
    pub conn_request: ucp_conn_request_h,
    pub name: *const c_char,
    pub local_sockaddr: ucs_sock_addr_t,
    pub _reserved: [u8; 64],
}

#[repr(C)]
pub struct ucp_listener_conn_handler_t {
    pub cb: ucp_listener_conn_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_listener_params_t {
    pub field_mask: u64,
    pub sockaddr: ucs_sock_addr_t,
    /// `accept_handler` (cb, arg): never named in `field_mask`.
    pub accept_handler: [*mut c_void; 2],
    pub conn_handler: ucp_listener_conn_handler_t,
    pub _reserved: [u8; 64],
}

#[repr(C)]
pub struct ucp_listener_attr_t {
    pub field_mask: u64,
    pub sockaddr: sockaddr_storage,
}

#[repr(C)]
pub struct ucp_conn_request_attr_t {
    pub field_mask: u64,
    pub client_address: sockaddr_storage,
    pub client_id: u64,
}

#[repr(C)]
pub struct ucp_mem_map_params_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: size_t,
    pub flags: c_uint,
    pub prot: c_uint,
    pub memory_type: c_int,
    pub _reserved: [u8; 64],
}

#[repr(C)]
pub struct ucp_am_handler_param_t {
    pub field_mask: u64,
    pub id: c_uint,
    pub flags: u32,
    pub cb: ucp_am_recv_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_am_recv_param_t {
    pub recv_attr: u64,
    pub reply_ep: ucp_ep_h,
}

/// `ucp_request_param_t`: only `op_attr_mask`, `flags`, the callback (the
/// first member of a union of callbacks, all pointer sized) and
/// `user_data` are ever named.
#[repr(C)]
pub struct ucp_request_param_t {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    pub cb: *const c_void,
    pub datatype: u64,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: c_int,
    pub recv_info: *mut c_void,
    pub memh: *mut c_void,
    pub _reserved: [u8; 64],
}

#[link(name = "ucp")]
extern "C" {
    pub fn ucp_config_read(
        env_prefix: *const c_char,
        filename: *const c_char,
        config_p: *mut *mut ucp_config_t,
    ) -> ucs_status_t;
    pub fn ucp_config_modify(
        config: *mut ucp_config_t,
        name: *const c_char,
        value: *const c_char,
    ) -> ucs_status_t;
    pub fn ucp_config_release(config: *mut ucp_config_t);
    pub fn ucp_init_version(
        api_major: c_uint,
        api_minor: c_uint,
        params: *const ucp_params_t,
        config: *const ucp_config_t,
        context_p: *mut ucp_context_h,
    ) -> ucs_status_t;
    pub fn ucp_cleanup(context: ucp_context_h);

    pub fn ucp_worker_create(
        context: ucp_context_h,
        params: *const ucp_worker_params_t,
        worker_p: *mut ucp_worker_h,
    ) -> ucs_status_t;
    pub fn ucp_worker_destroy(worker: ucp_worker_h);
    pub fn ucp_worker_progress(worker: ucp_worker_h) -> c_uint;
    pub fn ucp_worker_get_efd(worker: ucp_worker_h, fd: *mut c_int) -> ucs_status_t;
    pub fn ucp_worker_arm(worker: ucp_worker_h) -> ucs_status_t;
    pub fn ucp_worker_fence(worker: ucp_worker_h) -> ucs_status_t;
    pub fn ucp_worker_flush_nbx(
        worker: ucp_worker_h,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_worker_set_am_recv_handler(
        worker: ucp_worker_h,
        param: *const ucp_am_handler_param_t,
    ) -> ucs_status_t;

    pub fn ucp_listener_create(
        worker: ucp_worker_h,
        params: *const ucp_listener_params_t,
        listener_p: *mut ucp_listener_h,
    ) -> ucs_status_t;
    pub fn ucp_listener_destroy(listener: ucp_listener_h);
    pub fn ucp_listener_query(
        listener: ucp_listener_h,
        attr: *mut ucp_listener_attr_t,
    ) -> ucs_status_t;
    pub fn ucp_listener_reject(
        listener: ucp_listener_h,
        conn_request: ucp_conn_request_h,
    ) -> ucs_status_t;
    pub fn ucp_conn_request_query(
        conn_request: ucp_conn_request_h,
        attr: *mut ucp_conn_request_attr_t,
    ) -> ucs_status_t;

    pub fn ucp_ep_create(
        worker: ucp_worker_h,
        params: *const ucp_ep_params_t,
        ep_p: *mut ucp_ep_h,
    ) -> ucs_status_t;
    pub fn ucp_ep_close_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    pub fn ucp_ep_flush_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;

    pub fn ucp_am_send_nbx(
        ep: ucp_ep_h,
        id: c_uint,
        header: *const c_void,
        header_length: size_t,
        buffer: *const c_void,
        count: size_t,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_am_recv_data_nbx(
        worker: ucp_worker_h,
        data_desc: *mut c_void,
        buffer: *mut c_void,
        count: size_t,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;

    pub fn ucp_mem_map(
        context: ucp_context_h,
        params: *const ucp_mem_map_params_t,
        memh_p: *mut ucp_mem_h,
    ) -> ucs_status_t;
    pub fn ucp_mem_unmap(context: ucp_context_h, memh: ucp_mem_h) -> ucs_status_t;
    pub fn ucp_rkey_pack(
        context: ucp_context_h,
        memh: ucp_mem_h,
        rkey_buffer_p: *mut *mut c_void,
        size_p: *mut size_t,
    ) -> ucs_status_t;
    pub fn ucp_rkey_buffer_release(rkey_buffer: *mut c_void);
    pub fn ucp_ep_rkey_unpack(
        ep: ucp_ep_h,
        rkey_buffer: *const c_void,
        rkey_p: *mut ucp_rkey_h,
    ) -> ucs_status_t;
    pub fn ucp_rkey_destroy(rkey: ucp_rkey_h);
    pub fn ucp_put_nbx(
        ep: ucp_ep_h,
        buffer: *const c_void,
        count: size_t,
        remote_addr: u64,
        rkey: ucp_rkey_h,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    pub fn ucp_get_nbx(
        ep: ucp_ep_h,
        buffer: *mut c_void,
        count: size_t,
        remote_addr: u64,
        rkey: ucp_rkey_h,
        param: *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;

    pub fn ucp_request_check_status(request: *mut c_void) -> ucs_status_t;
    pub fn ucp_request_free(request: *mut c_void);
    pub fn ucp_request_cancel(worker: ucp_worker_h, request: *mut c_void);
}

#[link(name = "ucs")]
extern "C" {
    pub fn ucs_status_string(status: ucs_status_t) -> *const c_char;
}

/// `UCS_PTR_IS_ERR`: the pointer is an error status, not a request.
pub fn ptr_is_err(p: ucs_status_ptr_t) -> bool {
    (p as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_STATUS` for a pointer that is null or an error.
pub fn ptr_status(p: ucs_status_ptr_t) -> ucs_status_t {
    if p.is_null() {
        UCS_OK
    } else if ptr_is_err(p) {
        p as isize as ucs_status_t
    } else {
        UCS_INPROGRESS
    }
}
