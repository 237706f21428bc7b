//! Poll modes as a correctness property: an idle server in `adaptive` or
//! `block` mode sleeps (uses < 5% of a CPU with a host attached), and still
//! wakes at once when the host calls. `busy` is measured too, to show the
//! measurement can see a spinning server.

mod common;

use common::*;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Busy servers spin a whole core: run at most one at a time, so the
/// measurement of one is not starved by another.
static BUSY: Mutex<()> = Mutex::new(());

/// CPU seconds the server used per wall second over `window`.
fn cpu_share(srv: &Server, window: Duration) -> f64 {
    let hz = clock_ticks_per_sec() as f64;
    let t0 = Instant::now();
    let c0 = cpu_ticks(srv.pid());
    std::thread::sleep(window);
    let c1 = cpu_ticks(srv.pid());
    let wall = t0.elapsed().as_secs_f64();
    (c1 - c0) as f64 / hz / wall
}

fn idle(engine: &str, poll: &str) {
    let srv = Server::start(engine, &["--poll", poll]);
    let c = srv.attach();
    // Use a few channels and park a call, as a real idle host would: an
    // accept waiting on a listener and a recv waiting on a connection.
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
    let k = std::net::TcpStream::connect(c.getsockname(l).unwrap()).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    let c2 = c.clone();
    let parked = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        c2.recv(s, &mut b, 0).map(|n| b[..n].to_vec())
    });
    for _ in 0..10 {
        c.nop().unwrap();
    }
    // Settle past the adaptive spin (50 µs) and startup.
    std::thread::sleep(Duration::from_millis(200));
    let share = cpu_share(&srv, Duration::from_secs(1));
    eprintln!(
        "{engine} --poll {poll}: idle server used {:.1}% of a CPU",
        share * 100.0
    );
    assert!(
        share < 0.05,
        "{engine} --poll {poll}: an idle server used {:.1}% of a CPU (limit 5%)",
        share * 100.0
    );
    // And it still wakes for calls: 20 calls after short idle gaps. A lost
    // doorbell would cost up to the server's longest sleep each time.
    let t = Instant::now();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(5));
        c.nop().unwrap();
    }
    let calls = t.elapsed() - Duration::from_millis(100);
    assert!(
        calls < Duration::from_secs(2),
        "20 calls after idle gaps took {calls:?}: the doorbell does not wake the server"
    );
    // The parked recv wakes on data.
    use std::io::Write;
    (&k).write_all(b"data").unwrap();
    let got = within(
        Duration::from_secs(5),
        "parked recv after idleness",
        move || parked.join().unwrap(),
    )
    .unwrap();
    assert_eq!(got, b"data");
}

fn idle_adaptive(engine: &str) {
    idle(engine, "adaptive")
}

fn idle_block(engine: &str) {
    idle(engine, "block")
}

/// The measurement is able to see a spinning server.
fn busy_is_visible(engine: &str) {
    let _one = BUSY.lock().unwrap_or_else(|p| p.into_inner());
    let srv = Server::start(engine, &["--poll", "busy"]);
    let c = srv.attach();
    c.nop().unwrap();
    let share = cpu_share(&srv, Duration::from_secs(1));
    eprintln!(
        "{engine} --poll busy: server used {:.1}% of a CPU",
        share * 100.0
    );
    assert!(
        share > 0.2,
        "--poll busy should spin, but used only {:.1}% of a CPU",
        share * 100.0
    );
}

engine_tests!(idle_adaptive, idle_block, busy_is_visible);
