//! `tcps bench pingpong`: send/recv round trips between two tcps sockets
//! in one host thread, with the host library's counters around them.

use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use tcps::Client;

#[derive(Args, Debug)]
pub struct PingpongArgs {
    /// Round trips (each is 2 sends and 2 recvs)
    #[arg(long, default_value_t = 100_000)]
    pub count: usize,
    /// Message size in bytes
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Control socket of a running server [default: $TCPS_SOCKET or the default path]
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct PingpongReport {
    round_trips: usize,
    size: usize,
    socket_calls: u64,
    ns_per_round_trip: u64,
    /// Times the host rang the server's doorbell (an eventfd write: a system call).
    doorbells: u64,
    /// Times a host thread slept on a futex (a system call).
    sleeps: u64,
    /// Channel exchanges completed while spinning (no system call).
    spins_satisfied: u64,
    /// Host bytes copied per network byte (copying API: about 1).
    copies_per_network_byte: f64,
}

pub fn run(a: PingpongArgs) -> Result<(), Box<dyn std::error::Error>> {
    let client = match &a.socket {
        Some(p) => Client::attach(p)?,
        None => Client::attach_default()?,
    };
    let listener = client.tcp_listen("127.0.0.1:0".parse()?, 16)?;
    let addr = client.getsockname(listener)?;
    let left = client.tcp_connect(addr)?;
    let (right, _) = client.accept(listener, 0)?;
    for s in [left, right] {
        client.setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    }
    let msg: Vec<u8> = (0..a.size).map(|i| i as u8).collect();
    let mut buf = vec![0u8; a.size];
    let recv_exact = |s: u32, buf: &mut [u8]| -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let n = client.recv(s, &mut buf[got..], 0)?;
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ECONNRESET));
            }
            got += n;
        }
        Ok(())
    };
    let before = client.stats();
    let t = Instant::now();
    for _ in 0..a.count {
        client.send_all(left, &msg)?;
        recv_exact(right, &mut buf)?;
        client.send_all(right, &buf)?;
        recv_exact(left, &mut buf)?;
    }
    let elapsed = t.elapsed();
    let after = client.stats();
    if buf != msg {
        return Err("pingpong payload corrupted".into());
    }
    for s in [left, right, listener] {
        client.close(s)?;
    }
    let r = PingpongReport {
        round_trips: a.count,
        size: a.size,
        socket_calls: after.calls - before.calls,
        ns_per_round_trip: (elapsed.as_nanos() / a.count.max(1) as u128) as u64,
        doorbells: after.doorbells - before.doorbells,
        sleeps: after.sleeps - before.sleeps,
        spins_satisfied: after.spins_satisfied - before.spins_satisfied,
        copies_per_network_byte: (after.bytes_copied - before.bytes_copied) as f64
            / ((after.bytes_sent - before.bytes_sent)
                + (after.bytes_received - before.bytes_received))
                .max(1) as f64,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{} round trips of {} B: {} socket calls, {} ns per round trip; doorbells {}, futex sleeps {}",
            r.round_trips, r.size, r.socket_calls, r.ns_per_round_trip, r.doorbells, r.sleeps
        );
    }
    Ok(())
}
