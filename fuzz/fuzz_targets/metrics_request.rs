//! The metrics endpoint's request parser (`GET /metrics` from any scraper
//! that reaches the port): any bytes route somewhere, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcps_server::metrics::http::{route, Route};

fuzz_target!(|data: &[u8]| {
    let r = route(data);
    if let Route::Metrics { .. } = r {
        assert!(data.starts_with(b"GET /metrics") || data.starts_with(b"HEAD /metrics"));
    }
});
