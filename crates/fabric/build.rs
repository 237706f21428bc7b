//! Links libucp and libucs (Debian `libucx-dev`). The declarations are
//! hand-written (`src/sys.rs`); nothing is generated.
fn main() {
    println!("cargo:rustc-link-lib=dylib=ucp");
    println!("cargo:rustc-link-lib=dylib=ucs");
    println!("cargo:rerun-if-changed=build.rs");
}
