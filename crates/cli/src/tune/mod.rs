//! `tokengate tune`: replays access logs against a grid of policies and recommends one.
//!
//! The logs are read once, as a stream: each line is parsed, keyed, costed by the work
//! classes, put back in time order within `--reorder-window`, and collected into chunks of
//! at most `--chunk` requests (plus one second's worth). Each chunk is replayed on every
//! cell of the grid in parallel (rayon, one task per cell); each cell is a keyed limiter of
//! its policy on its own manual clock, so its decisions are the engine's decisions for
//! that traffic, bounded keys and eviction included. Memory is the chunk (16 bytes a
//! request), the key table (each distinct key once, with its volume), and per cell its
//! limiter and one rejection counter per key: it does not grow with the log's length.
//!
//! # The recommendation rule
//!
//! Among the cells whose measure (`--objective`, default `small-keys`) is at most
//! `--max-rejected` (default 0.001, that is 0.1%), the one with the smallest rate, and
//! among those the smallest capacity; only cells the log can judge are eligible: those
//! whose fill time `B / r` is at most half the log's span (from its first request to its
//! last). A bucket that takes longer to refill never shows its rate in the log: each key's
//! traffic fits in its burst, and any lower rate would decide the same, so the log cannot
//! tell that rate from a lower one. Such cells are still replayed, and marked in the CSV
//! (`judgeable`), the table and the heatmap. When no eligible cell meets the objective the
//! run says so, with the nearest cells (the eligible cell with the lowest share, and the
//! cell meeting the objective that fills soonest), and fails.
//!
//! The default measure is the share of requests rejected among keys whose volume
//! (requests in the log) is below the volume of the key at the `--volume-percentile`
//! (default 99, nearest rank over keys): the limit should leave ordinary clients alone
//! and hold back only the heaviest. When no key is below that volume (one key, or keys
//! all equally busy) every request counts.

mod classes;
mod format;
mod grid;
mod report;
mod stream;
mod time;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use tokengate::ManualClock;
use tokengate::scope::ScopeKind;
use tokengate_config::Config;

use crate::{
    Out, open_output, parse_duration, positive_number, show_duration, show_number, whole_number,
    write_output,
};
use classes::{Class, Classes};
use format::{Format, JsonFields, KeyChoice, LineParser};
use grid::{Cell, Setup};
use report::{Measures, Objective, Outcome, Population, Recommendation};
use stream::{Keys, Orderer, Reading, Scan, Spread};

/// The most cells on one axis.
const MAX_STEPS: u64 = 1000;

/// The grid's capacities and rates unless given.
const DEFAULT_CAPACITIES: (u64, u64) = (1, 1000);
const DEFAULT_RATES: (f64, f64) = (0.1, 1000.0);

/// The longest reorder window.
const MAX_WINDOW_SECS: u64 = 3600;

