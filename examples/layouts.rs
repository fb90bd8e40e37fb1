//! Prints the fixed-point layout the engine derives for a few typical policies.
//! Run with `cargo run --release --example layouts [CAPACITY RATE]...`.

use tokengate::Policy;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let policies: Vec<(u64, f64)> = if args.is_empty() {
        vec![
            (100, 20.0),
            (60, 10.0),
            (10, 0.5),
            (1_000, 1_000.0),
            (100_000, 1_157.0),
            (1_000_000, 1e9),
        ]
    } else {
        args.chunks(2)
            .map(|c| Ok((c[0].parse()?, c.get(1).ok_or("missing rate")?.parse()?)))
            .collect::<Result<_, Box<dyn std::error::Error>>>()?
    };
    println!(
        "| capacity B | rate r (tokens/s) | tick | F | T | R (units/tick) | effective rate | rate error | wrap period |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (capacity, rate) in policies {
        let policy = Policy::per_second(rate).burst(capacity)?;
        let l = policy.layout();
        let wrap = policy.wrap_period().as_secs_f64();
        let wrap = if wrap > 365.25 * 86400.0 {
            format!("{:.1} years", wrap / (365.25 * 86400.0))
        } else {
            format!("{:.0} days", wrap / 86400.0)
        };
        println!(
            "| {capacity} | {rate} | {:?} (2^{} ns) | {} | {} | {} | {:.6} | {:.1e} | {wrap} |",
            policy.tick(),
            l.tick_shift(),
            l.frac_bits(),
            l.tick_bits(),
            l.refill_per_tick(),
            policy.effective_refill_per_second(),
            policy.rate_error(),
        );
    }
    Ok(())
}
