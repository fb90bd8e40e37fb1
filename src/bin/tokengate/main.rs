//! `tokengate`: measure the engine against its peers across cores, and size a policy by
//! simulation.
//!
//! ```text
//! cargo run --release -- bench       # throughput vs threads: tokengate, governor, a mutex bucket
//! cargo run --release -- simulate    # replay traffic against B and r on a simulated clock
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod bench;
mod engines;
mod mutex_bucket;
mod simulate;

/// tokengate: a lock-free token-bucket admission engine.
///
/// `bench` measures admission decisions per second across threads, side by side with
/// governor and a mutex-protected bucket. `simulate` replays a traffic pattern against a
/// capacity B and refill rate r on a simulated clock, to choose B and r.
#[derive(Debug, Parser)]
#[command(name = "tokengate", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Throughput across threads: millions of decisions per second per engine and the
    /// ratio to governor; writes a CSV file and an SVG chart.
    Bench(bench::Args),
    /// Replay steady, bursty or Poisson traffic against a policy on a simulated clock:
    /// admitted and rejected per class, the sustained rate, and an SVG chart.
    Simulate(simulate::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Simulate(args) => simulate::run(args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Where output files go unless a path is given: `target/tokengate-bench/` under the
/// current directory.
fn default_output(file: &str) -> PathBuf {
    Path::new("target").join("tokengate-bench").join(file)
}

/// Creates the parent directory of `path`, with a message naming it on failure.
fn create_parent(path: &Path) -> Result<(), String> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create directory {}: {e}", dir.display())),
        _ => Ok(()),
    }
}

/// Parses a positive duration: a number and a unit, `ns`, `us`, `ms`, `s` or `m`
/// (`250ms`, `1.5s`, `2m`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit: write e.g. 250ms, 2s or 1m"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{number}` in `{text}` is not a number"))?;
    let seconds_per_unit = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use ns, us, ms, s or m"
            ));
        }
    };
    let seconds = value * seconds_per_unit;
    if seconds.is_nan() || seconds <= 0.0 {
        return Err(format!("duration `{text}` must be greater than zero"));
    }
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("duration `{text}` is too long"))
        .and_then(|d| {
            if d < Duration::from_micros(1) {
                Err(format!("duration `{text}` must be at least 1us"))
            } else {
                Ok(d)
            }
        })
}

/// Writes a duration for people: `250 ms`, `1.5 s`.
fn show_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{} s", trim_float(s))
    } else if s >= 1e-3 {
        format!("{} ms", trim_float(s * 1e3))
    } else {
        format!("{} us", trim_float(s * 1e6))
    }
}

/// A float with at most 3 decimals and no trailing zeros.
fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("0s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(parse_duration("3h").unwrap_err().contains("unknown unit"));
        assert!(
            parse_duration("1.2.3s")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(parse_duration("1e300s").is_err());
    }

    #[test]
    fn bad_arguments_are_refused_by_the_parser() {
        for args in [
            &["tokengate", "bench", "--threads", "0"][..],
            &["tokengate", "bench", "--engines", "nginx"],
            &["tokengate", "bench", "--duration", "-1s"],
            &["tokengate", "simulate", "--pattern", "chaotic"],
            &["tokengate", "simulate", "--start", "half"],
            &["tokengate", "simulate", "--mix", "search=3"],
            &["tokengate", "simulate", "--rate", "0"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?} was accepted");
        }
        assert!(Cli::try_parse_from(["tokengate", "bench", "--threads", "2"]).is_ok());
    }

    // Tests of the files `benches/engine.rs` shares (it includes them with `#[path]`).
    use crate::engines::{Engine, KEYS, Limiter, Regime, Visit, random_key, thread_seed};
    use crate::mutex_bucket::MutexBucket;

    #[test]
    fn mutex_bucket_admits_its_burst_then_rejects() {
        // 1 token per hour: nothing refills during the test.
        let bucket = MutexBucket::new(3.0, 1.0 / 3600.0);
        let admitted = (0..10).filter(|_| bucket.try_acquire(1.0)).count();
        assert_eq!(admitted, 3);
    }

    #[test]
    fn random_keys_stay_in_range_and_spread() {
        let mut rng = thread_seed(0);
        let keys: Vec<u64> = (0..10_000).map(|_| random_key(&mut rng)).collect();
        assert!(keys.iter().all(|&k| k < KEYS));
        assert!(keys.iter().any(|&k| k < KEYS / 10));
        assert!(keys.iter().any(|&k| k > KEYS - KEYS / 10));
    }

    #[test]
    fn every_engine_builds_in_each_of_its_regimes_and_decides() {
        struct Once;
        impl Visit for Once {
            type Out = bool;
            fn visit<L: Limiter>(self, limiter: &L) -> bool {
                limiter.decide(&mut thread_seed(0))
            }
        }
        for engine in Engine::ALL {
            for &regime in engine.regimes() {
                // Every regime starts full, so the first decision admits.
                assert_eq!(
                    engine.visit(regime, Once),
                    Ok(true),
                    "{engine:?} {regime:?}"
                );
            }
        }
        assert!(Engine::Governor.visit(Regime::Keyed, Once).is_err());
    }
}
