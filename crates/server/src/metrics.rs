//! `tcps server --metrics-listen ADDR`: the counters and queue depths of
//! `tcps stat` in the Prometheus text exposition format (version 0.0.4),
//! served over HTTP at `GET /metrics` for scrapers.
//!
//! The text is rendered from the same report a `StatQuery` gets (seen as
//! the server's own user: every host), so the two never disagree. The HTTP
//! side ([`http`]) serves every connection at once, each with a deadline,
//! and reads only the stats board, so no client can delay a worker, an
//! attach or another scraper.
//!
//! Metric names: `tcps_*` are server totals (hosts that detached included);
//! `tcps_host_*` the same per attached host, labelled `host`, `pid`, `uid`.
//! Separate names, so that `sum()` over a metric never counts twice.
//!
//! Who may see what: anyone who reaches the listener gets the answer, and
//! `tcps stat` shows a user only their own hosts. So the per-host series
//! (which users run what, their pids and traffic) are rendered only when
//! the operator asks for them (`--metrics-per-host`); by default the text
//! has the server totals alone.

pub mod http;

use serde_json::Value;
use std::fmt::Write as _;

/// Counters of a host (`counters` in the report), with their help texts.
/// `calls` (by op) is rendered separately.
const COUNTERS: &[(&str, &str)] = &[
    (
        "round_trips",
        "Channel round trips: completions published, each a call the host waited on.",
    ),
    (
        "wakes",
        "Futex wakes of sleeping host threads (completions, ring publishes, finished sends).",
    ),
    (
        "doorbell_rings",
        "Host doorbell rings: wake-ups of host threads sleeping in poll on rings and send queues (at most one per worker pass).",
    ),
    (
        "accepts_eager",
        "Connections accepted ahead into accept rings.",
    ),
    (
        "accepts_on_demand",
        "Accept requests that went to the kernel.",
    ),
    (
        "accepts_direct",
        "Connections handed to their host as kernel sockets (balancing).",
    ),
    (
        "recvs_eager",
        "Receives served ahead (into receive rings or the read-ahead buffer).",
    ),
    ("recvs_on_demand", "Recv requests that went to the kernel."),
    (
        "bytes_eager",
        "Bytes received ahead of the host's recv calls.",
    ),
    ("bytes_sent", "Bytes sent to the network for hosts."),
    (
        "bytes_received",
        "Bytes received from the network for hosts.",
    ),
    (
        "refused_conns",
        "Connections reset by the admission limits (--max-conns-per-*).",
    ),
    (
        "refused_sockets",
        "Sockets refused by --max-sockets-per-host.",
    ),
    ("async_sends", "Asynchronous sends finished."),
    ("async_failed", "Asynchronous sends that failed."),
    (
        "kicks",
        "AsyncKick requests (a host woke a cold send queue).",
    ),
    (
        "recv_kicks",
        "RecvKick requests (a host resumed a paused receive ring).",
    ),
    (
        "parked",
        "Calls that waited at the server for their socket.",
    ),
    ("invalid", "Requests refused as malformed."),
];

/// Queue depths (`depths` in the report), gauges.
const DEPTHS: &[(&str, &str)] = &[
    (
        "parked_calls",
        "Calls parked at the server waiting for their socket.",
    ),
    ("parked_polls", "Poll calls parked at the server."),
    ("sockets", "Sockets hosts hold."),
    (
        "sockets_closing",
        "Sockets closed by their host, still sending queued data.",
    ),
    (
        "send_queues_busy",
        "Send queues with asynchronous sends in progress.",
    ),
    (
        "send_descs_pending",
        "Asynchronous sends taken and not finished.",
    ),
    (
        "recv_ring_bytes",
        "Bytes waiting in receive rings for hosts to recv.",
    ),
    (
        "accept_ring_records",
        "Connections waiting in accept rings for hosts to accept.",
    ),
    (
        "pull_buffer_bytes",
        "Bytes allocated by read-ahead buffers at the server (pull).",
    ),
    (
        "registered_bytes",
        "Bytes of hosts' registered memory mapped by the server.",
    ),
];