/// Options of `tokengate tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Access logs, read in order as one stream (`-` for standard input); gzip files are
    /// recognized by their first bytes.
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,

    /// The format of the lines. clf: Common or Combined Log Format (nginx, Apache).
    /// json: one object a line, fields named by --json-*. csv: timestamp,key,cost.
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Clf)]
    format: Format,

    /// What a bucket is kept for: client (the client address; CSV's key column), path
    /// (the path's first segment), global (one bucket for all), or field:NAME (a field of
    /// the line: in CLF ident, user, referer, user-agent, or extraN for the N-th quoted
    /// field after the user agent; in JSON any field, `a.b` for nested).
    #[arg(long, short = 'k', value_name = "KEY", default_value = "client",
          value_parser = KeyChoice::parse)]
    key: KeyChoice,

    /// JSON: the field of the time (RFC 3339 or CLF text, or epoch seconds).
    #[arg(long, value_name = "FIELD", default_value = "time")]
    json_time: String,
    /// JSON: the field of the client address.
    #[arg(long, value_name = "FIELD", default_value = "remote_addr")]
    json_client: String,
    /// JSON: the field of the HTTP method.
    #[arg(long, value_name = "FIELD", default_value = "method")]
    json_method: String,
    /// JSON: the field of the path.
    #[arg(long, value_name = "FIELD", default_value = "path")]
    json_path: String,
    /// JSON: a field with the cost in tokens, if the log has one (else --class decides).
    #[arg(long, value_name = "FIELD")]
    json_cost: Option<String>,

    /// A work class, `METHOD PATTERN=COST` (repeatable; the first match wins): requests
    /// with that method (`*` for any) and a path matching PATTERN (`*` matches any run of
    /// characters) cost COST tokens. Example: --class 'POST /export/*=20'.
    #[arg(long = "class", value_name = "CLASS", value_parser = Class::parse)]
    classes: Vec<Class>,

    /// The cost of a request no class matches, in tokens.
    #[arg(long, value_name = "TOKENS", default_value = "1",
          value_parser = |s: &str| whole_number(s, "the default cost", "tokens", 1, format::MAX_COST))]
    default_cost: u64,

    /// The capacities B of the grid, LOW..HIGH in whole tokens [default: 1..1000,
    /// widened once, by up to two decades, when the recommendation has the highest
    /// capacity and the log can judge larger ones].
    #[arg(long, value_name = "LOW..HIGH", value_parser = capacity_range)]
    capacities: Option<(u64, u64)>,

    /// The refill rates r of the grid, LOW..HIGH in tokens per second [default:
    /// 0.1..1000, widened once, by up to two decades, when the recommendation has the
    /// lowest rate and the log can judge lower ones].
    #[arg(long, value_name = "LOW..HIGH", value_parser = rate_range)]
    rates: Option<(f64, f64)>,

    /// Capacities in the grid, log-spaced (fewer when rounding to whole tokens makes
    /// some equal).
    #[arg(long, value_name = "N", default_value = "20",
          value_parser = |s: &str| whole_number(s, "the number of capacities", "", 1, MAX_STEPS))]
    capacity_steps: u64,

    /// Rates in the grid, log-spaced (rounded to 3 significant digits).
    #[arg(long, value_name = "N", default_value = "20",
          value_parser = |s: &str| whole_number(s, "the number of rates", "", 1, MAX_STEPS))]
    rate_steps: u64,

    /// Where inside its second a request logged with a whole-second time is placed:
    /// even (the second's requests evenly spaced, in log order), random (uniform, seeded
    /// by --seed), start (all at the start: a burst each second).
    #[arg(long, value_enum, default_value_t = Spread::Even)]
    spread: Spread,

    /// Seed of --spread random.
    #[arg(long, value_name = "SEED", default_value = "0",
          value_parser = |s: &str| whole_number(s, "the seed", "", 0, u64::MAX))]
    seed: u64,

    /// How much earlier than the latest line before it a line may be and still be
    /// replayed in order (rounded up to whole seconds, at most 1h); an earlier line is a
    /// bad line. Servers such as Apache and nginx log a request's start time when it
    /// ends, so a line may be as much earlier as the longest request took: the default
    /// holds requests of up to two minutes (memory: the requests of one window).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = window)]
    reorder_window: u64,

    /// The keyed limiter's maximum number of keys; a new key beyond it is rejected
    /// unless a sweep has evicted refilled buckets.
    #[arg(long, value_name = "KEYS", default_value = "1048576",
          value_parser = |s: &str| whole_number(s, "the maximum number of keys", "", 1, 1 << 32))]
    max_keys: u64,

    /// Simulated time between sweeps that evict refilled buckets, as a production
    /// sweeper would.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    sweep_every: Duration,

    /// Reserve instead of rejecting: a request waits up to this long for its tokens (and
    /// later requests of its key wait behind it); the report adds delay percentiles.
    /// Buckets are then plain per-key buckets, never evicted nor swept (the keyed map
    /// has no reservations): a bucket idle longer than the policy's tick wrap period
    /// (years for ordinary policies) while short of full reads its idle time modulo it.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    max_wait: Option<Duration>,

    /// The measure the recommendation bounds: small-keys (requests from keys below the
    /// --volume-percentile key's volume), requests, tokens, or keys (ever rejected).
    #[arg(long, value_enum, default_value_t = Objective::SmallKeys)]
    objective: Objective,

    /// The largest share of the measure the recommended policy may reject (0.001 is
    /// 0.1%).
    #[arg(long, value_name = "SHARE", default_value = "0.001", value_parser = share)]
    max_rejected: f64,

    /// Keys below this percentile's volume are the small keys.
    #[arg(long, value_name = "PERCENTILE", default_value = "99",
          value_parser = |s: &str| positive_number(s, "the volume percentile", "", 100.0))]
    volume_percentile: f64,

    /// How many of the heaviest keys the report follows.
    #[arg(long, value_name = "N", default_value = "3",
          value_parser = |s: &str| whole_number(s, "the number of heavy keys", "", 0, 100))]
    top: u64,

    /// The largest share of lines that may be bad (unparsable, or out of order beyond
    /// the window) before the run fails.
    #[arg(long, value_name = "SHARE", default_value = "0.01", value_parser = share)]
    max_bad: f64,

    /// Requests replayed per chunk: memory is 16 bytes each.
    #[arg(long, value_name = "N", default_value = "262144",
          value_parser = |s: &str| whole_number(s, "the chunk size", "requests", 1, 1 << 26))]
    chunk: u64,

    /// The CSV file of every cell [default: tune.csv in the --out directory].
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,

    /// The SVG heatmap [default: tune.svg in the --out directory].
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,

    /// The directory the output files go to unless --csv or --svg names a path; it is
    /// created if missing.
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,

    /// No progress lines on standard error.
    #[arg(long, short = 'q')]
    quiet: bool,
}

