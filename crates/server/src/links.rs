//! The fabric links of remote hosts as `tcps stat` and the metrics show
//! them (issue 17): each remote host's fabric address, link state (up, or
//! lost and why), how long ago it was last heard from (any message or a
//! keepalive), and the fabric messages and bytes the server's pump sent
//! to it and received from it.
//!
//! The fabric thread (`fabric::serve`) owns its endpoints, so it
//! *publishes*, as the workers do for `stats`: every [`PUBLISH_EVERY`] it
//! copies its live links into the [`LinkBoard`]; a link that ends is
//! moved to the board's recently lost list and its counters into the
//! totals of gone links, so totals never drop.

use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the fabric thread publishes its links.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// Lost links kept for `tcps stat` (the most recent).
const LOST_KEPT: usize = 16;

/// Fabric traffic of one endpoint (or summed), as the server's pump sees
/// it: active messages sent and received and their bytes (header + data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub messages_received: u64,
    pub bytes_received: u64,
}

impl LinkCounters {
    pub fn sent(&mut self, bytes: usize) {
        self.messages_sent += 1;
        self.bytes_sent += bytes as u64;
    }

    pub fn received(&mut self, bytes: usize) {
        self.messages_received += 1;
        self.bytes_received += bytes as u64;
    }

    fn add(&mut self, o: &LinkCounters) {
        self.messages_sent += o.messages_sent;
        self.bytes_sent += o.bytes_sent;
        self.messages_received += o.messages_received;
        self.bytes_received += o.bytes_received;
    }

    fn to_json(self) -> Value {
        json!({
            "messages_sent": self.messages_sent,
            "bytes_sent": self.bytes_sent,
            "messages_received": self.messages_received,
            "bytes_received": self.bytes_received,
        })
    }
}

/// One remote host's link as last published.
#[derive(Clone, Debug)]
pub struct LinkView {
    /// The host's id (as in `tcps stat`'s hosts), its pid on its node, the
    /// uid it is accounted to.
    pub host: u64,
    pub pid: u32,
    pub uid: u32,
    /// The peer's address as UCX's connection request named it.
    pub addr: Option<SocketAddr>,
    pub attached: SystemTime,
    /// Last message (or keepalive) from the host.
    pub heard: Instant,
    pub io: LinkCounters,
}

struct Lost {
    view: LinkView,
    at: SystemTime,
    why: String,
}

#[derive(Default)]
struct Inner {
    listen: Option<SocketAddr>,
    live: HashMap<u64, LinkView>,
    lost: VecDeque<Lost>,
    hosts_lost: u64,
    /// Counters of links that ended (hosts lost or gone, attaches refused).
    gone: LinkCounters,
}

/// The server-wide view of the fabric links (`Shared::links`).
#[derive(Default)]
pub struct LinkBoard {
    inner: Mutex<Inner>,
}

