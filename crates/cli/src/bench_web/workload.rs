//! The workloads of thesis §6.4 and their files: what each requests, with
//! which send size, and the seeded Forth-like trace (Table 6.6).

use serde::Serialize;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::types::Error;

/// Thesis Table 6.6, "Synthetic": 128 files of 16 KB (2 MiB: larger than
/// this machine's 1 MiB L2).
pub const SYNTH_FILES: usize = 128;
pub const SYNTH_SIZE: usize = 16 * 1024;
/// Thesis Table 6.6, "Forth".
pub const FORTH_FILES: usize = 11_931;
pub const FORTH_AVG_FILE: f64 = 19.3 * 1024.0;
pub const FORTH_AVG_REQ: f64 = 8.8 * 1024.0;
/// Requests in each workload's request stream (clients cycle through it).
const STREAM_LEN: usize = 50_000;
/// Size of a /dynamic/N response (the static files' size).
const DYNAMIC_BYTES: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http {
    /// One request per connection ("GET … HTTP/1.0").
    V10,
    /// Six requests per connection, pipelined in bursts of three.
    V11Bursts,
}

#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    pub id: &'static str,
    pub label: &'static str,
    pub description: &'static str,
    /// Thesis figure of the throughput curve.
    pub figure: &'static str,
    pub send_size: usize,
    /// Thesis gains over Regular at saturation, in percent: (Sync, AsyncSend).
    pub thesis_gain_pct: (f64, f64),
    #[serde(skip)]
    pub http: Http,
}

pub fn all() -> Vec<Workload> {
    let w = |id, label, description, figure, send_size, gain, http| Workload {
        id,
        label,
        description,
        figure,
        send_size,
        thesis_gain_pct: gain,
        http,
    };
    vec![
        w("static-4k", "HTTP/1.0 static, 4 KiB sends",
          "HTTP/1.0, one request per connection, uniformly over 128 files of 16 KiB (2 MiB > L2); 4 KiB send size",
          "6.9", 4096, (7.0, 17.0), Http::V10),
        w("same-file", "HTTP/1.0 same file",
          "HTTP/1.0, one 16 KiB file requested repeatedly; 4 KiB send size",
          "6.11", 4096, (0.0, 0.0), Http::V10),
        w("combined", "HTTP/1.0 80% static / 20% dynamic",
          "HTTP/1.0, 80% static (as static-4k) and 20% /dynamic/16384 (one rand_r() per byte, WebStone); 4 KiB send size",
          "6.12", 4096, (11.0, 18.0), Http::V10),
        w("static-16k", "HTTP/1.0 static, 16 KiB sends",
          "HTTP/1.0 as static-4k with a 16 KiB send size (thesis AsyncSend figure is AsyncSend+Setup: +30%; Sock +15%)",
          "6.14", 16384, (22.0, 30.0), Http::V10),
        w("http11", "HTTP/1.1, 6 requests/connection in bursts of 3",
          "HTTP/1.1 keep-alive over the 128 static files, bursts of 3 pipelined requests, 6 requests per connection on average; 16 KiB send size",
          "6.16", 16384, (17.0, 27.0), Http::V11Bursts),
        w("trace", "Forth-like trace",
          "HTTP/1.0 over a seeded file set and request stream with the statistics of the Forth trace (Table 6.6); 16 KiB send size",
          "6.18", 16384, (19.0, 26.0), Http::V10),
    ]
}

/// xorshift64*: small, deterministic, good enough to pick files.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }
}

/// The statistics printed for (and recorded with) the generated trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceStats {
    pub files: usize,
    pub avg_file_bytes: f64,
    pub avg_request_bytes: f64,
    pub requests: usize,
    pub total_file_bytes: u64,
    pub largest_file_bytes: usize,
    pub seed: u64,
}

/// The Forth-like trace: file sizes log-normal (scaled to an average of
/// 19.3 KB, at most 1 MiB); popularity Zipf (α = 0.8) over ranks; files are
/// given ranks by a blend of "smaller is more popular" and chance, the blend
/// chosen by bisection so that the expected request size is 8.8 KB (real
/// traces request small files more often, hence the lower request average).
pub struct Trace {
    pub sizes: Vec<usize>,
    /// Indices into `sizes`.
    pub stream: Vec<usize>,
}

