//! Runnable examples of Rein live beside this crate; run them with `cargo run --example NAME`.
