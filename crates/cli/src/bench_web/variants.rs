//! The variants of thesis Table 6.5 and how each runs here. Availability is
//! detected at run time from the programs' `--help`, so variants appear as
//! the features land; a variant that cannot run is reported "n/a" with the
//! reason, never approximated by another one.

use serde::Serialize;
use std::path::Path;
use std::process::{Command, Stdio};

/// Which network the application uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Net {
    Kernel,
    Tcps,
}

#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub id: &'static str,
    /// The thesis' legend.
    pub label: &'static str,
    pub net: Net,
    /// Kernel variant confined to the host's core(s) (the thesis' comparison).
    pub host_cores_only: bool,
    /// Extra web server flags, e.g. ["--mode", "async"].
    pub web_args: Vec<String>,
    /// Extra TCP server flags, e.g. ["--eager-accept"].
    pub server_args: Vec<String>,
    pub available: bool,
    /// Why not available, or a note on how it runs.
    pub note: String,
    /// The unmodified nginx (through `tcps run`) instead of the example
    /// web server.
    #[serde(default)]
    pub nginx: bool,
}

/// What the installed programs offer.
pub struct Features {
    webserver_help: String,
    server_help: String,
    /// `tcps run` exists (issue 5).
    has_run: bool,
}

fn help_of(program: &Path, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s
        })
        .unwrap_or_default()
}

