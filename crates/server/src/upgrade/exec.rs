//! The upgrading thread's side (the server's main thread, on SIGUSR2):
//! refuse early what cannot be carried, ask the new binary whether it
//! loads this record version, pause the control thread and the workers,
//! gather their records, and exec the new binary in place (same pid) with
//! every descriptor the record names kept open. Any refusal or failure
//! before the exec resumes the workers: the old server keeps running.

use super::record::{set_cloexec, HostRecord, Record, RECORD_VERSION, STATE_ENV};
use crate::config::Config;
use crate::shared::{Shared, Verdict};
use crate::sys;
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long the workers may take to pause (their drain is bounded by
/// `worker::pause`'s own 2 s).
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long fork snapshots may take to be claimed before the upgrade
/// drops them (a child attaches and claims within milliseconds of its
/// fork; a snapshot nobody claims must not veto the operator).
const SNAPSHOT_WAIT: Duration = Duration::from_secs(2);

/// What the upgrade needs of the running server.
pub struct Running<'a> {
    pub cfg: &'a Config,
    pub shared: &'a Arc<Shared>,
    /// The workers' own doorbells (ringing one makes it look at once).
    pub doorbells: &'a [Arc<OwnedFd>],
    pub listener: RawFd,
    pub metrics: Option<RawFd>,
    pub made_socket_path: bool,
    /// Signals caught and not yet handled (one bit per number): raised
    /// again, blocked, before the exec, so the new image handles them.
    pub pending_signals: &'a std::sync::atomic::AtomicU64,
}

/// The binary this server was started from and its arguments: what an
/// upgrade execs (the file at that path now: the new binary).
pub struct Origin {
    pub exe: PathBuf,
    pub args: Vec<OsString>,
}

impl Origin {
    /// Captured at start, before anyone replaces the file.
    pub fn now() -> Origin {
        Origin {
            exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
            args: std::env::args_os().collect(),
        }
    }
}

/// Upgrades in place; returns only if the upgrade was refused or failed
/// before the exec (why), the server running on as before.
pub fn upgrade(run: &Running<'_>, origin: &Origin) -> String {
    let why = try_upgrade(run, origin);
    let board = &run.shared.upgrade;
    board.refused.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut last) = board.last_refusal.lock() {
        last.clone_from(&why);
    }
    warn!(reason = %why, "hot upgrade refused: the server keeps running as it was");
    why
}

fn try_upgrade(run: &Running<'_>, origin: &Origin) -> String {
    if run.cfg.fabric.is_some() {
        return "remote hosts (--fabric-listen) cannot be carried across an upgrade yet".into();
    }
    if let Err(why) = check_binary(&origin.exe) {
        return why;
    }
    let board = &run.shared.upgrade;
    // Children of a fork in progress attach and claim their snapshots:
    // waited for before the gate closes (they could not attach after).
    let start = Instant::now();
    while crate::inherit::pending_count() > 0 && start.elapsed() < SNAPSHOT_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    // No host attaches from here on: new ones wait in the backlog.
    let _gate = board.gate.lock().unwrap_or_else(|e| e.into_inner());
    let paused = pause_workers(run);
    if paused.is_ok() {
        drop_snapshots();
    }
    let records = match paused {
        Ok(r) => r,
        Err(why) => {
            resume_workers(run.shared);
            return why;
        }
    };
    let record = Record {
        version: RECORD_VERSION,
        listener: run.listener,
        made_socket_path: run.made_socket_path,
        metrics: run.metrics,
        last_host_id: records.iter().flatten().map(|h| h.id).max().unwrap_or(0),
        refused_hosts: run.shared.refused_hosts.load(Ordering::Relaxed),
        upgrades: board.done.load(Ordering::Relaxed),
        workers: records,
    };
    let why = exec(&record, origin, run.pending_signals);
    resume_workers(run.shared);
    why
}

/// Drops the fork snapshots nobody claimed (the workers paused: none is
/// taken meanwhile). They are not carried: a child that claims one later
/// is told ENOENT and says its parent's sockets were not handed over.
fn drop_snapshots() {
    for (uid, snapshots) in crate::inherit::drop_all() {
        warn!(
            uid,
            snapshots,
            "hot upgrade: fork snapshots not claimed within 2 s are dropped \
             (a child claiming one later gets ENOENT)"
        );
    }
}

