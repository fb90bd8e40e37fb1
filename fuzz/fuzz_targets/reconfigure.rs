//! Reconfiguration: the conversion between any two layouts against exact arithmetic, and
//! a live bucket switching policies against an ideal bucket per policy: see
//! `tokengate_testkit::check_reconfigure`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokengate_testkit::{ReconfigureCase, check_reconfigure};

fuzz_target!(|case: ReconfigureCase| {
    if let Err(violation) = check_reconfigure(&case) {
        panic!("{violation}");
    }
});
