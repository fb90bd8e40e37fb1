//! All-or-nothing acquisition across buckets with refunds: conservation exact for every
//! bucket against its own models. See `tokengate_testkit::check_multi`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokengate_testkit::{MultiScenario, check_multi};

fuzz_target!(|scenario: MultiScenario| {
    if let Err(violation) = check_multi(&scenario) {
        panic!("{violation}");
    }
});