/// One metric family: its HELP and TYPE lines, then its samples.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The server's own families: its version and pid, and its hosts.
fn server_families(out: &mut String, r: &Value) {
    family(
        out,
        "tcps_info",
        "gauge",
        "The TCP server: its protocol version and pid.",
        &[(
            format!(
                "version=\"{}\",pid=\"{}\"",
                num(&r["version"]),
                num(&r["server"]["pid"])
            ),
            1,
        )],
    );
    family(
        out,
        "tcps_hosts_attached",
        "gauge",
        "Hosts attached now.",
        &[(String::new(), num(&r["server"]["hosts_attached"]))],
    );
    family(
        out,
        "tcps_hosts_refused_total",
        "counter",
        "Hosts refused at attach (admission control).",
        &[(String::new(), num(&r["server"]["hosts_refused"]))],
    );
    family(
        out,
        "tcps_hosts_detached_total",
        "counter",
        "Hosts that detached.",
        &[(String::new(), num(&r["server"]["hosts_detached"]))],
    );
    family(
        out,
        "tcps_server_syscalls_total",
        "counter",
        "System calls the TCP server's workers made (io_uring_enter counted once per enter).",
        &[(String::new(), num(&r["server"]["syscalls"]))],
    );
    family(
        out,
        "tcps_server_heap_allocations_total",
        "counter",
        "Heap allocations the TCP server's worker passes made (none per connection once its tables have grown).",
        &[(String::new(), num(&r["server"]["heap_allocations"]))],
    );
    let scan = &r["server"]["scan"];
    family(
        out,
        "tcps_worker_passes_total",
        "counter",
        "Worker passes.",
        &[(String::new(), num(&scan["passes"]))],
    );
    family(
        out,
        "tcps_worker_channels_looked_total",
        "counter",
        "Channels the worker passes read (only awake hosts'), summed over passes.",
        &[(String::new(), num(&scan["channels_looked"]))],
    );
    family(
        out,
        "tcps_hosts_dormant",
        "gauge",
        "Hosts whose channels the workers do not read until they ring (idle).",
        &[(String::new(), num(&scan["hosts_dormant"]))],
    );
}

/// Balancing (`crate::balance`): hosts by the reason of their share (no
/// host named), and with `per_host` each host's share and loads.
fn balance_families(out: &mut String, r: &Value, hosts: &[(String, &Value)]) {
    let mut by_reason: std::collections::BTreeMap<String, u64> = Default::default();
    for h in r["hosts"].as_array().into_iter().flatten() {
        let why = h["balance"]["reason"].as_str().unwrap_or("start");
        *by_reason.entry(why.to_string()).or_default() += 1;
    }
    let samples: Vec<(String, u64)> = by_reason
        .into_iter()
        .map(|(why, n)| (format!("reason=\"{why}\""), n))
        .collect();
    family(
        out,
        "tcps_balance_hosts",
        "gauge",
        "Attached hosts by why their direct share is what it is (balancing).",
        &samples,
    );
    if hosts.is_empty() {
        return;
    }
    for (key, help) in [
        (
            "share_pct",
            "Percent of the host's new connections handed to it directly.",
        ),
        (
            "server_busy_pct",
            "Load of the host's worker (percent of time in passes with work or waiting for its core), averaged over two 250 ms windows.",
        ),
        (
            "host_busy_pct",
            "Load of the host (CPU and run-queue wait, percent of the cores no worker is pinned to), averaged over two 250 ms windows.",
        ),
        (
            "pending_direct",
            "Direct connections the host has not taken yet.",
        ),
    ] {
        let samples: Vec<(String, u64)> = hosts
            .iter()
            .map(|(l, h)| {
                let why = h["balance"]["reason"].as_str().unwrap_or("start");
                (format!("{l},reason=\"{why}\""), num(&h["balance"][key]))
            })
            .collect();
        family(
            out,
            &format!("tcps_host_balance_{key}"),
            "gauge",
            help,
            &samples,
        );
    }
}

/// Fabric link counters (`fabric.total` and each link's `counters` in the
/// report, `crate::links`), with their help texts.
const LINK_COUNTERS: &[(&str, &str)] = &[
    (
        "messages_sent",
        "Fabric messages the server sent to remote hosts (batches, keepalives, attach).",
    ),
    ("bytes_sent", "Bytes of those messages (header and data)."),
    (
        "messages_received",
        "Fabric messages the server received from remote hosts.",
    ),
    (
        "bytes_received",
        "Bytes of those messages (header and data).",
    ),
];

