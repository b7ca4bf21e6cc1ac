//! Declares the `loom` cfg so `#[cfg(loom)]` in `io::sync` is a known cfg
//! (`RUSTFLAGS="--cfg loom"` builds the loom models).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
