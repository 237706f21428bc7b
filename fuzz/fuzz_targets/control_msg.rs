//! Control-socket messages: the attach `Hello`, the `Welcome`, the control
//! messages (registration, fork/exec, file handles, adoption, doorbells),
//! the statistics query and socket addresses, from any bytes: decoded or
//! refused, never a panic; what decodes encodes back to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcps_proto::addr;
use tcps_proto::handshake::{ControlMsg, Hello, StatQuery, Welcome};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Some(h));
    }
    if let Some(w) = Welcome::decode(data) {
        assert!(Welcome::decode(&w.encode()).is_some());
    }
    if let Some(m) = ControlMsg::decode(data) {
        assert_eq!(ControlMsg::decode(&m.encode()), Some(m));
    }
    if let Some(q) = StatQuery::decode(data) {
        assert_eq!(StatQuery::decode(&q.encode()), Some(q));
    }
    let _ = addr::parse(data);
});
