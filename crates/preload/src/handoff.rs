//! Handing offloaded sockets back to the kernel: before exec(2) (the new
//! image cannot use this process's attachment), before posix_spawn (its
//! child runs libc's own dup2 and execve, which this library never sees),
//! and before the program closes the library's own descriptors with
//! close_range/closefrom (CPython's subprocess does, between fork and
//! exec). `docs/PRELOAD.md` ("exec").
//!
//! A socket is taken out of the server (`ControlMsg::Export`) and its
//! kernel socket is dup2()ed over every fd naming it, with each fd's
//! O_NONBLOCK and FD_CLOEXEC: the process (and whatever it execs or
//! spawns) holds a plain kernel socket, connected and with its data, at the
//! same numbers, as it would without tcps.

use crate::log::{debug, emit};
use crate::{control, fdtable, real, state};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use tcps_proto::handshake::ControlMsg;

/// Hands back every offloaded socket that an fd without FD_CLOEXEC names
/// (those cross exec). Ok, or the errno of the first socket that could not
/// be handed back (each said on stderr); the others are handed back all
/// the same.
pub fn hand_back() -> Result<(), i32> {
    let mut first_err = Ok(());
    // The current attachment's sockets, or each server's of a group (a
    // dead one's have nothing to hand back).
    for (epoch, c) in state::members().filter(|(_, c)| c.is_attached()) {
        crate::sendq::flush_all(c);
        for (fd, id) in fdtable::all_in(epoch) {
            // SAFETY: F_GETFD on an fd we track.
            let fdflags = unsafe { real::fcntl()(fd, libc::F_GETFD) };
            if fdflags < 0 || fdflags & libc::FD_CLOEXEC != 0 {
                continue;
            }
            if let Err(e) = hand_back_id(epoch, c, fd, id) {
                first_err = first_err.and(Err(e));
            }
        }
    }
    first_err
}

/// Whether `fd` is the control socket of one of this process's live
/// attachments.
pub fn is_control_fd(fd: i32) -> bool {
    state::mode() == state::Mode::Offload && state::members().any(|(_, c)| c.control_fd() == fd)
}

/// The program closes descriptors `first..=last`: if the library's control
/// socket is among them the attachment ends there, so what must cross an
/// exec (the program is about to exec: CPython's subprocess, a daemon
/// closing every descriptor) is handed back first; a socket that cannot
/// be is said on stderr, and its exec refused.
pub fn before_closing(first: u32, last: u32) {
    if state::in_shared_child() {
        return;
    }
    let within = |fd: i32| u32::try_from(fd).is_ok_and(|fd| (first..=last).contains(&fd));
    if state::members().any(|(_, c)| within(c.control_fd())) {
        let _ = hand_back();
    }
}

/// Hands back the socket `fd` names, whatever its flags (posix_spawn's
/// dup2 file action will give it to the child). Ok if `fd` is not offloaded.
pub fn hand_back_fd(fd: i32) -> Result<(), i32> {
    let Some((epoch, id)) = fdtable::lookup_at(fd) else {
        return Ok(());
    };
    let Some(c) = state::client_at(epoch).filter(|_| state::in_group(epoch)) else {
        // The server of this socket is gone: nothing to hand back.
        return Err(libc::ENOTCONN);
    };
    crate::sendq::flush_all(c);
    hand_back_id(epoch, c, fd, id)
}

/// Sockets whose hand-back failed, with the errno: said once, and the
/// same errno again for another fd naming it or a later exec (after
/// close_range closed the control socket, a second try could only say
/// EBADF).
static REFUSED: Mutex<Vec<(u32, u32, i32)>> = Mutex::new(Vec::new());

fn refused(epoch: u32, id: u32) -> Option<i32> {
    let r = REFUSED.lock().unwrap_or_else(|p| p.into_inner());
    r.iter()
        .find(|&&(e, i, _)| (e, i) == (epoch, id))
        .map(|&(_, _, errno)| errno)
}

/// Socket `id` of `epoch` is closed: its id may name another one next.
pub fn forget_refused(epoch: u32, id: u32) {
    let mut r = REFUSED.lock().unwrap_or_else(|p| p.into_inner());
    if !r.is_empty() {
        r.retain(|&(e, i, _)| (e, i) != (epoch, id));
    }
}

/// Takes socket `id` (named by `fd`) of attachment `c` out of its server
/// and puts the kernel socket over every fd naming it.
fn hand_back_id(epoch: u32, c: &'static tcps::Client, fd: i32, id: u32) -> Result<(), i32> {
    if fdtable::lookup_at(fd) != Some((epoch, id)) {
        return Ok(()); // handed back already through another fd
    }
    if let Some(errno) = refused(epoch, id) {
        return Err(errno);
    }
    let kernel = export(c, fd, id).inspect_err(|&errno| {
        let mut r = REFUSED.lock().unwrap_or_else(|p| p.into_inner());
        r.push((epoch, id, errno));
    })?;
    // This process's own descriptor of it (`tcps::Client::kernel_fds`)
    // must not keep it open should the exec fail.
    c.forget_kernel_fd(id);
    for (other, e, oid) in fdtable::all_at() {
        if (e, oid) == (epoch, id) {
            put_over(&kernel, other);
            fdtable::remove(other);
            crate::epoll::forget_fd(other);
            debug!("fd {other} is now the kernel socket of tcps socket {id}");
        }
    }
    Ok(())
}

/// The kernel socket of `id`, taken from its server; an errno (said on
/// stderr) if the server keeps it.
fn export(c: &tcps::Client, fd: i32, id: u32) -> Result<OwnedFd, i32> {
    let errno = match control::exchange_on(c, ControlMsg::Export { handle: id }, &[]) {
        Ok((ControlMsg::Reply { handle, errno: 0 }, mut got)) if handle == id && got.len() == 1 => {
            return Ok(got.remove(0));
        }
        Ok((ControlMsg::Reply { errno, .. }, _)) if errno != 0 => errno,
        Ok(_) => libc::EPROTO,
        Err(e) => e,
    };
    let why = match errno {
        libc::EBUSY => "the server holds bytes or connections it read ahead that the program has not taken (a server run with --eager-recv off leaves them in the kernel), or calls wait on it",
        libc::EBADF => "the attachment's control socket is closed",
        _ => "the server refused",
    };
    emit(&format!(
        "fd {fd} (tcps socket {id}) cannot be handed to another program as a kernel socket: {why} ({})",
        std::io::Error::from_raw_os_error(errno)
    ));
    Err(errno)
}

/// dup2()s `kernel` over `fd`, keeping `fd`'s O_NONBLOCK and FD_CLOEXEC.
fn put_over(kernel: &OwnedFd, fd: i32) {
    let k = kernel.as_raw_fd();
    // SAFETY: plain fcntl/dup2 on descriptors we own or track.
    unsafe {
        let fl = real::fcntl()(fd, libc::F_GETFL);
        let kfl = real::fcntl()(k, libc::F_GETFL);
        let want = (kfl & !libc::O_NONBLOCK) | (fl & libc::O_NONBLOCK);
        real::fcntl()(k, libc::F_SETFL, want);
        let cloexec = real::fcntl()(fd, libc::F_GETFD) & libc::FD_CLOEXEC;
        if real::dup2()(k, fd) == fd {
            real::fcntl()(fd, libc::F_SETFD, cloexec);
        }
    }
}
