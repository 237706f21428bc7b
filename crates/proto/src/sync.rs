//! The atomics and fences the ring types use: std's, or loom's when the
//! crate is built with `--cfg loom` for the model tests (`tests/loom.rs`).
//!
#[cfg(loom)]
pub use loom::sync::atomic::{fence, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, Ordering};
