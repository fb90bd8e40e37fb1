//! `tokengate`: measure the engine against its peers across cores, and size a policy by
//! simulation.
//!
//! ```text
//! cargo run --release -p tokengate-cli -- bench       # throughput vs threads: tokengate, governor, a mutex bucket
//! cargo run --release -p tokengate-cli -- simulate    # replay traffic against B and r on a simulated clock
//! cargo run --release -p tokengate-cli -- fleet       # K processes share one budget on Redis

//! cargo run --release -p tokengate-cli -- tune LOG    # replay access logs against a grid of B and r
//! cargo run --release -p tokengate-cli -- check-config FILE  # validate a configuration, print what it means
//! ```

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod bench;
mod check_config;
mod engines;
mod fleet;
mod mutex_bucket;
mod simulate;
mod tune;

/// tokengate: a lock-free token-bucket admission engine.
///
/// `bench` measures admission decisions per second across threads, side by side with
/// governor and a mutex-protected bucket. `simulate` replays a traffic pattern against a
/// capacity B and refill rate r on a simulated clock, to choose B and r. `fleet` runs
/// instance processes sharing one budget on Redis and checks their total against the
/// bound. `tune` replays access logs (Apache or nginx, JSON lines, CSV; gzip or plain)
/// against a grid of B and r and prints the recommended policy as a configuration rule.
/// `check-config` validates a configuration file, checks that the engine can build it,
/// and prints what each rule means. Output files go to `--out` (default: the current
/// directory).
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
    /// K instance processes share one budget on Redis (tokengate-redis): per-instance and
    /// total admissions against the bound; can kill one instance mid-run.
    Fleet(fleet::Args),
    /// Replay access logs (CLF, JSON lines, CSV) against a grid of capacities and rates
    /// in parallel, and recommend a policy: a CSV of every cell, an SVG heatmap.
    Tune(Box<tune::Args>),
    /// Validate a configuration file (tokengate-config) and print each rule's effective
    /// rate, rate error, tick, wrap period and memory bound, with warnings against the
    /// traffic and queue figures the file gives; non-zero exit on any error.
    CheckConfig(check_config::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = Out::stdout();
    let outcome = match cli.command {
        Command::Bench(args) => bench::run(args, &mut out),
        Command::Simulate(args) => simulate::run(args, &mut out),
        Command::Fleet(args) => fleet::run(args, &mut out),
        Command::Tune(args) => tune::run(*args, &mut out),
        Command::CheckConfig(args) => check_config::run(args, &mut out),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Where the reports go: standard output in the program. Once the reader has gone
/// (`tokengate simulate | head`), writes fail with a broken pipe: that is no error, the
/// rest of the report is dropped, and the run still finishes (and writes its files).
#[derive(Debug)]
struct Out<W: Write = std::io::Stdout> {
    sink: W,
    closed: bool,
}

impl Out {
    fn stdout() -> Out {
        Out::new(std::io::stdout())
    }
}

impl<W: Write> Out<W> {
    fn new(sink: W) -> Out<W> {
        Out {
            sink,
            closed: false,
        }
    }

    /// Writes `text` as it is (no newline added).
    ///
    /// # Errors
    ///
    /// A message for any write error but a broken pipe.
    fn print(&mut self, text: &str) -> Result<(), String> {
        if self.closed {
            return Ok(());
        }
        match self
            .sink
            .write_all(text.as_bytes())
            .and_then(|()| self.sink.flush())
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(format!("cannot write to standard output: {e}")),
        }
    }
}

/// An output file written whole or not at all: opened before any work is done (a bad
/// path fails at once rather than after a long run), written to a temporary file beside
/// it, and renamed over it only when finished ([`write_output`]), so that a run stopped
/// half-way leaves the file as it was (the temporary one is removed when this is dropped
/// unfinished).
pub(crate) struct Output {
    file: Option<File>,
    partial: PathBuf,
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Opens `path` as an [`Output`], creating its directory; the message names the path.
fn open_output(path: &Path) -> Result<Output, String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
    }
    let name = path
        .file_name()
        .filter(|_| !std::fs::metadata(path).is_ok_and(|m| m.is_dir()));
    let Some(name) = name else {
        return Err(format!(
            "cannot open {} for writing: a directory",
            path.display()
        ));
    };
    let mut partial_name = std::ffi::OsString::from(".");
    partial_name.push(name);
    partial_name.push(format!(".partial-{}", std::process::id()));
    let partial = dir.map_or_else(|| PathBuf::from(&partial_name), |d| d.join(&partial_name));
    let file = File::create(&partial)
        .map_err(|e| format!("cannot open {} for writing: {e}", path.display()))?;
    Ok(Output {
        file: Some(file),
        partial,
    })
}

