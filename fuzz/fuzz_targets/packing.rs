//! The packed word's layout, encode/decode and pure transitions against `u128`
//! arithmetic: see `tokengate_testkit::check_packing`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokengate_testkit::{PackingCase, check_packing};

fuzz_target!(|case: PackingCase| {
    if let Err(violation) = check_packing(&case) {
        panic!("{violation}");
    }
});