impl LinkBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fabric listener's address (`--fabric-listen`).
    pub fn set_listen(&self, addr: SocketAddr) {
        self.lock().listen = Some(addr);
    }

    /// The live links now (the fabric thread's, every `PUBLISH_EVERY`).
    pub fn publish(&self, views: impl Iterator<Item = LinkView>) {
        let views: HashMap<u64, LinkView> = views.map(|v| (v.host, v)).collect();
        self.lock().live = views;
    }

    /// A host's link ended: the host is shown lost (with `why`) and its
    /// counters join the totals of gone links.
    pub fn lost(&self, view: LinkView, why: String) {
        let mut b = self.lock();
        b.live.remove(&view.host);
        b.gone.add(&view.io);
        b.hosts_lost += 1;
        if b.lost.len() == LOST_KEPT {
            b.lost.pop_front();
        }
        b.lost.push_back(Lost {
            view,
            at: SystemTime::now(),
            why,
        });
    }

    /// An endpoint that never became a host (refused, timed out) ended:
    /// its traffic counts in the totals.
    pub fn unadmitted(&self, io: &LinkCounters) {
        self.lock().gone.add(io);
    }

    /// `tcps stat`'s `fabric`: the listener, each link (live ones `up`,
    /// recently lost ones `lost`) the viewer may see (`sees(uid)`), and
    /// the totals over every link ever.
    pub fn report(&self, sees: impl Fn(u32) -> bool) -> Value {
        let b = self.lock();
        let mut total = b.gone;
        let mut live: Vec<&LinkView> = b.live.values().collect();
        live.sort_by_key(|v| v.host);
        let mut hosts = Vec::new();
        for v in live {
            total.add(&v.io);
            if sees(v.uid) {
                hosts.push(view_json(v, "up"));
            }
        }
        for l in b.lost.iter().rev().filter(|l| sees(l.view.uid)) {
            let mut h = view_json(&l.view, "lost");
            h["lost_unix_ms"] = json!(unix_ms(l.at));
            h["why"] = json!(l.why);
            hosts.push(h);
        }
        json!({
            "listen": b.listen.map(|a| a.to_string()),
            "hosts_up": b.live.len(),
            "hosts_lost": b.hosts_lost,
            "hosts": hosts,
            "total": total.to_json(),
        })
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn view_json(v: &LinkView, state: &str) -> Value {
    json!({
        "host": v.host,
        "pid": v.pid,
        "uid": v.uid,
        "addr": v.addr.map(|a| a.to_string()),
        "state": state,
        "attached_unix_ms": unix_ms(v.attached),
        "last_heard_ms": v.heard.elapsed().as_millis() as u64,
        "counters": v.io.to_json(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(host: u64, uid: u32, sent: usize) -> LinkView {
        let mut io = LinkCounters::default();
        io.sent(sent);
        io.received(10);
        LinkView {
            host,
            pid: 7,
            uid,
            addr: "10.0.0.2:5000".parse().ok(),
            attached: SystemTime::now(),
            heard: Instant::now(),
            io,
        }
    }

    #[test]
    fn live_then_lost_and_totals_never_drop() {
        let b = LinkBoard::default();
        b.set_listen("10.0.0.1:7010".parse().unwrap());
        b.publish([view(1, 0, 100), view(2, 5, 50)].into_iter());
        let r = b.report(|_| true);
        assert_eq!(r["listen"], "10.0.0.1:7010");
        assert_eq!(r["hosts_up"], 2);
        assert_eq!(r["hosts"][0]["state"], "up");
        assert_eq!(r["hosts"][0]["addr"], "10.0.0.2:5000");
        assert_eq!(r["hosts"][0]["counters"]["bytes_sent"], 100);
        assert_eq!(r["total"]["messages_sent"], 2);
        assert_eq!(r["total"]["bytes_received"], 20);
        // Host 1 is lost; its counters stay in the totals.
        b.lost(view(1, 0, 100), "silent for 800ms".into());
        b.publish([view(2, 5, 50)].into_iter());
        b.unadmitted(&LinkCounters {
            messages_sent: 1,
            bytes_sent: 3,
            ..Default::default()
        });
        let r = b.report(|_| true);
        assert_eq!(r["hosts_up"], 1);
        assert_eq!(r["hosts_lost"], 1);
        let lost = r["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["state"] == "lost")
            .unwrap();
        assert_eq!(lost["host"], 1);
        assert_eq!(lost["why"], "silent for 800ms");
        assert_eq!(r["total"]["messages_sent"], 3);
        assert_eq!(r["total"]["bytes_sent"], 153);
        // A viewer sees only its own hosts' links; totals cover all.
        let r = b.report(|uid| uid == 5);
        assert_eq!(r["hosts"].as_array().map(Vec::len), Some(1));
        assert_eq!(r["total"]["bytes_sent"], 153);
    }

    #[test]
    fn lost_list_is_bounded() {
        let b = LinkBoard::default();
        for h in 0..40 {
            b.lost(view(h, 0, 1), "gone".into());
        }
        let r = b.report(|_| true);
        assert_eq!(r["hosts"].as_array().map(Vec::len), Some(LOST_KEPT));
        assert_eq!(r["hosts_lost"], 40);
        assert_eq!(r["hosts"][0]["host"], 39, "most recent first");
        assert_eq!(r["listen"], Value::Null);
    }
}