/// Writes a finished output file opened by [`open_output`], and puts it in place.
fn write_output(mut output: Output, path: &Path, contents: &str) -> Result<(), String> {
    let mut file = output.file.take().expect("an output is written once");
    let written = file
        .write_all(contents.as_bytes())
        .and_then(|()| file.flush())
        .and_then(|()| {
            drop(file);
            std::fs::rename(&output.partial, path)
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&output.partial);
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    Ok(())
}

/// Parses a whole number in `min..=max` for the option that sets `what`, counted in
/// `unit` (empty for a plain number, such as a seed); the message names both and the
/// valid range.
fn whole_number(text: &str, what: &str, unit: &str, min: u64, max: u64) -> Result<u64, String> {
    let range = if max == u64::MAX {
        format!("at least {min}")
    } else {
        format!("from {min} to {max}")
    };
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" of {unit}")
    };
    match text.trim().parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(format!(
            "{what} must be a whole number{unit}, {range}, got {text}"
        )),
    }
}

/// Parses a number above zero and at most `max` for the option that sets `what`,
/// counted in `unit` (empty for a plain fraction); the message names both and the valid
/// range. NaN and infinities are refused.
fn positive_number(text: &str, what: &str, unit: &str, max: f64) -> Result<f64, String> {
    let range = if max == f64::MAX {
        "above 0".to_string()
    } else {
        format!("above 0 and at most {}", show_number(max))
    };
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" of {unit}")
    };
    match text.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= max => Ok(v),
        _ => Err(format!("{what} must be a number{unit} {range}, got {text}")),
    }
}