/// Remote hosts' fabric links: how many are up and were lost, the traffic
/// of all links, and with `per_host` each link's state, last message age
/// and traffic (labelled as hosts are, plus `addr` and `state`).
fn fabric_families(out: &mut String, r: &Value, per_host: bool) {
    let f = &r["fabric"];
    family(
        out,
        "tcps_fabric_hosts_up",
        "gauge",
        "Remote hosts whose fabric link is up.",
        &[(String::new(), num(&f["hosts_up"]))],
    );
    family(
        out,
        "tcps_fabric_hosts_lost_total",
        "counter",
        "Remote hosts dropped: link cut or silent, endpoint failed, or cut off.",
        &[(String::new(), num(&f["hosts_lost"]))],
    );
    let links: Vec<(String, &Value)> = f["hosts"]
        .as_array()
        .filter(|_| per_host)
        .map(|a| {
            a.iter()
                .map(|h| {
                    let labels = format!(
                        "host=\"{}\",pid=\"{}\",uid=\"{}\",addr=\"{}\",state=\"{}\"",
                        num(&h["host"]),
                        num(&h["pid"]),
                        num(&h["uid"]),
                        h["addr"].as_str().unwrap_or(""),
                        h["state"].as_str().unwrap_or("")
                    );
                    (labels, h)
                })
                .collect()
        })
        .unwrap_or_default();
    for (key, help) in LINK_COUNTERS {
        let total = [(String::new(), num(&f["total"][key]))];
        family(
            out,
            &format!("tcps_fabric_{key}_total"),
            "counter",
            help,
            &total,
        );
        if per_host {
            let samples: Vec<(String, u64)> = links
                .iter()
                .map(|(l, h)| (l.clone(), num(&h["counters"][key])))
                .collect();
            let name = format!("tcps_host_fabric_{key}_total");
            family(out, &name, "counter", help, &samples);
        }
    }
    if per_host {
        let up: Vec<(String, u64)> = links
            .iter()
            .map(|(l, h)| (l.clone(), u64::from(h["state"] == "up")))
            .collect();
        let help = "1 while the remote host's fabric link is up, 0 once lost (recently lost links are kept).";
        family(out, "tcps_host_fabric_link_up", "gauge", help, &up);
        let heard: Vec<(String, u64)> = links
            .iter()
            .map(|(l, h)| (l.clone(), num(&h["last_heard_ms"])))
            .collect();
        let help = "Milliseconds since the remote host's last message or keepalive.";
        family(out, "tcps_host_fabric_last_heard_ms", "gauge", help, &heard);
    }
}

