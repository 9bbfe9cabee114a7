#![no_main]
//! cargo-fuzz target `client_ops`: see `leasehold_fuzz::client_ops`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: leasehold_fuzz::client_ops::Input| {
    leasehold_fuzz::client_ops::run(&input);
});
