//! Prints a fuzz input as the typed operations it decodes to, and runs its check.
//!
//! ```text
//! cargo run --example fuzz_input --features arbitrary -- rounding fuzz/artifacts/rounding/crash-...
//! ```
//!
//! The same decoding as the fuzz targets (`cargo +nightly fuzz fmt rounding FILE` prints
//! the same), on stable Rust. Exits with status 1 when the check fails.

use std::process::ExitCode;

use tokengate_testkit::replay::Target;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(target), Some(path)) = (args.first(), args.get(1)) else {
        eprintln!("usage: fuzz_input <rounding|packing|multi> FILE");
        return ExitCode::from(2);
    };
    let Some(target) = Target::from_name(target) else {
        eprintln!("unknown target {target:?}: rounding, packing or multi");
        return ExitCode::from(2);
    };
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    match target.describe(&bytes) {
        Some(input) => println!("{input}"),
        None => println!("(does not decode; the fuzz target skips it)"),
    }
    match target.run(&bytes) {
        Ok(tally) => {
            println!("ok: {tally:?}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            println!("FAILED: {}", failure.violation);
            ExitCode::FAILURE
        }
    }
}
