#![no_main]
//! cargo-fuzz target `sim`: see `leasehold_fuzz::sim`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: leasehold_fuzz::sim_ops::Input| {
    leasehold_fuzz::sim_ops::run(&input);
});