fn share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "a share must be a number from 0 to 1 (0.001 is 0.1%), got {text}"
        )),
    }
}

fn window(text: &str) -> Result<u64, String> {
    let d = parse_duration(text)?;
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    if secs > MAX_WINDOW_SECS {
        return Err(format!("the reorder window must be at most 1h, got {text}"));
    }
    Ok(secs)
}

fn split_range(text: &str) -> Result<(&str, &str), String> {
    text.split_once("..")
        .ok_or_else(|| format!("expected a range LOW..HIGH, got `{text}`"))
}

fn capacity_range(text: &str) -> Result<(u64, u64), String> {
    let (lo, hi) = split_range(text)?;
    let lo = whole_number(lo, "the lowest capacity", "tokens", 1, u64::MAX)?;
    let hi = whole_number(hi, "the highest capacity", "tokens", lo, u64::MAX)?;
    Ok((lo, hi))
}

fn rate_range(text: &str) -> Result<(f64, f64), String> {
    let (lo, hi) = split_range(text)?;
    let lo = positive_number(lo, "the lowest rate", "tokens per second", 1e12)?;
    let hi = positive_number(hi, "the highest rate", "tokens per second", 1e12)?;
    if hi < lo {
        return Err(format!(
            "the highest rate must be at least the lowest, got `{text}`"
        ));
    }
    Ok((lo, hi))
}

/// `v` rounded to three significant digits, so a printed rate is exactly the cell's.
fn three_digits(v: f64) -> f64 {
    let s = format!("{v:.2e}");
    s.parse().unwrap_or(v)
}

/// The rates of the grid, lowest first.
fn grid_rates(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let mut v: Vec<f64> = grid::log_spaced(lo, hi, n)
        .into_iter()
        .map(three_digits)
        .collect();
    v.dedup();
    v
}

