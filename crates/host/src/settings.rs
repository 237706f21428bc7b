//! The `TCPS_*` settings of this process, read from the environment.
//!
//! A native program reads them when it needs them (it may set
//! `TCPS_SOCKET` before its first call). The preload library pins them
//! once, when it is loaded ([`pin_settings`]), because the program it runs
//! may replace or clear its environment before it opens a socket (nginx
//! with its perl module): from then on every read in this library answers
//! from the pinned copy, never from the environment again.

use std::ffi::{OsStr, OsString};
use std::sync::OnceLock;

static PINNED: OnceLock<Vec<(OsString, OsString)>> = OnceLock::new();

/// Copies every `TCPS_*` variable of the environment as it is now; later
/// calls (and changes to the environment) change nothing.
pub fn pin_settings() {
    PINNED.get_or_init(|| {
        std::env::vars_os()
            .filter(|(k, _)| k.as_encoded_bytes().starts_with(b"TCPS_"))
            .collect()
    });
}

/// The pinned `TCPS_*` variables (empty unless [`pin_settings`] ran): what
/// the preload hands on to a program it execs.
pub fn pinned_settings() -> &'static [(OsString, OsString)] {
    PINNED.get().map(Vec::as_slice).unwrap_or(&[])
}

/// The setting `name`: the pinned value if settings are pinned, else the
/// environment's.
pub fn setting(name: &str) -> Option<OsString> {
    match PINNED.get() {
        Some(vars) => vars
            .iter()
            .find(|(k, _)| k.as_os_str() == OsStr::new(name))
            .map(|(_, v)| v.clone()),
        None => std::env::var_os(name),
    }
}

/// The setting `name` as a string; `Err(value)` if it is not UTF-8.
pub fn setting_str(name: &str) -> Option<Result<String, OsString>> {
    setting(name).map(OsString::into_string)
}

/// An on/off setting, on unless set to `0`, `off`, `no` or `false`; read
/// once and then kept (e.g. `TCPS_ASYNC_SEND`, `TCPS_HOST_DOORBELL`).
pub struct Switch {
    name: &'static str,
    /// 0 not read yet, 1 on, 2 off.
    state: std::sync::atomic::AtomicU8,
}

impl Switch {
    pub const fn new(name: &'static str) -> Switch {
        Switch {
            name,
            state: std::sync::atomic::AtomicU8::new(0),
        }
    }

    pub fn on(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        match self.state.load(Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let off = setting_str(self.name).is_some_and(|v| {
                    v.is_ok_and(|v| matches!(v.trim(), "0" | "off" | "no" | "false"))
                });
                self.state.store(if off { 2 } else { 1 }, Relaxed);
                !off
            }
        }
    }
}

/// The setting `name` parsed as a number (`None` if unset or not one).
pub(crate) fn setting_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    setting_str(name)?.ok()?.trim().parse().ok()
}