/// Parses a positive duration: numbers with units, `ns`, `us`, `ms`, `s`, `m`, `h`
/// or `d` (`250ms`, `1.5s`, `1m 30s`), read as configuration files read them
/// ([`tokengate::serde_policy::parse_duration`], humantime's syntax).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('-') {
        return Err(
            if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                format!("duration `{text}` must be greater than zero")
            } else {
                format!("expected a duration such as 250ms, 2s or 1m, got `{text}`")
            },
        );
    }
    if !text.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!(
            "expected a duration such as 250ms, 2s or 1m, got `{text}`"
        ));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{text}` has no unit: write e.g. 250ms, 2s or 1m"));
    }
    let d = tokengate::serde_policy::parse_duration(text).map_err(|e| {
        format!("expected a duration such as 250ms, 2s or 1m 30s, got `{text}`: {e}")
    })?;
    if d.is_zero() {
        Err(format!("duration `{text}` must be greater than zero"))
    } else if d < Duration::from_micros(1) {
        Err(format!("duration `{text}` must be at least 1us"))
    } else {
        Ok(d)
    }
}

/// Writes a duration for people: `250 ms`, `1.5 s`, `2.5 min`, `3 h`.
fn show_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 7200.0 {
        format!("{} h", show_number(s / 3600.0))
    } else if s >= 120.0 {
        format!("{} min", show_number(s / 60.0))
    } else if s >= 1.0 {
        format!("{} s", show_number(s))
    } else if s >= 1e-3 {
        format!("{} ms", show_number(s * 1e3))
    } else {
        format!("{} us", show_number(s * 1e6))
    }
}

/// A number for people: at most 3 decimals and no trailing zeros (`25`, `0.125`), or
/// four significant digits with an exponent when that would hide it (`1e300`,
/// `2.5e-7`), so a huge or tiny value never prints as hundreds of digits or as `0`.
fn show_number(v: f64) -> String {
    let magnitude = v.abs();
    if magnitude != 0.0 && !(1e-3..1e7).contains(&magnitude) {
        let s = format!("{v:.3e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
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
    fn the_top_level_help_describes_every_subcommand() {
        let help = Cli::command().render_long_help().to_string();
        let about = &help[..help.find("Commands:").expect("a command list")];
        for name in ["bench", "simulate", "fleet", "tune", "check-config"] {
            assert!(about.contains(&format!("`{name}`")), "{name}: {help}");
        }
    }

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("0s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert!(
            parse_duration("3x")
                .unwrap_err()
                .contains("expected a duration")
        );
        assert!(
            parse_duration("-1s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(
            parse_duration("--rounds")
                .unwrap_err()
                .contains("expected a duration")
        );
        assert!(
            parse_duration("1.2.3s")
                .unwrap_err()
                .contains("expected a duration")
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
            &["tokengate", "simulate", "--mix", "a=1:1,"],
            &["tokengate", "simulate", "--capacity", "1e3"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?} was accepted");
        }
        assert!(Cli::try_parse_from(["tokengate", "bench", "--threads", "2"]).is_ok());
    }

    #[test]
    fn negative_numbers_reach_the_check_that_names_the_range() {
        for (args, message) in [
            (
                &["tokengate", "simulate", "--refill", "-5"][..],
                "the refill rate must be a number of tokens per second above 0, got -5",
            ),
            (
                &["tokengate", "simulate", "--capacity", "-1"],
                "the capacity must be a whole number of tokens, at least 1, got -1",
            ),
            (
                &["tokengate", "simulate", "--rate", "-1"],
                "above 0 and at most 1e9, got -1",
            ),
            (
                &["tokengate", "simulate", "--duration", "-1s"],
                "must be greater than zero",
            ),
            (
                &["tokengate", "simulate", "--seed", "-1"],
                "at least 0, got -1",
            ),
            (
                &["tokengate", "simulate", "--duty", "-0.5"],
                "at most 1, got -0.5",
            ),
            (
                &["tokengate", "bench", "--threads", "-1"],
                "from 1 to 1024, got -1",
            ),
            (
                &["tokengate", "bench", "--duration", "-1s"],
                "greater than zero",
            ),
        ] {
            let err = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{args:?}"
            );
            assert!(err.to_string().contains(message), "{args:?}: {err}");
        }
    }

    #[test]
    fn whole_numbers_name_the_unit_and_the_range() {
        assert_eq!(
            whole_number("12", "the capacity", "tokens", 1, u64::MAX),
            Ok(12)
        );
        assert_eq!(
            whole_number("1e3", "the capacity", "tokens", 1, u64::MAX),
            Err("the capacity must be a whole number of tokens, at least 1, got 1e3".into())
        );
        assert_eq!(
            whole_number("0", "the thread count", "", 1, 1024),
            Err("the thread count must be a whole number, from 1 to 1024, got 0".into())
        );
        assert_eq!(positive_number("2.5", "the rate", "x", 10.0), Ok(2.5));
        for bad in ["0", "-1", "11", "nan", "inf", "ten"] {
            assert!(
                positive_number(bad, "the rate", "x", 10.0).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn numbers_print_short_whatever_their_size() {
        assert_eq!(show_number(25.0), "25");
        assert_eq!(show_number(0.125), "0.125");
        assert_eq!(show_number(0.0), "0");
        assert_eq!(show_number(1_234_567.0), "1234567");
        assert_eq!(show_number(12_345_678.0), "1.235e7");
        assert_eq!(show_number(1e300), "1e300");
        assert_eq!(show_number(2.5e-7), "2.5e-7");
        assert_eq!(show_number(-4e9), "-4e9");
        assert_eq!(show_duration(Duration::from_secs(161)), "2.683 min");
        assert_eq!(show_duration(Duration::from_secs(86_400)), "24 h");
        assert_eq!(show_duration(Duration::from_millis(250)), "250 ms");
    }

    /// A reader that has gone away, or a disk that is full.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_silences_the_report_without_an_error() {
        let mut out = Out::new(Failing(io::ErrorKind::BrokenPipe));
        assert_eq!(out.print("table\n"), Ok(()));
        assert!(out.closed);
        assert_eq!(out.print("summary\n"), Ok(()));
        let mut out = Out::new(Failing(io::ErrorKind::StorageFull));
        assert!(
            out.print("table\n")
                .unwrap_err()
                .contains("standard output")
        );
        let mut out = Out::new(Vec::new());
        out.print("a\n").unwrap();
        out.print("b\n").unwrap();
        assert_eq!(out.sink, b"a\nb\n");
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

    /// An output file is replaced only when written whole: one dropped unfinished (a run
    /// that failed or was stopped) leaves the earlier file and no temporary one.
    #[test]
    fn an_output_file_is_replaced_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("tokengate-output-{}", std::process::id()));
        let path = dir.join("chart.svg");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, "earlier").unwrap();
        let entries = || std::fs::read_dir(&dir).unwrap().count();

        let unfinished = open_output(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "earlier");
        drop(unfinished);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "earlier");
        assert_eq!(entries(), 1, "the temporary file was left behind");

        let finished = open_output(&path).unwrap();
        write_output(finished, &path, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