pub fn forth_trace(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let n = FORTH_FILES;
    // Log-normal by Box-Muller, σ = 1.2.
    let mut raw: Vec<f64> = (0..n)
        .map(|_| {
            let (u1, u2) = (rng.unit().max(1e-12), rng.unit());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (1.2 * z).exp()
        })
        .collect();
    // Scale to the target mean, respecting the cap (a few rounds converge).
    let cap = (1usize << 20) as f64;
    for _ in 0..20 {
        let mean = raw.iter().map(|&x| x.min(cap)).sum::<f64>() / n as f64;
        let k = FORTH_AVG_FILE / mean;
        raw.iter_mut().for_each(|x| *x *= k);
    }
    let sizes: Vec<usize> = raw.iter().map(|&x| x.clamp(64.0, cap) as usize).collect();
    // Zipf weights by rank.
    let weights: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(0.8)).collect();
    let wsum: f64 = weights.iter().sum();
    let mut by_size: Vec<usize> = (0..n).collect();
    by_size.sort_by_key(|&i| sizes[i]);
    let mut size_rank = vec![0usize; n];
    for (r, &i) in by_size.iter().enumerate() {
        size_rank[i] = r;
    }
    let noise: Vec<f64> = (0..n).map(|_| rng.unit() * n as f64).collect();
    let order = |t: f64| -> Vec<usize> {
        let mut o: Vec<usize> = (0..n).collect();
        let key = |i: usize| t * size_rank[i] as f64 + (1.0 - t) * noise[i];
        o.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
        o
    };
    let expected = |o: &[usize]| -> f64 {
        o.iter()
            .zip(&weights)
            .map(|(&i, w)| w * sizes[i] as f64)
            .sum::<f64>()
            / wsum
    };
    // t = 0: popularity independent of size (expect ≈ the file average);
    // t = 1: the smallest files are the most popular.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..30 {
        let mid = (lo + hi) / 2.0;
        if expected(&order(mid)) > FORTH_AVG_REQ {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let ranked = order((lo + hi) / 2.0);
    // Sample the stream from the cumulative weights.
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / wsum;
        cdf.push(acc);
    }
    let stream = (0..STREAM_LEN)
        .map(|_| {
            let u = rng.unit();
            let r = cdf.partition_point(|&c| c < u).min(n - 1);
            ranked[r]
        })
        .collect();
    Trace { sizes, stream }
}

impl Trace {
    pub fn stats(&self, seed: u64) -> TraceStats {
        let total: u64 = self.sizes.iter().map(|&s| s as u64).sum();
        let req: u64 = self.stream.iter().map(|&i| self.sizes[i] as u64).sum();
        TraceStats {
            files: self.sizes.len(),
            avg_file_bytes: total as f64 / self.sizes.len() as f64,
            avg_request_bytes: req as f64 / self.stream.len().max(1) as f64,
            requests: self.stream.len(),
            total_file_bytes: total,
            largest_file_bytes: self.sizes.iter().copied().max().unwrap_or(0),
            seed,
        }
    }
}

/// Writes `len` bytes of filler (content does not matter, it must be real
/// data rather than holes so the server reads memory).
fn write_file(path: &Path, len: usize, fill: &[u8]) -> Result<(), Error> {
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        let take = (len - data.len()).min(fill.len());
        data.extend_from_slice(&fill[..take]);
    }
    fs::write(path, &data).map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

fn filler(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..64 * 1024)
        .map(|_| b'a' + (rng.next_u64() % 26) as u8)
        .collect()
}

/// The document root of a workload under `base`: the trace has a root of
/// its own, so the registered-cache modes (which load every file under the
/// root at start) load only what the workload requests.
pub fn root_of(base: &Path, w: &Workload) -> std::path::PathBuf {
    base.join(if w.id == "trace" {
        "site-trace"
    } else {
        "site"
    })
}

/// The sites: `site/s/NNN.html` (synthetic) and, if `trace` is given,
/// `site-trace/t/NNNNN.html` (the trace's files).
pub fn make_site(base: &Path, trace: Option<&Trace>, seed: u64) -> Result<(), Error> {
    let fill = filler(seed);
    let synth = base.join("site/s");
    fs::create_dir_all(&synth)?;
    for i in 0..SYNTH_FILES {
        write_file(&synth.join(format!("{i:03}.html")), SYNTH_SIZE, &fill)?;
    }
    if let Some(t) = trace {
        let dir = base.join("site-trace/t");
        fs::create_dir_all(&dir)?;
        for (i, &len) in t.sizes.iter().enumerate() {
            write_file(&dir.join(format!("{i:05}.html")), len, &fill)?;
        }
    }
    Ok(())
}

