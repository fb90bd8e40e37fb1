//! One bucket on a manual clock against the exact reference models: any admission
//! beyond the ideal bucket at the configured rate, any balance above the capacity, any
//! difference from the grid-exact model, any panic is a crash. See
//! `tokengate_testkit::check`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokengate_testkit::{Scenario, check};

fuzz_target!(|scenario: Scenario| {
    if let Err(violation) = check(&scenario) {
        panic!("{violation}");
    }
});
