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

const EAGER_ISSUE: &str =
    "needs the TCP server's eager receive/accept and setup-with-accept (issue 4)";

/// Every variant, available or not.
pub fn all(f: &Features) -> Vec<Variant> {
    let has_mode = f.webserver_help.contains("--mode");
    let mode_variant = |id, label, mode: &str, missing: &str| {
        let ok = f.mode(mode);
        Variant {
            id,
            label,
            net: Net::Tcps,
            host_cores_only: true,
            web_args: vec!["--mode".into(), mode.into()],
            server_args: vec![],
            available: ok,
            note: if ok {
                format!("webserver --net tcps --mode {mode}")
            } else {
                missing.to_string()
            },
        }
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
        },
    ];
    // Sync: today's --net tcps path until --mode exists.
    let mut sync = mode_variant(
        "sync",
        "Sync",
        "sync",
        "webserver --mode sync not available",
    );
    if !has_mode {
        sync.web_args.clear();
        sync.available = true;
        sync.note =
            "webserver --net tcps (no --mode yet: synchronous calls through the copying API)"
                .into();
    }
    v.push(sync);
    v.push(mode_variant(
        "sock",
        "Sock",
        "copy",
        "needs webserver --mode copy (issue 3)",
    ));
    v.push(mode_variant(
        "async",
        "AsyncSend",
        "async",
        "needs webserver --mode async (issue 3)",
    ));
    v.push(mode_variant(
        "async-reg",
        "AsyncSend (registered)",
        "async-registered",
        "needs webserver --mode async-registered (issue 3)",
    ));
    // Server-side process-ahead: the flag names issue 4 is expected to add.
    for (id, label, flags) in [
        (
            "erecv-setup",
            "ERecv + Setup",
            &["--eager-recv", "--setup-with-accept"][..],
        ),
        (
            "async-eaccept",
            "AsyncSend + EAccept",
            &["--eager-accept"][..],
        ),
        (
            "async-setup",
            "AsyncSend + Setup",
            &["--setup-with-accept"][..],
        ),
    ] {
        let flags_ok = flags.iter().all(|fl| f.server_flag(fl));
        let async_ok = id == "erecv-setup" || f.mode("async");
        let available = flags_ok && async_ok;
        let mut web_args = vec![];
        if id != "erecv-setup" && available {
            web_args = vec!["--mode".into(), "async".into()];
        }
        v.push(Variant {
            id,
            label,
            net: Net::Tcps,
            host_cores_only: true,
            web_args,
            server_args: flags.iter().map(|s| s.to_string()).collect(),
            available,
            note: if available {
                format!("tcps server {}", flags.join(" "))
            } else if !flags_ok {
                format!(
                    "{EAGER_ISSUE}: `tcps server --help` has no {}",
                    flags.join("/")
                )
            } else {
                "needs webserver --mode async (issue 3)".into()
            },
        });
    }
    let nginx_note = if !f.has_run {
        "needs `tcps run` to start unmodified programs through the TCP server (issue 5)"
    } else if crate::demo::which("nginx").is_none() {
        "`tcps run` exists but nginx is not installed (apt-get install nginx)"
    } else {
        "`tcps run` and nginx exist; the suite does not drive nginx yet"
    };
    v.push(Variant {
        id: "nginx",
        label: "nginx via tcps run",
        net: Net::Tcps,
        host_cores_only: true,
        web_args: vec![],
        server_args: vec![],
        available: false,
        note: nginx_note.into(),
    });
    v
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
