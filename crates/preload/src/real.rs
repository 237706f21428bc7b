//! The real libc functions, found with `dlsym(RTLD_NEXT, name)` on first
//! use and cached. Every interposed function that passes a call through
//! (a kernel fd, a non-TCP socket) ends up here.

use libc::{c_char, c_int, c_uint, c_ulong, c_void, size_t, socklen_t, ssize_t};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Looks `name` (NUL-terminated) up in the libraries after us. A missing
/// libc symbol leaves nothing sensible to do: say which and abort.
fn resolve(name: &'static str) -> usize {
    // SAFETY: `name` is NUL-terminated; dlsym is thread-safe.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
    if p.is_null() {
        let msg = format!(
            "tcps preload: libc has no {}\n",
            name.trim_end_matches('\0')
        );
        // SAFETY: raw write of a local buffer to stderr, then abort.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p as usize
}

macro_rules! real {
    (@one $name:ident, $ty:ty) => {
        #[allow(dead_code)]
        pub fn $name() -> $ty {
            static P: AtomicUsize = AtomicUsize::new(0);
            let mut p = P.load(Ordering::Relaxed);
            if p == 0 {
                p = resolve(concat!(stringify!($name), "\0"));
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: `p` is the address of the libc function of this name,
            // whose C prototype is the one declared here.
            unsafe { std::mem::transmute::<usize, $ty>(p) }
        }
    };
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {$(
        real!(@one $name, unsafe extern "C" fn($($arg),*) -> $ret);
    )*};
    (variadic $($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {$(
        real!(@one $name, unsafe extern "C" fn($($arg),*, ...) -> $ret);
    )*};
}

real! {
    socket: fn(c_int, c_int, c_int) -> c_int;
    bind: fn(c_int, *const libc::sockaddr, socklen_t) -> c_int;
    listen: fn(c_int, c_int) -> c_int;
    accept: fn(c_int, *mut libc::sockaddr, *mut socklen_t) -> c_int;
    accept4: fn(c_int, *mut libc::sockaddr, *mut socklen_t, c_int) -> c_int;
    connect: fn(c_int, *const libc::sockaddr, socklen_t) -> c_int;
    shutdown: fn(c_int, c_int) -> c_int;
    getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    getsockname: fn(c_int, *mut libc::sockaddr, *mut socklen_t) -> c_int;
    getpeername: fn(c_int, *mut libc::sockaddr, *mut socklen_t) -> c_int;
    read: fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: fn(c_int, *const c_void, size_t) -> ssize_t;
    readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut libc::sockaddr, *mut socklen_t) -> ssize_t;
    sendto: fn(c_int, *const c_void, size_t, c_int, *const libc::sockaddr, socklen_t) -> ssize_t;
    recvmsg: fn(c_int, *mut libc::msghdr, c_int) -> ssize_t;
    sendmsg: fn(c_int, *const libc::msghdr, c_int) -> ssize_t;
    sendfile: fn(c_int, c_int, *mut libc::off_t, size_t) -> ssize_t;
    sendfile64: fn(c_int, c_int, *mut libc::off64_t, size_t) -> ssize_t;
    close: fn(c_int) -> c_int;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    poll: fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
    ppoll: fn(*mut libc::pollfd, libc::nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int;
    epoll_create1: fn(c_int) -> c_int;
    epoll_ctl: fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
    epoll_wait: fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
    epoll_pwait: fn(c_int, *mut libc::epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int;
    fork: fn() -> libc::pid_t;
    sigaction: fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
    sigset: fn(c_int, libc::sighandler_t) -> libc::sighandler_t;
    eventfd: fn(c_uint, c_int) -> c_int;
    execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    execv: fn(*const c_char, *const *const c_char) -> c_int;
    execvp: fn(*const c_char, *const *const c_char) -> c_int;
    execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
    posix_spawn: fn(*mut libc::pid_t, *const c_char, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, *const *mut c_char, *const *mut c_char) -> c_int;
    posix_spawnp: fn(*mut libc::pid_t, *const c_char, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, *const *mut c_char, *const *mut c_char) -> c_int;
    posix_spawn_file_actions_adddup2: fn(*mut libc::posix_spawn_file_actions_t, c_int, c_int) -> c_int;
    close_range: fn(c_uint, c_uint, c_int) -> c_int;
    closefrom: fn(c_int) -> ();
}

real! {
    variadic
    fcntl: fn(c_int, c_int) -> c_int;
    ioctl: fn(c_int, c_ulong) -> c_int;
}

/// poll(2) itself on kernel fds: how many are ready, or the errno.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout: c_int) -> Result<usize, i32> {
    // SAFETY: `fds` is a valid array of pollfds for its length.
    let n = unsafe { poll()(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    if n < 0 {
        Err(crate::errno::last_errno())
    } else {
        Ok(n as usize)
    }
}