/// Runs `tokengate tune`.
///
/// # Errors
///
/// A message for bad options, unreadable logs, an empty log, too many bad lines, a grid
/// with no valid policy, classes that match nothing, output that cannot be written, or
/// no cell meeting the rule (after the files are written).
pub(crate) fn run(args: Args, out: &mut Out) -> Result<(), String> {
    let parser = LineParser::new(
        args.format,
        args.key.clone(),
        JsonFields {
            time: args.json_time.clone(),
            client: args.json_client.clone(),
            method: args.json_method.clone(),
            path: args.json_path.clone(),
            cost: args.json_cost.clone(),
        },
    )?;
    if args.format == Format::Csv && !args.classes.is_empty() {
        return Err("CSV logs give each request's cost: --class does not apply".into());
    }
    let max_keys = usize::try_from(args.max_keys).map_err(|_| {
        format!(
            "the maximum number of keys {} is too large here",
            args.max_keys
        )
    })?;
    let setup = Setup {
        max_keys,
        sweep_every: args.sweep_every,
        max_wait: args.max_wait,
    };
    let (capacity_lo, capacity_hi) = args.capacities.unwrap_or(DEFAULT_CAPACITIES);
    let (rate_lo, rate_hi) = args.rates.unwrap_or(DEFAULT_RATES);
    let mut capacities = grid::capacities(capacity_lo, capacity_hi, args.capacity_steps as usize);
    let mut rates = grid_rates(rate_lo, rate_hi, args.rate_steps as usize);
    let out_dir = args.out.clone();
    let csv_path = args.csv.clone().unwrap_or_else(|| out_dir.join("tune.csv"));
    let svg_path = args.svg.clone().unwrap_or_else(|| out_dir.join("tune.svg"));
    let csv_file = open_output(&csv_path)?;
    let svg_file = open_output(&svg_path)?;
    // Logs read from standard input are read once; files are read again when the grid
    // is widened.
    let rereadable = args.logs.iter().all(|p| p.as_os_str() != "-");
    let mut widened: Vec<String> = Vec::new();
    // Each edge is widened once, by at most two decades, and only toward cells the log
    // can judge (see `grid_edge`).
    let mut widened_edges: Vec<Edge> = Vec::new();
    let threads = rayon::current_num_threads();
    let (replayed, recommendation) = loop {
        let replayed = replay(&args, &parser, &setup, &capacities, &rates)?;
        let span = replayed.span_secs();
        let recommendation =
            report::recommend(&replayed.outcomes, args.objective, args.max_rejected, span);
        let chosen = recommendation.chosen();
        let Some(edge) =
            chosen.and_then(|i| grid_edge(&replayed.outcomes[i], &capacities, &rates, span))
        else {
            break (replayed, recommendation);
        };
        let chosen_by_user = match edge {
            Edge::LowestRate => args.rates.is_some(),
            Edge::HighestCapacity => args.capacities.is_some(),
        };
        if chosen_by_user || !rereadable || widened_edges.contains(&edge) {
            break (replayed, recommendation);
        }
        widened_edges.push(edge);
        let note = match edge {
            Edge::LowestRate => {
                let lo = rates[0];
                // No lower than the lowest rate the log can judge (at the smallest
                // capacity).
                let floor = capacities[0] as f64 / (span * report::MAX_FILL_SHARE);
                let wider = grid_rates(
                    (lo / 100.0).max(floor),
                    rates[rates.len() - 1],
                    rates.len() + steps_per_decade(&rates) * 2,
                );
                let note = format!(
                    "the recommended rate was the grid's lowest, {}/s: rates widened to {}..{} /s and replayed",
                    lo,
                    wider[0],
                    wider[wider.len() - 1]
                );
                rates = wider;
                note
            }
            Edge::HighestCapacity => {
                let hi = capacities[capacities.len() - 1];
                // A larger capacity helps only at a lower rate than the chosen one: no
                // larger than the largest the log can judge at the next lower rate.
                let ceiling = lower_rate(&replayed.outcomes[chosen.unwrap_or(0)], &rates)
                    .map_or(hi, |r| (r * span * report::MAX_FILL_SHARE).floor() as u64);
                let wider = grid::capacities(
                    capacities[0],
                    hi.saturating_mul(100).min(ceiling).max(hi),
                    capacities.len() + 2 * capacity_steps_per_decade(&capacities),
                );
                let note = format!(
                    "the recommended capacity was the grid's highest, {hi}: capacities widened to {}..{} and replayed",
                    wider[0],
                    wider[wider.len() - 1]
                );
                capacities = wider;
                note
            }
        };
        if !args.quiet {
            eprintln!("tune: {note}");
        }
        widened.push(note);
    };
    let span = replayed.span_secs();
    let chosen = recommendation.chosen();
    let Replayed {
        outcomes,
        total_cells,
        scan,
        keys,
        classes,
        origin,
        reordered,
        most_late,
        elapsed,
        read_time,
    } = replayed;
    let edge_left = chosen.and_then(|i| grid_edge(&outcomes[i], &capacities, &rates, span));

    let pop = Population::new(&keys.requests, args.volume_percentile, args.top as usize);

    write_output(
        csv_file,
        &csv_path,
        &report::csv(&outcomes, &pop, args.max_wait, span),
    )?;
    let svg = report::heatmap(
        &outcomes,
        &capacities,
        &rates,
        args.objective,
        args.volume_percentile,
        chosen,
        span,
    )?;
    write_output(svg_file, &svg_path, &svg)?;

    let mut text = String::new();
    summary(&mut text, &args, &scan, &keys, &pop, &classes, origin);
    if reordered > 0 {
        text.push_str(&format!(
            "reordered: {reordered} lines ({}) were up to {most_late} s earlier than a line before them \
             (a server logs a request's start when it ends), replayed in time order \
             (--reorder-window {} s)\n",
            pct(reordered as f64 / scan.lines as f64),
            args.reorder_window
        ));
    }
    for note in &widened {
        text.push_str(&format!("grid: {note}\n"));
    }
    text.push_str(&format!(
        "grid: {} capacities ({}..{}) x {} rates ({}..{} /s) = {} cells, {} invalid\n",
        capacities.len(),
        capacities[0],
        capacities[capacities.len() - 1],
        rates.len(),
        show_number(rates[0]),
        show_number(rates[rates.len() - 1]),
        outcomes.len(),
        outcomes.len() - total_cells,
    ));
    text.push_str(&format!(
        "time: {} lines and {} cells in {} on {} threads ({} cells/s); reading and parsing took {} of it ({} lines/s)\n\n",
        scan.lines,
        total_cells,
        show_duration(elapsed),
        threads,
        show_number(total_cells as f64 / elapsed.as_secs_f64().max(1e-9)),
        show_duration(read_time),
        show_number((scan.lines as f64 / read_time.as_secs_f64().max(1e-9)).round()),
    ));
    let rule = format!(
        "{} <= {}",
        args.objective.describe(args.volume_percentile),
        pct(args.max_rejected)
    );
    text.push_str(&format!(
        "per rate, the smallest capacity with {rule} (shares rejected):\n"
    ));
    text.push_str(&report::table(
        &outcomes,
        args.objective,
        args.max_rejected,
        chosen,
        span,
    ));
    text.push('\n');
    let recommended = chosen.and_then(|i| {
        let c = &outcomes[i];
        c.result.as_ref().ok().map(|(s, m)| (c, s, m))
    });
    match edge_left {
        Some(Edge::LowestRate) => {
            text.push_str(&format!(
                "warning: the recommended rate is the grid's lowest ({}/s): a lower rate may meet \
                 the rule too; widen --rates{}\n",
                show_number(rates[0]),
                if rereadable {
                    ""
                } else {
                    " (a log read from standard input is read once)"
                },
            ));
        }
        Some(Edge::HighestCapacity) => text.push_str(&format!(
            "warning: the recommended capacity is the grid's highest ({}): a larger one may meet \
             the rule at a lower rate; widen --capacities{}\n",
            capacities[capacities.len() - 1],
            if rereadable {
                ""
            } else {
                " (a log read from standard input is read once)"
            }
        )),
        None => {}
    }
    if let Some((c, s, m)) = recommended {
        text.push_str(&format!(
            "recommended: B = {} tokens, r = {} tokens/s: the smallest rate, then the smallest capacity, with {rule}\n",
            c.capacity, c.rate
        ));
        text.push_str(&format!(
            "  fills in {} (B / r), within half the log's {}: cells that fill more slowly are not judged\n",
            show_fill(c.capacity as f64 / c.rate),
            show_fill(span)
        ));
        text.push_str(&format!(
            "  evidence: {} of requests rejected ({} of {}), {} of tokens, {} of keys ever rejected, {} of small-key requests\n",
            pct(m.requests), s.rejected, s.requests, pct(m.tokens), pct(m.keys), pct(m.small_keys)
        ));
        for (k, h) in pop.heavy.iter().zip(&m.heavy) {
            text.push_str(&format!(
                "  heavy key {} ({} requests): {} rejected\n",
                keys.names[*k as usize],
                keys.requests[*k as usize],
                pct(*h)
            ));
        }
        if let Some(w) = args.max_wait {
            let q = |q| grid::delay_quantile(s, q, w).map_or("-".into(), show_duration);
            text.push_str(&format!(
                "  delays (max wait {}): {} requests waited; p50 {}, p90 {}, p99 {}, max {} (percentiles rounded up by at most {})\n",
                show_duration(w), s.delayed, q(0.5), q(0.9), q(0.99), show_duration(s.max_delay),
                show_duration(w / grid::DELAY_BINS as u32)
            ));
        }
        let toml = recommendation_toml(c.capacity, c.rate, &args)?;
        text.push_str("\nas a tokengate-config rule (tokengate.toml; check it with `tokengate check-config`):\n\n");
        text.push_str(&toml);
    }
    text.push_str(&format!(
        "\nwrote {} and {}\n",
        csv_path.display(),
        svg_path.display()
    ));
    let mut nearest = String::new();
    if let Recommendation::NoneMeets { closest, unjudged } = recommendation {
        if let Some(c) = closest.map(|i| &outcomes[i]) {
            if let Ok((_, m)) = &c.result {
                nearest.push_str(&format!(
                    "; the nearest cell the log can judge is B = {}, r = {}/s, with {} rejected",
                    c.capacity,
                    show_number(c.rate),
                    pct(m.get(args.objective))
                ));
            }
        }
        if let Some(c) = unjudged.map(|i| &outcomes[i]) {
            nearest.push_str(&format!(
                "; B = {}, r = {}/s meets it but fills in {}, more than half the log's {}: a \
                 longer log can judge it",
                c.capacity,
                show_number(c.rate),
                show_fill(c.capacity as f64 / c.rate),
                show_fill(span)
            ));
        }
        text.push_str(&format!(
            "no recommendation: no cell the log can judge has {rule}{nearest}\n"
        ));
    }
    out.print(&text)?;
    if recommended.is_none() {
        return Err(format!(
            "no cell of the grid has {rule} among those the log can judge (fill time B / r at \
             most half the log's span){nearest}: raise the top of --rates or --capacities, or give \
             a longer log"
        ));
    }
    Ok(())
}

