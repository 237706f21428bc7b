//! `tcps bench web --quick` with a tiny duration: the evaluation harness
//! (namespaces, servers, wrk, measurements, results.json, summary.md, plots)
//! keeps working. It checks the harness, not the speed.

mod common;

use std::process::Command;

#[test]
fn quick_run_writes_results() {
    let exe = env!("CARGO_BIN_EXE_tcps");
    if let Some(why) = common::bench_skip_reason(&["wrk"]) {
        eprintln!("bench_web: skipped: {why}");
        return;
    }
    let out = common::TempDir::new("bench-web");
    let run = Command::new(exe)
        .args([
            "bench",
            "web",
            "--quick",
            "--duration",
            "1",
            "--repeat",
            "2",
        ])
        .args([
            "--workloads",
            "static-16k,combined,http11",
            "--variants",
            "regular,sync,async,nginx",
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run tcps bench web");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "tcps bench web failed:\n{stderr}");

    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    for w in results {
        let curves = w["variants"].as_array().expect("variants");
        if w["workload"] == "combined" {
            // nginx serves no /dynamic: reported n/a with the reason.
            let n = curves
                .iter()
                .find(|c| c["variant"] == "nginx")
                .expect("nginx");
            assert_eq!(n["available"], false, "{n}");
            assert!(n["note"].as_str().unwrap_or("").contains("dynamic"), "{n}");
        }
        // The tcps variants report the host's round trips per request.
        let sync = curves
            .iter()
            .find(|c| c["variant"] == "sync")
            .expect("sync");
        assert!(
            sync["round_trips_per_req"].as_f64().unwrap_or(0.0) > 0.0,
            "{sync}"
        );
        // The tcps variants report the TCP server's economy per request
        // (a synchronous send is a system call or an enter, and a wake of
        // the thread waiting on it, now and then); Regular has no server.
        let e = &sync["server_economy"];
        assert!(
            e["syscalls_per_req"].as_f64().unwrap_or(0.0) > 0.0,
            "{sync}"
        );
        assert!(e["wakes_per_req"].as_f64().is_some(), "{sync}");
        assert!(
            e["heap_allocations_per_req"].as_f64().unwrap_or(9.0) < 1.0,
            "{sync}"
        );
        let regular = curves.iter().find(|c| c["variant"] == "regular");
        assert!(regular.is_some_and(|c| c["server_economy"].is_null()));
        for id in ["regular", "sync", "async", "nginx"] {
            if id == "nginx" && w["workload"] == "combined" {
                continue;
            }
            let c = curves
                .iter()
                .find(|c| c["variant"] == id)
                .unwrap_or_else(|| panic!("{id} missing in {w}"));
            assert!(c["saturation_rps"].as_f64().unwrap_or(0.0) > 0.0, "{c}");
            assert!(c["ratio_vs_regular"].as_f64().unwrap_or(0.0) > 0.0, "{c}");
            assert!(
                c["host_cpu_us_per_req"].as_f64().unwrap_or(0.0) > 0.0,
                "{c}"
            );
            assert!(
                c["total_cpu_us_per_req"].as_f64().unwrap_or(0.0) > 0.0,
                "{c}"
            );
            assert_eq!(c["points"].as_array().map(Vec::len), Some(2), "{c}");
            // --repeat 2: the curve's best point and one more round; the
            // saturation is their median (here their mean).
            let samples: Vec<f64> = c["saturation_samples"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
                .unwrap_or_default();
            assert_eq!(samples.len(), 2, "{c}");
            assert!(samples.iter().all(|&x| x > 0.0), "{c}");
            let mean = (samples[0] + samples[1]) / 2.0;
            let sat = c["saturation_rps"].as_f64().unwrap_or(0.0);
            assert!((sat - mean).abs() < 1e-6 * mean, "{c}");
        }
    }
    let summary = std::fs::read_to_string(out.path().join("summary.md")).expect("summary.md");
    assert!(summary.contains("Saturation throughput"), "{summary}");
    assert!(summary.contains("the median of 2 samples"), "{summary}");
    assert!(
        summary.contains("The TCP server's economy per request"),
        "{summary}"
    );
    // The namespaces of the run are gone.
    common::assert_no_stale_namespaces("tcpsbw-");
}