impl Features {
    pub fn detect(webserver: &Path, tcps: &Path) -> Features {
        Features {
            webserver_help: help_of(webserver, &["--help"]),
            server_help: help_of(tcps, &["server", "--help"]),
            has_run: Command::new(tcps)
                .args(["run", "--help"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
        }
    }

    /// The web server's `--mode` accepts `m` (listed in its help).
    fn mode(&self, m: &str) -> bool {
        self.webserver_help.contains("--mode")
            && self
                .webserver_help
                .split(|c: char| !(c.is_alphanumeric() || c == '-'))
                .any(|w| w == m)
    }

    fn server_flag(&self, flag: &str) -> bool {
        self.server_help.contains(flag)
    }
}

/// TCP server flags with every process-ahead mechanism off (the server's
/// defaults have them all on).
const EAGER_OFF: [&str; 6] = [
    "--eager-accept",
    "off",
    "--eager-recv",
    "off",
    "--setup-with-accept",
    "off",
];

/// `EAGER_OFF` with some mechanisms switched on again (`--flag value` pairs
/// given later win: `tcps server` lets a flag override itself).
fn eager_flags(on: &[&str]) -> Vec<String> {
    EAGER_OFF.iter().chain(on).map(|s| s.to_string()).collect()
}

/// Every variant, available or not.
pub fn all(f: &Features) -> Vec<Variant> {
    let eager_ok = f.server_flag("--eager-recv") && f.server_flag("--setup-with-accept");
    let balance_ok = f.server_flag("--balance");
    // A tcps variant: web server mode, TCP server flags. Balancing is off
    // (every connection offloaded) unless the variant asks for it
    // (`balanced`): the mechanisms are measured alone.
    let variant = |id, label, mode: &str, mut server_args: Vec<String>, balanced: bool| {
        let ok = f.mode(mode) && (server_args.is_empty() || eager_ok) && (!balanced || balance_ok);
        if balance_ok && !balanced {
            server_args.extend(["--balance".to_string(), "off".to_string()]);
        }
        let flags = server_args.join(" ");
        Variant {
            id,
            label,
            net: Net::Tcps,
            host_cores_only: true,
            web_args: if balanced && f.webserver_help.contains("--take-direct") {
                // The web server serves handed-over connections itself.
                vec!["--mode".into(), mode.into(), "--take-direct".into()]
            } else {
                vec!["--mode".into(), mode.into()]
            },
            note: if !f.mode(mode) {
                format!("webserver --mode {mode} not available")
            } else if balanced && !balance_ok {
                "tcps server has no --balance (dynamic balancing)".into()
            } else if !ok {
                "tcps server has no process-ahead flags".into()
            } else if flags.is_empty() {
                format!(
                    "webserver --mode {mode}; tcps server defaults (all process-ahead on, \
                     balancing on)"
                )
            } else {
                format!("webserver --mode {mode}; tcps server {flags}")
            },
            server_args,
            available: ok,
            nginx: false,
        }
    };
    let tcps = |id, label, mode: &str, server_args: Vec<String>| {
        variant(id, label, mode, server_args, false)
    };
    let mut v = vec![
        Variant {
            id: "regular",
            label: "Regular",
            net: Net::Kernel,
            host_cores_only: false,
            web_args: vec![],
            server_args: vec![],
            available: true,
            note: "kernel sockets on the host's and the TCP server's cores together (the fair comparison)".into(),
            nginx: false,
        },
        Variant {
            id: "regular-host",
            label: "Regular (host cores)",
            net: Net::Kernel,
            host_cores_only: true,
            web_args: vec![],
            server_args: vec![],
            available: true,
            note: "kernel sockets on the host's cores only (the thesis' comparison: one node)".into(),
            nginx: false,
        },
        // Thesis Table 6.5, each mechanism alone on top of its base ...
        tcps("sock", "Sock", "copy", eager_flags(&[])),
        tcps("sync", "Sync", "sync", eager_flags(&[])),
        tcps("async", "AsyncSend", "async", eager_flags(&[])),
        tcps("async-reg", "AsyncSend (registered)", "async-registered", eager_flags(&[])),
        tcps("eaccept", "Sync + EAccept", "sync", eager_flags(&["--eager-accept", "on"])),
        tcps("erecv-pull", "Sync + ERecv (pull)", "sync", eager_flags(&["--eager-recv", "pull"])),
        tcps("erecv-push", "Sync + ERecv (push)", "sync", eager_flags(&["--eager-recv", "push"])),
        // ... the combinations the thesis plots ...
        tcps(
            "erecv-setup",
            "ERecv + Setup",
            "sync",
            eager_flags(&["--eager-recv", "push", "--setup-with-accept", "on"]),
        ),
        tcps("async-eaccept", "AsyncSend + EAccept", "async", eager_flags(&["--eager-accept", "on"])),
        tcps("async-setup", "AsyncSend + Setup", "async", eager_flags(&["--setup-with-accept", "on"])),
        // ... everything on but balancing ...
        tcps("ahead-all", "Sync + all process-ahead", "sync", vec![]),
        tcps(
            "all-nobalance",
            "AsyncSend (reg.) + all process-ahead",
            "async-registered",
            vec![],
        ),
        // ... and the recommended configuration: every mechanism and
        // dynamic host/server balancing (the TCP server's defaults).
        variant("all", "all (+ balancing)", "async-registered", vec![], true),
    ];
    v.push(nginx_variant(f));
    v
}

/// The unmodified nginx started by `tcps run`.
fn nginx_variant(f: &Features) -> Variant {
    let (available, note) = if !f.has_run {
        (
            false,
            "needs `tcps run` to start unmodified programs through the TCP server (issue 5)",
        )
    } else if crate::harness::which("nginx").is_none() {
        (
            false,
            "`tcps run` exists but nginx is not installed (apt-get install nginx-light)",
        )
    } else {
        (
            true,
            "the unmodified nginx (1 worker, sendfile on) started by `tcps run`; tcps server defaults (balancing on)",
        )
    };
    Variant {
        id: "nginx",
        label: "nginx via tcps run",
        net: Net::Tcps,
        host_cores_only: true,
        web_args: vec![],
        server_args: vec![],
        available,
        note: note.into(),
        nginx: true,
    }
}

/// Variants selected by `--variants` (ids; empty = all).
pub fn select(all: Vec<Variant>, wanted: &[String]) -> Result<Vec<Variant>, String> {
    if wanted.is_empty() {
        return Ok(all);
    }
    for w in wanted {
        if !all.iter().any(|v| v.id == w) {
            let ids: Vec<&str> = all.iter().map(|v| v.id).collect();
            return Err(format!("unknown variant '{w}' (known: {})", ids.join(", ")));
        }
    }
    Ok(all
        .into_iter()
        .filter(|v| wanted.iter().any(|w| w == v.id))
        .collect())
}
