//! `tcps demo` (what `scripts/demo.sh` runs): the example web server in the
//! recommended configuration and the unmodified nginx (under `tcps run`),
//! each through tcps and on kernel sockets, side by side. A short run must
//! serve requests all four ways (the demo itself checks the served index
//! byte for byte before driving each) and print the four rows and the
//! ratios. nginx is installed by the test setup (scripts/test.sh).

mod common;

use common::TCPS;
use std::process::Command;

#[test]
fn demo_serves_through_tcps_and_the_kernel() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(TCPS)
        .args([
            "demo",
            "--duration",
            "1",
            "--connections",
            "8",
            "--rounds",
            "2",
            "--port",
        ])
        .arg(port.to_string())
        .output()
        .expect("run tcps demo");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "tcps demo failed:\n{text}");
    // The table: one row per variant, requests/s first.
    for variant in ["web/tcps", "nginx/tcps", "web/kernel", "nginx/kernel"] {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(variant))
            .unwrap_or_else(|| panic!("no {variant} row:\n{text}"));
        let rps: f64 = row
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(rps > 0.0, "{variant}: no requests served:\n{text}");
    }
    // Through tcps, the recommended configuration.
    assert!(
        text.contains("--net tcps --mode async-registered --take-direct"),
        "the web server did not run in the recommended configuration:\n{text}"
    );
    // nginx really ran under `tcps run`, through the TCP server.
    assert!(
        text.contains("starting nginx through `tcps run`"),
        "nginx did not run through tcps:\n{text}"
    );
    let server_cpu = |variant: &str| -> f64 {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(variant))
            .unwrap();
        row.split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap_or(0.0)
    };
    assert!(
        server_cpu("nginx/tcps") > 0.0,
        "the TCP server did no work for nginx:\n{text}"
    );
    for program in ["web", "nginx"] {
        assert!(
            text.contains(&format!("{program}: tcps / kernel requests/s")),
            "no {program} ratio line:\n{text}"
        );
    }
    // Medians of the rounds, like for like: nginx on kernel sockets with
    // one worker per core, and the one-line verdict.
    assert!(text.contains("medians of 2 rounds"), "no medians:\n{text}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        text.contains(&format!("starting nginx ({cores} workers)")),
        "nginx on kernel sockets did not get one worker per core:\n{text}"
    );
    assert!(
        text.contains("In one line, on this machine:"),
        "no verdict:\n{text}"
    );
}