/// The request stream of a workload: one URL path per line.
pub fn request_paths(w: &Workload, trace: Option<&Trace>, seed: u64) -> Result<String, Error> {
    let mut rng = Rng::new(seed ^ 0x5EED);
    let mut out = String::new();
    let synth = |rng: &mut Rng| format!("/s/{:03}.html", rng.below(SYNTH_FILES));
    for _ in 0..STREAM_LEN {
        let p = match w.id {
            "same-file" => "/s/000.html".to_string(),
            "combined" if rng.unit() < 0.2 => format!("/dynamic/{DYNAMIC_BYTES}"),
            "trace" => {
                let t = trace.ok_or("the trace workload needs its trace")?;
                return Ok(t.stream.iter().fold(String::new(), |mut s, i| {
                    let _ = writeln!(s, "/t/{i:05}.html");
                    s
                }));
            }
            _ => synth(&mut rng),
        };
        let _ = writeln!(out, "{p}");
    }
    Ok(out)
}

/// The wrk script: cycles through the request stream (each wrk thread from
/// its own offset) and, when `rate` is given, paces each thread to its share
/// of it wrk2-style: every request takes the next slot of a fixed schedule,
/// so the offered load does not drop when responses slow down (up to the
/// connection count). Clock: LuaJIT FFI `clock_gettime(CLOCK_MONOTONIC)`.
pub fn wrk_script(paths_file: &Path, http: Http, rate: Option<f64>, threads: u32) -> String {
    let per_request = match http {
        Http::V10 => 1.0,
        Http::V11Bursts => 3.0,
    };
    // Milliseconds between one thread's requests (a burst counts as one).
    let interval_ms = rate.map(|r| per_request * threads as f64 * 1000.0 / r.max(1.0));
    let mut s = format!(
        r#"-- generated by `tcps bench web`
local paths = {{}}
for line in io.lines("{paths}") do paths[#paths + 1] = line end
local counter = 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end
local i = nil
local bursts = 0
local function next_path()
  if i == nil then i = ((tid or 0) * 7919) % #paths end
  i = i % #paths + 1
  return paths[i]
end
"#,
        paths = paths_file.display()
    );
    s.push_str(match http {
        Http::V10 => {
            r#"function request()
  return "GET " .. next_path() .. " HTTP/1.0\r\nHost: bench\r\n\r\n"
end
"#
        }
        // wrk's Lua state is per thread, not per connection: every other
        // burst ends with "Connection: close", so connections carry 2 bursts
        // (6 requests) on average.
        Http::V11Bursts => {
            r#"function request()
  bursts = bursts + 1
  local last = (bursts % 2 == 0) and "Connection: close\r\n" or ""
  return "GET " .. next_path() .. " HTTP/1.1\r\nHost: bench\r\n\r\n"
      .. "GET " .. next_path() .. " HTTP/1.1\r\nHost: bench\r\n\r\n"
      .. "GET " .. next_path() .. " HTTP/1.1\r\nHost: bench\r\n" .. last .. "\r\n"
end
"#
        }
    });
    if let Some(iv) = interval_ms {
        let _ = write!(
            s,
            r#"local ffi = require("ffi")
ffi.cdef[[
typedef struct {{ long tv_sec; long tv_nsec; }} tcpsbw_ts;
int clock_gettime(int clk, tcpsbw_ts *tp);
]]
local ts = ffi.new("tcpsbw_ts")
local function now_ms()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local interval = {iv}
local slot = nil
function delay()
  local t = now_ms()
  if slot == nil then slot = t + interval * ((tid or 0) / {threads}) end
  slot = slot + interval
  local d = slot - t
  if d < 1 then return 0 end
  return math.floor(d)
end
"#
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_matches_table_6_6() {
        let t = forth_trace(1);
        let s = t.stats(1);
        assert_eq!(s.files, FORTH_FILES);
        assert!(
            (s.avg_file_bytes / FORTH_AVG_FILE - 1.0).abs() < 0.02,
            "{s:?}"
        );
        assert!(
            (s.avg_request_bytes / FORTH_AVG_REQ - 1.0).abs() < 0.10,
            "{s:?}"
        );
        // Deterministic.
        assert_eq!(forth_trace(1).stream[..100], t.stream[..100]);
    }

    #[test]
    fn combined_is_one_fifth_dynamic() {
        let w = all().into_iter().find(|w| w.id == "combined").unwrap();
        let p = request_paths(&w, None, 3).unwrap();
        let dynamic = p.lines().filter(|l| l.starts_with("/dynamic/")).count();
        let frac = dynamic as f64 / p.lines().count() as f64;
        assert!((frac - 0.2).abs() < 0.01, "{frac}");
    }
}
