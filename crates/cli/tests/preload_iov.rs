//! Vectored sends with bad arguments get the kernel's errno through tcps
//! (`tests/preload/iov_errors.py`, run on both): a negative count EINVAL
//! (it became a zero-length send), more than IOV_MAX EINVAL, a NULL base
//! with a length EFAULT (it crashed the program), a `msg_iovlen` past 2^32
//! EMSGSIZE (it was truncated to an int).

mod common;
mod preload;

use common::{Server, TempDir};
use preload::*;
use std::time::Duration;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/iov_errors.py");

#[test]
fn bad_iovecs_fail_as_on_the_kernel() {
    need("python3");
    let srv = Server::start("uring", &[]);
    let dir = TempDir::new("iov");
    let mut outs = Vec::new();
    for net in [Net::Kernel, Net::Tcps] {
        let log = dir.path().join(format!("{net:?}.out"));
        let stats = dir.path().join(format!("{net:?}.stats"));
        let ok = run_to_end(
            command(net, &srv, &stats, &log, &["python3", SCRIPT]),
            &log,
            Duration::from_secs(30),
        );
        assert!(ok, "{net:?}: the script failed:\n{}", read(&log));
        outs.push(read(&log));
    }
    assert!(
        outs[0].contains("EFAULT") && outs[0].contains("EMSGSIZE"),
        "kernel run: {}",
        outs[0]
    );
    assert_eq!(
        outs[0], outs[1],
        "errnos differ (left: kernel, right: tcps)"
    );
}