/// The Prometheus text of a stat report (`stats::report`): server totals,
/// and with `per_host` the `tcps_host_*` series of every attached host.
pub fn render(r: &Value, per_host: bool) -> String {
    let mut out = String::new();
    let hosts: Vec<(String, &Value)> = r["hosts"]
        .as_array()
        .filter(|_| per_host)
        .map(|a| {
            a.iter()
                .map(|h| {
                    (
                        format!(
                            "host=\"{}\",pid=\"{}\",uid=\"{}\"",
                            num(&h["id"]),
                            num(&h["pid"]),
                            num(&h["uid"])
                        ),
                        h,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let total = &r["total"];
    server_families(&mut out, r);
    // Calls by type.
    let by_op = |c: &Value, labels: &str| -> Vec<(String, u64)> {
        c["calls"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(op, n)| {
                        let sep = if labels.is_empty() { "" } else { "," };
                        (format!("{labels}{sep}op=\"{op}\""), num(n))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    family(
        &mut out,
        "tcps_calls_total",
        "counter",
        "Socket calls hosts made, by call.",
        &by_op(&total["counters"], ""),
    );
    if per_host {
        let samples: Vec<(String, u64)> = hosts
            .iter()
            .flat_map(|(l, h)| by_op(&h["counters"], l))
            .collect();
        family(
            &mut out,
            "tcps_host_calls_total",
            "counter",
            "Socket calls the host made, by call.",
            &samples,
        );
    }
    balance_families(&mut out, r, &hosts);
    fabric_families(&mut out, r, per_host);
    // Each counter and depth twice: the server's total, then per host.
    for (section, table, suffix, kind) in [
        ("counters", COUNTERS, "_total", "counter"),
        ("depths", DEPTHS, "", "gauge"),
    ] {
        for (key, help) in table {
            let total = [(String::new(), num(&total[section][key]))];
            family(&mut out, &format!("tcps_{key}{suffix}"), kind, help, &total);
            if !per_host {
                continue;
            }
            let samples: Vec<(String, u64)> = hosts
                .iter()
                .map(|(l, h)| (l.clone(), num(&h[section][key])))
                .collect();
            family(
                &mut out,
                &format!("tcps_host_{key}{suffix}"),
                kind,
                help,
                &samples,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::Shared;
    use std::time::Instant;

    /// A remote host's link: totals always, per link only with per_host.
    #[test]
    fn fabric_links() {
        let shared = Shared::default();
        let mut io = crate::links::LinkCounters::default();
        io.sent(100);
        io.received(40);
        let view = crate::links::LinkView {
            host: 9,
            pid: 3,
            uid: 65534,
            addr: "10.0.0.2:4000".parse().ok(),
            attached: std::time::SystemTime::now(),
            heard: Instant::now(),
            io,
        };
        shared.links.publish(std::iter::once(view));
        let r = shared.stat_report(0);
        let text = render(&r, false);
        assert!(text.contains("tcps_fabric_hosts_up 1\n"), "{text}");
        assert!(
            text.contains("tcps_fabric_bytes_sent_total 100\n"),
            "{text}"
        );
        assert!(
            text.contains("tcps_fabric_messages_received_total 1\n"),
            "{text}"
        );
        assert!(!text.contains("10.0.0.2"), "{text}");
        let text = render(&r, true);
        let labels = "host=\"9\",pid=\"3\",uid=\"65534\",addr=\"10.0.0.2:4000\",state=\"up\"";
        for line in [
            format!("tcps_host_fabric_link_up{{{labels}}} 1\n"),
            format!("tcps_host_fabric_bytes_received_total{{{labels}}} 40\n"),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(text.contains("tcps_host_fabric_last_heard_ms{"), "{text}");
    }

    /// Every key the report has is rendered, and nothing else is: a new
    /// counter must be added to COUNTERS / DEPTHS.
    #[test]
    fn every_counter_and_depth_is_rendered() {
        let shared = Shared::default();
        let r = shared.stat_report(0);
        let counters = r["total"]["counters"].as_object().expect("counters");
        let mut keys: Vec<&str> = counters
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "calls" && *k != "calls_total")
            .collect();
        keys.sort_unstable();
        let mut ours: Vec<&str> = COUNTERS.iter().map(|c| c.0).collect();
        ours.sort_unstable();
        assert_eq!(keys, ours);
        let depths = r["total"]["depths"].as_object().expect("depths");
        let mut keys: Vec<&str> = depths.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut ours: Vec<&str> = DEPTHS.iter().map(|c| c.0).collect();
        ours.sort_unstable();
        assert_eq!(keys, ours);
    }

    /// Without `--metrics-per-host` nothing names a host: no `tcps_host_*`
    /// family, no host's pid or uid.
    #[test]
    fn totals_only_by_default() {
        let shared = Shared::default();
        let text = render(&shared.stat_report(0), false);
        assert!(!text.contains("tcps_host_"), "{text}");
        assert!(text.contains("tcps_round_trips_total 0\n"));
        let with = render(&shared.stat_report(0), true);
        assert!(with.contains("# TYPE tcps_host_round_trips_total counter\n"));
    }

    #[test]
    fn exposition_format() {
        let shared = Shared::default();
        let text = render(&shared.stat_report(0), true);
        assert!(text.contains("# TYPE tcps_calls_total counter\n"));
        assert!(text.contains("tcps_calls_total{op=\"Send\"} 0\n"));
        assert!(text.contains("tcps_round_trips_total 0\n"));
        assert!(text.contains("# TYPE tcps_recv_ring_bytes gauge\n"));
        assert!(text.contains("tcps_hosts_attached 0\n"));
        assert!(text.contains("# TYPE tcps_server_syscalls_total counter\n"));
        assert!(text.contains("tcps_worker_channels_looked_total 0\n"));
        assert!(text.contains("tcps_hosts_dormant 0\n"));
        assert!(text.contains("tcps_fabric_hosts_up 0\n"));
        assert!(text.contains("# TYPE tcps_fabric_bytes_sent_total counter\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').expect("name value");
            assert!(value.parse::<u64>().is_ok(), "{line}");
            let bare = name.split('{').next().unwrap_or("");
            assert!(
                bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
        }
    }
}
