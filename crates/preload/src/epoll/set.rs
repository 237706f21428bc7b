//! An epoll set's offloaded entries and its ready list, fed by the host's
//! ready log (see the module above).

use super::entry::Entry;
use crate::{fdtable, state};
use libc::{c_int, epoll_event};
use std::collections::BTreeMap;

/// Whether entries of attachment `epoch` are watched at their server: the
/// current attachment's, or a live one of a group (`group.rs`); the others
/// are a dead attachment's.
pub(super) fn live(epoch: u32) -> bool {
    state::in_group(epoch)
        && !(state::is_group() && state::client_at(epoch).is_none_or(|c| !c.is_attached()))
}

#[derive(Default)]
pub struct Set {
    /// Offloaded fds registered in this set.
    pub(super) entries: BTreeMap<c_int, Entry>,
    /// The fds of `entries` by the sockets they watch (epoch, id): dup'd
    /// fds share one; a listener on several servers is listed under each.
    pub(super) by_id: BTreeMap<(u32, u32), Vec<c_int>>,
    /// The ready list: the entries a wait looks at (see the module docs).
    pub(super) ready: Vec<c_int>,
    /// How far this set has read each live attachment's ready log, by its
    /// place in the group (None: not yet).
    pub(super) log_cursor: [Option<u32>; state::MAX_GROUP],
    /// `fdtable::rescan_epoch` when the set last looked at everything.
    pub(super) rescan: u32,
    /// Kernel fds registered in the real epoll fd (saturating; a closed fd
    /// leaves the count high, which only costs a real epoll_wait).
    pub(super) kernel_fds: usize,
    /// The current epoch and `group::moves` when the set last sorted its
    /// entries ((0, 0): not yet); entries that are not [`live`] are a
    /// dead attachment's (`--reattach`, or a dead server of a group).
    pub(super) seen: (u32, u32),
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

    /// Lists `fd` under every socket its entry watches.
    fn index(&mut self, fd: c_int) {
        let Some(e) = self.entries.get(&fd) else {
            return;
        };
        for key in e.sockets().collect::<Vec<_>>() {
            self.by_id.entry(key).or_default().push(fd);
        }
    }

    pub(super) fn insert(&mut self, fd: c_int, e: Entry) {
        if let Some(old) = self.entries.insert(fd, e) {
            self.unindex(fd, &old);
            self.ready.retain(|&f| f != fd);
        }
        if self.seen.0 != 0 && self.entries.get(&fd).is_some_and(|e| !live(e.epoch)) {
            self.stale.push(fd);
            return;
        }
        self.index(fd);
        self.list(fd); // looked at once, as the kernel's ctl does
    }

    /// Sorts the entries again when the current epoch moved (a reattach)
    /// or an fd moved to another server's socket or a group's server died
    /// (`group::moves`): an entry whose fd names another live socket now
    /// (a listener taken over) watches that socket, its edges fresh;
    /// entries of dead attachments are stale; the ready logs are read from
    /// their start.
    pub(super) fn refresh(&mut self) {
        let now = (state::epoch(), crate::group::moves());
        if self.seen == now {
            return;
        }
        let first = self.seen.0 == 0;
        self.seen = now;
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
                Some((ne, nid)) if live(ne) && (ne, nid) != (e.epoch, e.id) => {
                    let ev = epoll_event {
                        events: e.events,
                        u64: e.data,
                    };
                    let disabled = e.disabled;
                    *e = Entry::new(ne, nid, &ev);
                    e.disabled = disabled;
                }
                Some(_) => e.sibs = crate::group::siblings(e.epoch, e.id).unwrap_or_default(),
                None => {}
            }
            if live(e.epoch) {
                self.index(fd);
                self.list(fd);
            } else {
                self.stale.push(fd);
            }
        }
        if !first {
            self.log_cursor = [None; state::MAX_GROUP]; // everything is looked at once
        }
    }

    pub(super) fn remove(&mut self, fd: c_int) -> Option<Entry> {
        let e = self.entries.remove(&fd)?;
        self.unindex(fd, &e);
        if e.listed {
            self.ready.retain(|&f| f != fd);
        }
        self.stale.retain(|&f| f != fd);
        Some(e)
    }

    fn unindex(&mut self, fd: c_int, e: &Entry) {
        for key in e.sockets() {
            if let Some(v) = self.by_id.get_mut(&key) {
                v.retain(|&f| f != fd);
                if v.is_empty() {
                    self.by_id.remove(&key);
                }
            }
        }
    }

    /// Lists the entries of the sockets the servers published into since
    /// the last look (each live attachment's ready log); everything when a
    /// log overflowed, on the first look, or after a rescan was asked for.
    pub(super) fn refill(&mut self) {
        let epoch = fdtable::rescan_epoch();
        let mut all = epoch != self.rescan;
        self.rescan = epoch;
        let mut ids = Vec::new();
        for (e, c) in state::members().filter(|&(e, _)| live(e)) {
            match self.log_cursor[state::slot(e)].as_mut() {
                None => {
                    self.log_cursor[state::slot(e)] = Some(c.ready_log_tail());
                    all = true;
                }
                Some(cur) => {
                    let mut got = Vec::new();
                    all |= !c.ready_log_since(cur, &mut got);
                    ids.extend(got.into_iter().map(|id| (e, id)));
                }
            }
        }
        if all {
            let fds: Vec<c_int> = self.entries.keys().copied().collect();
            fds.into_iter().for_each(|fd| self.list(fd));
            return;
        }
        for key in ids {
            if let Some(fds) = self.by_id.get(&key) {
                for fd in fds.clone() {
                    self.list(fd);
                }
            }
        }
    }
}
