//! `tcps bench cluster --quick` with a 1 s duration: the cluster
//! benchmark's harness (namespaces as nodes, Regular, local and remote
//! tcps, nginx over the fabric to one server and to two at once, wrk, CPU
//! and fabric counters, results.json, summary.md) keeps working, and the
//! namespaces are gone afterwards. It checks the harness, not the speed.

mod common;

use std::process::Command;

#[test]
fn quick_run_reports_every_configuration() {
    let exe = env!("CARGO_BIN_EXE_tcps");
    if let Some(why) = common::bench_skip_reason(&["wrk", "curl", "nginx"]) {
        eprintln!("bench_cluster: skipped: {why}");
        return;
    }
    let out = common::TempDir::new("bench-cluster");
    let run = Command::new(exe)
        .args(["bench", "cluster", "--quick", "--duration", "1"])
        // nginx-remote brings its baseline, nginx on kernel sockets.
        .args([
            "--configs",
            "regular,local,remote,nginx-remote,nginx-remote2",
        ])
        .args(["--connections", "16"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run tcps bench cluster");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "tcps bench cluster failed:\n{stderr}");
    // A progress line per measurement.
    for label in [
        "Regular",
        "local tcps",
        "remote tcps",
        "nginx, tcps run --remote",
        "nginx, tcps run --remote S1,S2",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with('[') && l.contains(label)),
            "{label}:\n{stderr}"
        );
    }

    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let rows = v["rows"].as_array().expect("rows");
    let ids: Vec<&str> = rows
        .iter()
        .filter_map(|r| r["config"]["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "regular",
            "local",
            "remote",
            "nginx",
            "nginx-remote",
            "nginx-remote2"
        ]
    );
    for r in rows {
        let id = r["config"]["id"].as_str().unwrap_or("");
        let m = &r["median"];
        assert!(r["error"].is_null(), "{r}");
        assert_eq!(r["samples"].as_array().map(Vec::len), Some(1), "{r}");
        assert!(r["samples"][0]["requests"].as_u64().unwrap_or(0) > 0, "{r}");
        for k in [
            "rps",
            "host_cpu_us_per_req",
            "app_node_cpu_us_per_req",
            "total_cpu_us_per_req",
        ] {
            assert!(m[k].as_f64().unwrap_or(0.0) > 0.0, "{id} {k}: {r}");
        }
        assert!(r["ratio_vs_baseline"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        let remote = id.contains("remote");
        // Two servers: two wrk processes, each through its server node,
        // both got answers; one wrk everywhere else.
        let each = &r["samples"][0]["each_rps"];
        if id == "nginx-remote2" {
            let each = each.as_array().expect("each_rps");
            assert_eq!(each.len(), 2, "{r}");
            assert!(each.iter().all(|x| x.as_f64().unwrap_or(0.0) > 0.0), "{r}");
        } else {
            assert!(each.is_null(), "{r}");
        }
        // Fabric traffic both ways, and only over the fabric; the remote
        // host's helper counts as the application's CPU.
        assert_eq!(m["fabric"].is_null(), !remote, "{r}");
        if remote {
            for k in [
                "messages_to_host",
                "messages_from_host",
                "bytes_to_host",
                "bytes_from_host",
            ] {
                assert!(
                    m["fabric"][k].as_f64().unwrap_or(0.0) > 0.0,
                    "{id} {k}: {r}"
                );
            }
            assert!(
                m["pump_cpu_us_per_req"].as_f64().unwrap_or(0.0) > 0.0,
                "{r}"
            );
        }
        // The web server's channel round trips per request (its library's
        // counters): through a TCP server only.
        if id == "local" || id == "remote" {
            assert!(m["round_trips_per_req"].as_f64().is_some(), "{r}");
        } else {
            assert!(m["round_trips_per_req"].is_null(), "{r}");
        }
        // A TCP server's CPU counts in the total, and on the application
        // node only when it runs there.
        let (host, node, total) = (
            m["host_cpu_us_per_req"].as_f64().unwrap_or(0.0),
            m["app_node_cpu_us_per_req"].as_f64().unwrap_or(0.0),
            m["total_cpu_us_per_req"].as_f64().unwrap_or(0.0),
        );
        match id {
            "regular" | "nginx" => assert!(host == node && node == total, "{r}"),
            "local" => assert!(host < node && node == total, "{r}"),
            _ => assert!(host == node && node < total, "{r}"),
        }
    }
    let summary = std::fs::read_to_string(out.path().join("summary.md")).expect("summary.md");
    assert!(
        summary.contains("| configuration | req/s | vs base |"),
        "{summary}"
    );
    for label in [
        "Regular (kernel sockets)",
        "local tcps",
        "remote tcps (UCX)",
        "nginx, tcps run --remote",
        "nginx, tcps run --remote S1,S2",
    ] {
        assert!(
            summary.contains(&format!("| {label}")),
            "{label}: {summary}"
        );
    }
    // The namespaces of the run (its pid is gone now) are deleted.
    common::assert_no_stale_namespaces("tcpsbc-");
}