/// A fill time or span in seconds, for the report.
fn show_fill(secs: f64) -> String {
    show_duration(Duration::from_secs_f64(secs.clamp(0.0, 1e12)))
}

/// An edge of the grid beyond which a better cell may lie under the recommendation
/// rule (the smallest rate, then the smallest capacity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// The grid's lowest rate meets the rule: a lower one may too.
    LowestRate,
    /// The chosen cell has the grid's highest capacity: a larger capacity may meet the
    /// rule at a lower rate.
    HighestCapacity,
}

/// The edge of the grid `chosen` sits on, if one matters: only when beyond it lie cells
/// the log can judge (fill time at most [`report::MAX_FILL_SHARE`] of `span`, in
/// seconds), since no other cell can be recommended. Below the lowest rate, the smallest
/// capacity must be judgeable at some lower rate; beyond the highest capacity, a larger
/// capacity must be judgeable at the grid's next lower rate than the chosen one.
fn grid_edge(chosen: &Outcome, capacities: &[u64], rates: &[f64], span: f64) -> Option<Edge> {
    let most = span * report::MAX_FILL_SHARE;
    let top = capacities[capacities.len() - 1];
    if rates.len() > 1 && chosen.rate <= rates[0] {
        // The lowest rate at which the smallest capacity is judgeable.
        (capacities[0] as f64 / most < rates[0]).then_some(Edge::LowestRate)
    } else if capacities.len() > 1 && chosen.capacity >= top {
        let lower = lower_rate(chosen, rates)?;
        ((top + 1) as f64 / lower <= most).then_some(Edge::HighestCapacity)
    } else {
        None
    }
}

