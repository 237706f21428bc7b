//! Where io_uring is unavailable the server falls back to epoll, says so in
//! its log, and serves as usual.
//!
//! This binary holds one test only: it switches io_uring off machine-wide
//! (`kernel.io_uring_disabled = 2`) for a moment, and cargo runs test
//! binaries one after another, so no other tcps test sees it. The previous
//! value is restored on every path out.

mod common;

use common::*;

const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(SYSCTL, &self.0);
    }
}

#[test]
fn uring_unavailable_falls_back_to_epoll() {
    let before = std::fs::read_to_string(SYSCTL).expect("kernel.io_uring_disabled (kernel >= 6.6)");
    let _restore = Restore(before.trim().to_string());
    std::fs::write(SYSCTL, "2").expect("set kernel.io_uring_disabled (needs root)");
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let c = srv.attach();
    echo_roundtrip(
        &c,
        kernel_echo_server("127.0.0.1:0"),
        &Rng::new(11).bytes(200_000),
    );
    let log = srv.log_text();
    assert!(
        log.contains("io_uring unavailable; falling back to the epoll engine"),
        "{log}"
    );
    assert!(
        log.contains("engine=\"epoll\""),
        "the worker did not run on epoll:\n{log}"
    );
}
