//! Only active hosts are scanned (issue 15 item 2): a worker pass reads the
//! channels of hosts at work, not of every host attached. 50 idle hosts
//! (each used a channel once) go dormant; while one more host exchanges
//! messages on one connection, the passes read about one host and its
//! channels each (`tcps stat`'s `server.scan`), where reading every
//! attached host would be 51 hosts per pass. A dormant host's next call
//! wakes it and is answered. The 10 ms backstop sweep of send queues looks
//! at the queues bound to a socket, not at every queue slot of every host.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const IDLE_HOSTS: usize = 50;

fn scan(v: &Value) -> &Value {
    &v["server"]["scan"]
}

fn counter(v: &Value, name: &str) -> u64 {
    scan(v)[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no server.scan.{name}: {v:#}"))
}

/// `tcps stat` once `pred` holds of it (the workers publish every 100 ms).
fn stat_when(srv: &Server, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let v = srv.stat_json();
        if pred(&v) {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{what}: {v:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn idle_hosts_are_not_scanned(engine: &str) {
    let srv = Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--max-hosts",
            "64",
            "--max-hosts-per-uid",
            "0",
            "--channels",
            "4",
            "--arena-kib",
            "16",
        ],
    );
    // Idle hosts that used a channel once (a listener each), as attached
    // programs that wait for something else would.
    let idle: Vec<_> = (0..IDLE_HOSTS)
        .map(|_| {
            let c = srv.attach();
            let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
            (c, l)
        })
        .collect();
    stat_when(&srv, "idle hosts never went dormant", |v| {
        counter(v, "hosts_dormant") >= IDLE_HOSTS as u64
    });

    // One host at work: request/response on a connection of its own.
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let a = c.tcp_connect(addr).unwrap();
    let (b, _) = c.accept(l, 0).unwrap();
    let before = srv.stat_json();
    let t = Instant::now();
    let mut rounds = 0u32;
    while t.elapsed() < Duration::from_millis(300) {
        let msg = rounds.to_le_bytes();
        c.send_all(a, &msg).unwrap();
        assert_eq!(tcps_recv_exact(&c, b, 4).unwrap(), msg);
        c.send_all(b, &msg).unwrap();
        assert_eq!(tcps_recv_exact(&c, a, 4).unwrap(), msg);
        rounds += 1;
    }
    let passes0 = counter(&before, "passes");
    let after = stat_when(&srv, "the exchange's passes were never published", |v| {
        counter(v, "passes") > passes0 + u64::from(rounds)
    });
    let d = |name| counter(&after, name) - counter(&before, name);
    let passes = d("passes") as f64;
    let hosts_per_pass = d("hosts_looked") as f64 / passes;
    let channels_per_pass = d("channels_looked") as f64 / passes;
    eprintln!(
        "{rounds} round trips, {passes} passes: {hosts_per_pass:.2} hosts and \
         {channels_per_pass:.2} channels looked at per pass, {} hosts dormant, \
         {} made dormant, {} woken",
        counter(&after, "hosts_dormant"),
        d("dormant_entered"),
        d("dormant_woken")
    );
    // Scanning every attached host would be 51 hosts (and at least 51
    // channels) per pass.
    assert!(hosts_per_pass <= 1.5, "{hosts_per_pass} hosts per pass");
    assert!(
        channels_per_pass <= 4.5,
        "{channels_per_pass} channels per pass"
    );
    assert!(counter(&after, "hosts_dormant") >= IDLE_HOSTS as u64);

    // A dormant host's next call rings, wakes it and is answered.
    let woken0 = counter(&after, "dormant_woken");
    let (c7, l7) = &idle[7];
    let name = c7.getsockname(*l7).unwrap();
    assert_ne!(name.port(), 0);
    let k = std::net::TcpStream::connect(name).unwrap();
    let (s, _) = c7.accept(*l7, 0).unwrap();
    drop(k);
    c7.close(s).unwrap();
    stat_when(&srv, "the dormant host's call did not wake it", |v| {
        counter(v, "dormant_woken") > woken0
    });
}

/// A dormant host that publishes a request without ringing (it breaks the
/// protocol) is still served, by the look at dormant hosts every 100 ms,
/// and counted (`dormant_backstop`).
fn dormant_host_that_does_not_ring(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive"]);
    let raw = RawCalls::new(RawHost::attach(&srv.socket).unwrap());
    assert_eq!(raw.run(tcps_proto::Call::Nop).errno, 0);
    stat_when(&srv, "the host never went dormant", |v| {
        counter(v, "hosts_dormant") >= 1
    });
    raw.publish(tcps_proto::Call::Nop.encode());
    let c = raw
        .next_completion(Duration::from_secs(3))
        .expect("a dormant host's request was never served");
    assert_eq!(c.errno, 0);
    stat_when(&srv, "the backstop did not count it", |v| {
        counter(v, "dormant_backstop") >= 1
    });
}

/// The backstop sweep looks at bound send queues only: one host with one
/// sending socket among its 1024 queue slots costs about one queue per
/// sweep (every slot would be 1024).
fn the_sweep_looks_only_at_bound_queues(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--send-queues", "1024"]);
    let c = srv.attach();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (mut k, _) = l.accept().unwrap();
    // An asynchronous send binds the socket's queue.
    assert_eq!(c.send_async(s, b"bound", 0).unwrap(), 5);
    c.flush_async(s, Some(Duration::from_secs(5))).unwrap();
    let mut got = [0u8; 5];
    std::io::Read::read_exact(&mut k, &mut got).unwrap();
    assert_eq!(&got, b"bound");
    let before = srv.stat_json();
    let sweeps0 = counter(&before, "sweeps");
    let after = stat_when(&srv, "no 20 sweeps were published", |v| {
        counter(v, "sweeps") >= sweeps0 + 20
    });
    let sweeps = counter(&after, "sweeps") - sweeps0;
    let swept = counter(&after, "queues_swept") - counter(&before, "queues_swept");
    let per_sweep = swept as f64 / sweeps as f64;
    eprintln!("{sweeps} sweeps looked at {swept} send queues ({per_sweep:.2} each)");
    assert!(
        swept > 0,
        "the sweep looked at no queue: the backstop is off"
    );
    assert!(
        per_sweep <= 2.0,
        "{per_sweep} queues per sweep (1024 slots)"
    );
}

engine_tests!(
    idle_hosts_are_not_scanned,
    dormant_host_that_does_not_ring,
    the_sweep_looks_only_at_bound_queues
);
