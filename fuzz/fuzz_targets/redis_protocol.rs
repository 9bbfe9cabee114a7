#![no_main]
//! cargo-fuzz target `redis_protocol`: see `leasehold_fuzz::redis_ops`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: leasehold_fuzz::redis_ops::Input| {
    leasehold_fuzz::redis_ops::run(&input);
});
