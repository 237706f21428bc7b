//! Request decoding and validation: any 64 bytes a host writes into a
//! request slot become a checked `Call` or an `Invalid`, never a panic; a
//! call that decodes encodes back to a request that decodes to it again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcps_proto::{Call, Request};

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; std::mem::size_of::<Request>()];
    let n = data.len().min(raw.len());
    raw[..n].copy_from_slice(&data[..n]);
    // SAFETY: Request is plain integers (repr(C)); any bytes are a value.
    let req: Request = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
    // The arena size the host's region has (the server's own copy).
    let arena = 4096u32 << (data.get(64).copied().unwrap_or(0) % 8);
    if let Ok(call) = Call::decode(&req, arena) {
        let again = Call::decode(&call.encode(), arena);
        assert_eq!(
            again.as_ref().ok(),
            Some(&call),
            "encode/decode differ for {req:?}"
        );
    }
});
