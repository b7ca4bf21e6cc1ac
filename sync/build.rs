//! Declares the `loom` cfg so `#[cfg(loom)]` in this crate is a known cfg
//! (`RUSTFLAGS="--cfg loom"` builds the loom models in `tests/loom.rs`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
