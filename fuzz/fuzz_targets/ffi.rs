#![no_main]
//! cargo-fuzz target `ffi`: see `leasehold_fuzz::ffi_ops`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: leasehold_fuzz::ffi_ops::Input| {
    leasehold_fuzz::ffi_ops::run(&input);
});