/// Runs `EXE server --upgrade-check VERSION`: whether the new binary
/// loads this record version.
fn check_binary(exe: &Path) -> Result<(), String> {
    let out = std::process::Command::new(exe)
        .args(["server", "--upgrade-check", &RECORD_VERSION.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run the new binary {}: {e}", exe.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said = said.lines().last().unwrap_or("").trim();
    Err(format!(
        "the new binary {} cannot load state record version {RECORD_VERSION} ({}{}{})",
        exe.display(),
        out.status,
        if said.is_empty() { "" } else { ": " },
        said
    ))
}

/// Asks every worker to pause and waits for their records.
fn pause_workers(run: &Running<'_>) -> Result<Vec<Vec<HostRecord>>, String> {
    let board = &run.shared.upgrade;
    if let Ok(mut v) = board.verdict.lock() {
        *v = Verdict::Pending;
    }
    if let Ok(mut r) = board.reports.lock() {
        r.clear();
    }
    board.requested.store(true, Ordering::SeqCst);
    for bell in run.doorbells {
        sys::eventfd_ring(bell.as_raw_fd());
    }
    let n = run.doorbells.len();
    let start = Instant::now();
    let reports = loop {
        let got = board.reports.lock().map(|r| r.len()).unwrap_or(0);
        if got >= n {
            break std::mem::take(&mut *board.reports.lock().map_err(|_| "poisoned")?);
        }
        if start.elapsed() >= PAUSE_TIMEOUT {
            return Err("the workers did not pause within 5 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut workers = vec![Vec::new(); n];
    for (index, report) in reports {
        let value = report?;
        let hosts: Vec<HostRecord> =
            serde_json::from_value(value).map_err(|e| format!("worker {index}: {e}"))?;
        if let Some(w) = workers.get_mut(index) {
            *w = hosts;
        }
    }
    Ok(workers)
}

/// The workers go on as before (the upgrade is off).
fn resume_workers(shared: &Shared) {
    let board = &shared.upgrade;
    board.requested.store(false, Ordering::SeqCst);
    if let Ok(mut v) = board.verdict.lock() {
        *v = Verdict::Resume;
    }
    board.verdict_changed.notify_all();
}

/// Execs the new binary with the record; returns why it could not.
fn exec(record: &Record, origin: &Origin, pending: &std::sync::atomic::AtomicU64) -> String {
    let memfd = match record.to_memfd() {
        Ok(fd) => fd,
        Err(e) => return format!("cannot write the state record: {e}"),
    };
    let mut fds = record.fds();
    fds.push(memfd.as_raw_fd());
    for &fd in &fds {
        if let Err(e) = set_cloexec(fd, false) {
            restore_cloexec(&fds);
            return format!("cannot keep descriptor {fd} open across exec: {e}");
        }
    }
    let hosts: usize = record.workers.iter().map(Vec::len).sum();
    let sockets: usize = record
        .workers
        .iter()
        .flatten()
        .map(|h| h.sockets.len())
        .sum();
    info!(
        binary = %origin.exe.display(),
        hosts,
        sockets,
        descriptors = fds.len(),
        "hot upgrade: executing the new binary in place"
    );
    let cstr = |b: &[u8]| CString::new(b).unwrap_or_default();
    let exe = cstr(origin.exe.as_os_str().as_bytes());
    let args: Vec<CString> = origin.args.iter().map(|a| cstr(a.as_bytes())).collect();
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != STATE_ENV)
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            cstr(&kv)
        })
        .collect();
    env.push(cstr(
        format!("{STATE_ENV}={}", memfd.as_raw_fd()).as_bytes(),
    ));
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // The server's signals stay pending across the exec (the mask is
    // inherited) until the new image has its handlers: a SIGTERM or
    // another SIGUSR2 meanwhile neither kills it nor is lost.
    signal_mask(libc::SIG_BLOCK);
    // Those caught meanwhile (a SIGTERM during the pause): pending for this
    // thread, which the exec keeps.
    let caught = pending.swap(0, Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR2] {
        if caught & (1 << sig) != 0 {
            // SAFETY: raise(3) of a blocked signal: it stays pending.
            unsafe { libc::raise(sig) };
        }
    }
    // SAFETY: NUL-terminated strings and arrays that outlive the call; on
    // success it does not return.
    unsafe { libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    let e = std::io::Error::last_os_error();
    pending.fetch_or(caught, Ordering::SeqCst);
    signal_mask(libc::SIG_UNBLOCK);
    restore_cloexec(&fds);
    format!("execve {} failed: {e}", origin.exe.display())
}

/// Blocks (`SIG_BLOCK`) or unblocks the signals the server handles, for
/// the calling thread (`crate::run` unblocks them once its handlers are in).
pub fn signal_mask(how: libc::c_int) {
    // SAFETY: a sigset_t we own, filled by sigemptyset/sigaddset; the old
    // mask is not wanted.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR2] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

fn restore_cloexec(fds: &[RawFd]) {
    for &fd in fds {
        let _ = set_cloexec(fd, true);
    }
}
