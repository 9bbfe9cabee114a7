#![no_main]
//! cargo-fuzz target `resp`: see `leasehold_fuzz::resp_ops`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: leasehold_fuzz::resp_ops::Input| {
    leasehold_fuzz::resp_ops::run(&input);
});
