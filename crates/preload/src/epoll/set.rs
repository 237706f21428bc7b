//! An epoll set's offloaded entries and its ready list, fed by the host's
//! ready log (see the module above).

use super::entry::Entry;
use crate::fdtable;
use libc::{c_int, epoll_event};
use std::collections::BTreeMap;
use tcps::Client;

#[derive(Default)]
pub struct Set {
    /// Offloaded fds registered in this set.
    pub(super) entries: BTreeMap<c_int, Entry>,
    /// The fds of `entries` by socket id (dup'd fds share one).
    pub(super) by_id: BTreeMap<u32, Vec<c_int>>,
    /// The ready list: the entries a wait looks at (see the module docs).
    pub(super) ready: Vec<c_int>,
    /// How far this set has read the host's ready log (None: not yet).
    pub(super) log_cursor: Option<u32>,
    /// `fdtable::rescan_epoch` when the set last looked at everything.
    pub(super) rescan: u32,
    /// Kernel fds registered in the real epoll fd (saturating; a closed fd
    /// leaves the count high, which only costs a real epoll_wait).
    pub(super) kernel_fds: usize,
    /// The attachment epoch whose sockets the set watches at the server
    /// (0: not looked at yet); entries of other epochs are a dead
    /// attachment's (`--reattach`).
    pub(super) epoch: u32,
    /// Entries of a dead attachment not looked at since the set moved to a
    /// new one: each reports its reset once (`gone.rs`), then is quiet.
    pub(super) stale: Vec<c_int>,
}

impl Set {
    /// Puts `fd`'s entry on the ready list (once).
    pub(super) fn list(&mut self, fd: c_int) {
        if let Some(e) = self.entries.get_mut(&fd) {
            if !e.listed {
                e.listed = true;
                self.ready.push(fd);
            }
        }
    }

    pub(super) fn insert(&mut self, fd: c_int, e: Entry) {
        let id = e.id;
        if let Some(old) = self.entries.insert(fd, e) {
            self.unindex(fd, old.id);
            self.ready.retain(|&f| f != fd);
        }
        if self.epoch != 0 && self.entries.get(&fd).is_some_and(|e| e.epoch != self.epoch) {
            self.stale.push(fd);
            return;
        }
        self.by_id.entry(id).or_default().push(fd);
        self.list(fd); // looked at once, as the kernel's ctl does
    }

    /// Moves the set to attachment epoch `cur` (after a reattach): an
    /// entry whose fd names a socket of `cur` now (a listener taken over)
    /// watches that socket, its edges fresh; entries of older epochs are
    /// stale; the ready log of the new attachment is read from its start.
    pub(super) fn refresh(&mut self, cur: u32) {
        if self.epoch == cur {
            return;
        }
        let first = self.epoch == 0;
        self.epoch = cur;
        self.by_id.clear();
        self.ready.clear();
        self.stale.clear();
        let fds: Vec<c_int> = self.entries.keys().copied().collect();
        for fd in fds {
            let Some(e) = self.entries.get_mut(&fd) else {
                continue;
            };
            e.listed = false;
            match fdtable::lookup_at(fd) {
                Some((ne, nid)) if ne == cur && (ne, nid) != (e.epoch, e.id) => {
                    let ev = epoll_event {
                        events: e.events,
                        u64: e.data,
                    };
                    let disabled = e.disabled;
                    *e = Entry::new(ne, nid, &ev);
                    e.disabled = disabled;
                }
                _ => {}
            }
            if e.epoch == cur {
                self.by_id.entry(e.id).or_default().push(fd);
            } else {
                self.stale.push(fd);
            }
        }
        if !first {
            self.log_cursor = None; // everything is looked at once
        }
    }

    pub(super) fn remove(&mut self, fd: c_int) -> Option<Entry> {
        let e = self.entries.remove(&fd)?;
        self.unindex(fd, e.id);
        if e.listed {
            self.ready.retain(|&f| f != fd);
        }
        self.stale.retain(|&f| f != fd);
        Some(e)
    }

    pub(super) fn unindex(&mut self, fd: c_int, id: u32) {
        if let Some(v) = self.by_id.get_mut(&id) {
            v.retain(|&f| f != fd);
            if v.is_empty() {
                self.by_id.remove(&id);
            }
        }
    }

    /// Lists the entries of the sockets the server published into since
    /// the last look (the host's ready log); everything when the log
    /// overflowed, on the first look, or after a rescan was asked for.
    pub(super) fn refill(&mut self, c: &Client) {
        let epoch = fdtable::rescan_epoch();
        let mut all = epoch != self.rescan;
        self.rescan = epoch;
        let mut ids = Vec::new();
        match self.log_cursor.as_mut() {
            None => {
                self.log_cursor = Some(c.ready_log_tail());
                all = true;
            }
            Some(cur) => all |= !c.ready_log_since(cur, &mut ids),
        }
        if all {
            let fds: Vec<c_int> = self.entries.keys().copied().collect();
            fds.into_iter().for_each(|fd| self.list(fd));
            return;
        }
        for id in ids {
            if let Some(fds) = self.by_id.get(&id) {
                for fd in fds.clone() {
                    self.list(fd);
                }
            }
        }
    }
}