/// The grid's largest rate below `chosen`'s.
fn lower_rate(chosen: &Outcome, rates: &[f64]) -> Option<f64> {
    rates.iter().rev().copied().find(|&r| r < chosen.rate)
}

/// Grid steps per decade of `rates` (at least 1), so a widened axis is as dense.
fn steps_per_decade(rates: &[f64]) -> usize {
    let decades = (rates[rates.len() - 1] / rates[0]).log10();
    if decades <= 0.0 {
        return 1;
    }
    ((rates.len() - 1) as f64 / decades).ceil().max(1.0) as usize
}

fn capacity_steps_per_decade(capacities: &[u64]) -> usize {
    let v: Vec<f64> = capacities.iter().map(|&c| c as f64).collect();
    steps_per_decade(&v)
}

/// What one replay of the logs over a grid found.
struct Replayed {
    /// Every cell, valid or not, by rate then capacity.
    outcomes: Vec<Outcome>,
    /// The valid cells.
    total_cells: usize,
    scan: Scan,
    keys: Keys,
    classes: Classes,
    origin: u64,
    reordered: u64,
    most_late: u64,
    elapsed: Duration,
    read_time: Duration,
}

impl Replayed {
    /// The log's span, from its first request to its last, in seconds.
    fn span_secs(&self) -> f64 {
        self.scan.span.map_or(0, |(a, b)| b - a) as f64 / 1e9
    }
}

