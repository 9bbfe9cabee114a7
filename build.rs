//! Gives the shared library a SONAME on Linux: `libleasehold.so.<LH_ABI_VERSION>`. Programs
//! linked against it then record the ABI version rather than the development name
//! `libleasehold.so` (or, when linked by path, the build directory), so an installed library can
//! be replaced by any build with the same ABI and packaged as `libleasehold.so.<version>` with
//! the usual symlinks (`scripts/install-lib.sh`). The number is read from the one place the ABI
//! version is defined, so the two cannot drift apart.
use std::fs;

const ABI_SOURCE: &str = "src/ffi/types.rs";
const ABI_CONST: &str = "pub const LH_ABI_VERSION: u32 = ";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={ABI_SOURCE}");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let source = fs::read_to_string(std::path::Path::new(&dir).join(ABI_SOURCE))
        .expect("read src/ffi/types.rs");
    let abi: u32 = source
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(ABI_CONST)?
                .strip_suffix(';')?
                .parse()
                .ok()
        })
        .expect("src/ffi/types.rs defines LH_ABI_VERSION as a number");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libleasehold.so.{abi}");
}
