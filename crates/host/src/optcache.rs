//! Socket options answered from the per-socket record (`socket.rs`).
//!
//! A socket with a descriptor in this process (`kernelfd`) reads every
//! option from the kernel with no round trip. One without (a connection
//! the server accepted) asks the server; for `TCP_NODELAY`, `SO_RCVTIMEO`
//! and `SO_SNDTIMEO` the server's answer is kept and later reads are
//! answered here. Only this process changes them (the server sets none of
//! them by itself), so the kept answer is the kernel's until this library
//! sets an option on the socket (any option: the `_NEW` timeout names alias
//! the old ones), the socket closes, or a fork shares it with another
//! process (which could set them: [`Client::share_sockets`]). The answer is
//! kept as the kernel gave it (timeouts rounded to its clock ticks), never
//! as the program set it.

use crate::client::Client;

/// The record's slot for an option this module keeps, and the length of
/// its whole value (an int; a `struct timeval`).
fn slot(level: i32, name: i32) -> Option<(usize, usize)> {
    let timeval = std::mem::size_of::<libc::timeval>();
    match (level, name) {
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Some((0, 4)),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => Some((1, timeval)),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => Some((2, timeval)),
        _ => None,
    }
}

impl Client {
    /// The kept value of option (`level`, `name`) of `s`, copied into
    /// `out` if it holds all of it: `Ok(length)`. Else `Err(generation)`,
    /// to hand to [`Client::keep_option`] with the server's answer.
    pub(crate) fn kept_option(
        &self,
        s: u32,
        level: i32,
        name: i32,
        out: &mut [u8],
    ) -> Result<usize, u32> {
        let Some(((i, _), sock)) = slot(level, name).zip(self.conn.socks.get(s)) else {
            return Err(0);
        };
        let g = sock.opts.lock();
        match g.vals[i].filter(|&(_, n)| !g.shared && out.len() >= n as usize) {
            Some((v, n)) => {
                let n = n as usize;
                out[..n].copy_from_slice(&v[..n]);
                Ok(n)
            }
            None => Err(g.gen),
        }
    }

    /// The server answered `out[..n]` for option (`level`, `name`) of `s`
    /// (from a buffer of `out.len()` bytes), asked for at generation `gen`:
    /// keep it if it is whole and no set came in between.
    pub(crate) fn keep_option(
        &self,
        s: u32,
        (level, name, gen): (i32, i32, u32),
        out: &[u8],
        n: usize,
    ) {
        let Some((i, whole)) = slot(level, name) else {
            return;
        };
        // The server read at most `out.len()` bytes: a value that filled
        // them and is shorter than the whole was cut short.
        if n > 16 || (n >= out.len() && n != whole) {
            return;
        }
        // An id without a record had none when asked (gen 0 then).
        let Ok(sock) = self.conn.socks.get_or_insert(s) else {
            return;
        };
        let mut g = sock.opts.lock();
        if !g.shared && g.gen == gen {
            let mut v = [0u8; 16];
            v[..n].copy_from_slice(&out[..n]);
            g.vals[i] = Some((v, n as u8));
        }
    }

    /// An option of `s` is being set: nothing kept holds any more. Called
    /// before and after the set, so an answer asked for before the set and
    /// kept while it ran is dropped too.
    pub(crate) fn forget_options(&self, s: u32) {
        if let Ok(sock) = self.conn.socks.get_or_insert(s) {
            let mut g = sock.opts.lock();
            g.vals = Default::default();
            g.gen = g.gen.wrapping_add(1);
        }
    }

    /// Sockets `ids` are shared with another process from now on (fork:
    /// the parent's and the child's): their options are read from the
    /// server every time, as the other process may set them.
    pub fn share_sockets(&self, ids: impl IntoIterator<Item = u32>) {
        for s in ids {
            if let Ok(sock) = self.conn.socks.get_or_insert(s) {
                let mut g = sock.opts.lock();
                g.shared = true;
                g.vals = Default::default();
                g.gen = g.gen.wrapping_add(1);
            }
        }
    }
}