/// Reads the logs once and replays them on every cell of the grid.
fn replay(
    args: &Args,
    parser: &LineParser,
    setup: &Setup,
    capacities: &[u64],
    rates: &[f64],
) -> Result<Replayed, String> {
    let mut cells = Vec::new();
    let mut invalid: Vec<(u64, f64, String)> = Vec::new();
    for &rate in rates {
        for &capacity in capacities {
            match Cell::new(capacity, rate, setup) {
                Ok(c) => cells.push(c),
                Err(e) => invalid.push((capacity, rate, e)),
            }
        }
    }
    if cells.is_empty() {
        let (b, r, e) = &invalid[0];
        return Err(format!(
            "no policy of the grid is valid ({} cells; B = {b}, r = {}: {e}): change \
             --capacities or --rates",
            invalid.len(),
            show_number(*r)
        ));
    }
    let total_cells = cells.len();
    let mut reading = Reading::new(
        parser,
        Classes::new(args.classes.clone(), args.default_cost),
        Orderer::new(args.reorder_window, args.spread, args.seed),
        args.chunk as usize,
        args.logs.clone(),
        !args.quiet,
    );
    let started = Instant::now();
    let mut read_time = Duration::ZERO;
    let timed = |reading: &mut Reading<'_>, read_time: &mut Duration| {
        let t = Instant::now();
        let chunk = reading.next_chunk();
        *read_time += t.elapsed();
        chunk
    };
    // Reading the next chunk overlaps the replay of this one: the reading task takes one
    // of rayon's threads, the cells the others, and it joins the cells when done.
    let mut chunk = timed(&mut reading, &mut read_time)?;
    while !chunk.is_empty() {
        let (next, ()) = rayon::join(
            || timed(&mut reading, &mut read_time),
            || cells.par_iter_mut().for_each(|c| c.replay(&chunk)),
        );
        if !args.quiet {
            eprintln!(
                "tune: {}, {} requests; {} cells replayed through {} of log time",
                reading.progress(),
                reading.scan.requests,
                total_cells,
                show_duration(Duration::from_nanos(chunk[chunk.len() - 1].at)),
            );
        }
        chunk = next?;
    }
    let elapsed = started.elapsed();
    let Reading {
        classes,
        keys,
        scan,
        orderer,
        ..
    } = reading;

    if scan.requests == 0 {
        return Err(format!(
            "the log has no requests: {} lines, {} bad{}",
            scan.lines,
            scan.bad,
            bad_lines_suffix(&scan)
        ));
    }
    let bad_share = scan.bad as f64 / scan.lines as f64;
    if bad_share > args.max_bad {
        let late = if scan.late > 0 {
            format!(
                " ({} of them out of order by more than --reorder-window, {} s)",
                scan.late, args.reorder_window
            )
        } else {
            String::new()
        };
        return Err(format!(
            "{} of {} lines are bad ({}){late}, more than --max-bad {}{}",
            scan.bad,
            scan.lines,
            pct(bad_share),
            pct(args.max_bad),
            bad_lines_suffix(&scan)
        ));
    }
    classes.check_matched()?;

    let pop = Population::new(&keys.requests, args.volume_percentile, args.top as usize);
    let mut outcomes: Vec<Outcome> = cells
        .into_iter()
        .map(|c| {
            let m = Measures::of(&c.stats, &pop);
            Outcome {
                capacity: c.capacity,
                rate: c.rate,
                result: Ok((c.stats, m)),
            }
        })
        .collect();
    outcomes.extend(invalid.into_iter().map(|(capacity, rate, e)| Outcome {
        capacity,
        rate,
        result: Err(e),
    }));
    outcomes.sort_by(|a, b| {
        (a.rate, a.capacity)
            .partial_cmp(&(b.rate, b.capacity))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(Replayed {
        outcomes,
        total_cells,
        scan,
        keys,
        classes,
        origin: orderer.origin_nanos(),
        reordered: orderer.reordered,
        most_late: orderer.most_late,
        elapsed,
        read_time,
    })
}

fn pct(v: f64) -> String {
    format!("{}%", show_number(v * 100.0))
}

fn bad_lines_suffix(scan: &Scan) -> String {
    if scan.bad_shown.is_empty() {
        String::new()
    } else {
        format!("; first bad lines:\n  {}", scan.bad_shown.join("\n  "))
    }
}

fn summary(
    text: &mut String,
    args: &Args,
    scan: &Scan,
    keys: &Keys,
    pop: &Population,
    classes: &Classes,
    origin: u64,
) {
    let (first, last) = scan.span.unwrap_or((origin, origin));
    text.push_str(&format!(
        "tokengate tune: {} requests ({} tokens) from {} keys over {} of log time; {} lines, {} bad\n",
        scan.requests,
        scan.tokens,
        keys.len(),
        show_duration(Duration::from_nanos(last - first).max(Duration::from_micros(1))),
        scan.lines,
        scan.bad,
    ));
    for shown in &scan.bad_shown {
        text.push_str(&format!("  bad line {shown}\n"));
    }
    for (class, n) in classes.list.iter().zip(&classes.matched) {
        text.push_str(&format!("  class {}: {n} requests\n", class.spec));
    }
    if pop.all_count {
        text.push_str(&format!(
            "keys: no key below the p{} key's volume ({} requests): the small-key measure counts every request\n",
            show_number(args.volume_percentile),
            pop.threshold
        ));
    } else {
        text.push_str(&format!(
            "keys: {} small keys (below the p{} key's volume, {} requests) sent {} requests\n",
            pop.small_keys,
            show_number(args.volume_percentile),
            pop.threshold,
            pop.small_requests
        ));
    }
}

/// The scope kind a rule keyed like `key` is for, as the tower layer keys requests: the
/// client address a `client`, a named field a `user`, the path a `route`.
fn scope_of(key: &KeyChoice) -> ScopeKind {
    match key {
        KeyChoice::Constant => ScopeKind::Global,
        KeyChoice::FirstSegment => ScopeKind::Route,
        KeyChoice::Client => ScopeKind::Client,
        KeyChoice::Field(_) => ScopeKind::User,
    }
}

/// The recommended policy as a rule of tokengate-config's file, checked by parsing it
/// back (and building it when it has no reservations, which the keyed map has not).
fn recommendation_toml(capacity: u64, rate: f64, args: &Args) -> Result<String, String> {
    let kind = scope_of(&args.key);
    let mut policy = format!("{{ capacity = {capacity}, refill_per_second = {rate:?}");
    if let Some(w) = args.max_wait {
        policy.push_str(&format!(
            ", max_reservation = \"{}\"",
            tokengate::serde_policy::format_duration(w)
        ));
    }
    policy.push_str(" }");
    let mut rule = format!(
        "[[rule]]\nname = \"tuned\"\nscope = \"{}\"\npolicies = [{policy}]\n",
        kind.name()
    );
    if kind != ScopeKind::Global {
        rule.push_str(&format!("max_keys = {}\n", args.max_keys));
    }
    let config = Config::from_toml(&rule)
        .map_err(|e| format!("the recommendation does not make a valid configuration: {e}"))?;
    if args.max_wait.is_none() {
        config
            .rule_set()
            .map_err(|e| e.to_string())?
            .build_with_clock(ManualClock::new())
            .map_err(|e| format!("the recommendation does not build: {e}"))?;
    }
    Ok(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_round_to_three_digits_and_ranges_parse() {
        assert_eq!(grid_rates(0.1, 1000.0, 5), [0.1, 1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(three_digits(2.6366508987303583), 2.64);
        assert_eq!(capacity_range("1..1000"), Ok((1, 1000)));
        assert!(capacity_range("10..1").unwrap_err().contains("at least 10"));
        assert!(capacity_range("0..1").unwrap_err().contains("at least 1"));
        assert!(capacity_range("5").unwrap_err().contains("LOW..HIGH"));
        assert_eq!(rate_range("0.5..2"), Ok((0.5, 2.0)));
        assert!(rate_range("2..1").is_err());
        assert!(rate_range("0..1").is_err());
        assert_eq!(window("1500ms"), Ok(2));
        assert!(window("2h").is_err());
        assert_eq!(share("0.001"), Ok(0.001));
        assert!(share("2").is_err());
        assert!(share("nan").is_err());
    }
}
