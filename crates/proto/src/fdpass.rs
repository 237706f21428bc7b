//! Datagrams with descriptors (SCM_RIGHTS) on the SEQPACKET control socket:
//! the attach handshake passes the region memfd and the doorbell, memory
//! registration passes a host memfd. Both sides use these two functions.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Control-message buffer, aligned for `cmsghdr`; room for a few descriptors.
#[repr(C, align(8))]
struct CmsgBuf([u8; 128]);

/// Most descriptors one message may carry.
pub const MAX_FDS: usize = 8;

/// Sends one datagram with `fds` attached (none: a plain send).
pub fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    let mut cbuf = CmsgBuf([0; 128]);
    // SAFETY: msghdr is plain data; the fields we set point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is a pure size computation (≤ 128 for MAX_FDS).
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
        // SAFETY: the control buffer holds CMSG_SPACE(fd_bytes), so the first
        // header and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: msg points at valid buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok(())
}

/// Receives one datagram into `buf` (retrying EINTR) and every descriptor
/// passed with it, now owned by this process. Returns the datagram's length
/// (0: the peer hung up). A datagram or control data that did not fit is
/// EPROTO (its descriptors are closed).
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8], flags: i32) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cbuf = CmsgBuf([0; 128]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = cbuf.0.len() as _;
    let n = loop {
        // SAFETY: msg points to our iovec and control buffer, both valid
        // for the lengths recorded in it and alive across the call.
        let n = unsafe { libc::recvmsg(sock, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_control` with well-formed cmsghdrs up to
    // `msg_controllen`; CMSG_FIRSTHDR/NXTHDR stay inside it. SCM_RIGHTS data
    // are ints, read unaligned, each a descriptor now owned by this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let payload = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..payload / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok((n as usize, fds))
}
