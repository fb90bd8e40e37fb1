//! `tokengate simulate`: replays a traffic pattern against a policy on the manual clock.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use plotters::prelude::*;
use tokengate::{AcquireError, Bucket, ManualClock, Policy, Start};

use crate::{
    Out, open_output, parse_duration, positive_number, show_duration, show_number, whole_number,
    write_output,
};

/// The most arrivals one simulation replays (`--rate` x `--duration`).
const MAX_ARRIVALS: f64 = 50e6;

/// The highest offered rate: one request per nanosecond, the simulated clock's step.
const MAX_RATE: f64 = 1e9;

/// The longest simulated time (and burst period).
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The largest weight of a work class.
const MAX_WEIGHT: u64 = 1_000_000;

/// Below this many arrivals a run says nothing about B and r.
const MIN_ARRIVALS_FOR_ADVICE: u64 = 10;

/// `--duty` when not given.
const DEFAULT_DUTY: f64 = 0.25;

/// `--burst-period` when not given.
const DEFAULT_BURST_PERIOD: Duration = Duration::from_secs(1);

/// Time bins of the chart.
const BINS: usize = 200;

/// Options of `tokengate simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How requests arrive. steady: evenly spaced at --rate. poisson: independent
    /// arrivals at an average of --rate (exponential gaps). bursty: the same average, but
    /// each --burst-period's requests all arrive in its first --duty fraction.
    #[arg(long, short = 'p', value_enum, default_value_t = Pattern::Steady)]
    pattern: Pattern,

    /// Offered load, in requests per second (averaged over the run): above 0, at most
    /// 1e9 (one request per nanosecond, the simulated clock's step).
    #[arg(long, value_name = "REQ_PER_S", default_value = "25",
          allow_negative_numbers = true, value_parser = rate)]
    rate: f64,

    /// Simulated time to replay, with a unit (ns, us, ms, s, m, h), at most 24h. The
    /// simulation runs faster than real time: no sleeping.
    #[arg(long, short = 'd', value_name = "DURATION", default_value = "20s",
          allow_hyphen_values = true, value_parser = simulated_duration)]
    duration: Duration,

    /// Weighted mix of work classes, comma-separated NAME=COST:WEIGHT: COST in tokens
    /// per request (1 or more, at most --capacity), WEIGHT the relative share of
    /// requests (1 to 1000000). Example: metadata=1:70,search=3:25,export=20:5.
    #[arg(long, short = 'm', value_name = "MIX", default_value = "request=1:1",
          value_parser = parse_mix)]
    mix: Mix,

    /// Bucket capacity B, in whole tokens (at least 1): the largest burst.
    #[arg(long, short = 'b', value_name = "TOKENS", default_value = "60",
          allow_negative_numbers = true, value_parser = capacity)]
    capacity: u64,

    /// Refill rate r, in tokens per second (above 0): the sustained rate.
    #[arg(long, short = 'r', value_name = "TOKENS_PER_S", default_value = "10",
          allow_negative_numbers = true, value_parser = refill)]
    refill: f64,

    /// Whether the bucket starts full (an immediate burst of B) or empty.
    #[arg(long, value_enum, default_value_t = StartArg::Full)]
    start: StartArg,

    /// Seed of the random choices (Poisson gaps, work classes): the same seed replays
    /// the same traffic.
    #[arg(long, default_value = "1", allow_negative_numbers = true, value_parser = seed)]
    seed: u64,

    /// With --pattern bursty only: the period of the bursts, with a unit, at most 24h.
    /// Default: 1s.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true,
          value_parser = simulated_duration)]
    burst_period: Option<Duration>,

    /// With --pattern bursty only: the fraction of each period in which its requests
    /// arrive (0 < duty <= 1; 0.25 = four times the average rate for a quarter of the
    /// time). Default: 0.25.
    #[arg(long, value_name = "FRACTION", allow_negative_numbers = true, value_parser = duty)]
    duty: Option<f64>,

    /// SVG chart of the bucket level and the admitted rate over time. Default:
    /// simulate.svg in the --out directory.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,

    /// The directory the output files go to unless --csv or --svg names a path; it is
    /// created if missing.
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,
}

impl Args {
    /// `--duty`, or its default.
    fn duty(&self) -> f64 {
        self.duty.unwrap_or(DEFAULT_DUTY)
    }

    /// `--burst-period`, or its default.
    fn burst_period(&self) -> Duration {
        self.burst_period.unwrap_or(DEFAULT_BURST_PERIOD)
    }
}

/// How requests arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// Evenly spaced at the offered rate.
    Steady,
    /// On/off: each period's requests arrive in its first `duty` fraction.
    Bursty,
    /// Independent arrivals: exponential gaps with mean 1 / rate.
    Poisson,
}

impl Pattern {
    /// The command-line value.
    fn name(self) -> &'static str {
        match self {
            Pattern::Steady => "steady",
            Pattern::Bursty => "bursty",
            Pattern::Poisson => "poisson",
        }
    }
}

/// `--start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StartArg {
    /// An immediate burst of B tokens.
    Full,
    /// Nothing until tokens refill.
    Empty,
}

/// One work class of the mix.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    name: String,
    cost: u64,
    weight: u64,
}

/// The weighted mix of work classes.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix(Vec<Class>);

fn rate(text: &str) -> Result<f64, String> {
    positive_number(text, "the offered rate", "requests per second", MAX_RATE)
}

fn refill(text: &str) -> Result<f64, String> {
    positive_number(text, "the refill rate", "tokens per second", f64::MAX)
}

fn capacity(text: &str) -> Result<u64, String> {
    whole_number(text, "the capacity", "tokens", 1, u64::MAX)
}

fn seed(text: &str) -> Result<u64, String> {
    whole_number(text, "the seed", "", 0, u64::MAX)
}

fn duty(text: &str) -> Result<f64, String> {
    positive_number(
        text,
        "the duty (the share of each burst period with arrivals)",
        "",
        1.0,
    )
}

fn simulated_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > MAX_DURATION {
        return Err(format!(
            "a simulated time must be at most {}, got {text}",
            show_duration(MAX_DURATION)
        ));
    }
    Ok(d)
}

fn parse_mix(text: &str) -> Result<Mix, String> {
    if text.trim().is_empty() {
        return Err("the mix names no class: write e.g. request=1:1".to_string());
    }
    let usage = "write each class as NAME=COST:WEIGHT, e.g. search=3:25";
    let mut classes = Vec::new();
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!(
                "the mix `{text}` has an empty class (a stray comma?): {usage}"
            ));
        }
        let (name, rest) = part
            .split_once('=')
            .ok_or_else(|| format!("class `{part}` has no `=`: {usage}"))?;
        let (cost, weight) = rest
            .split_once(':')
            .ok_or_else(|| format!("class `{part}` has no `:WEIGHT`: {usage}"))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("class `{part}` has an empty name: {usage}"));
        }
        let cost = whole_number(
            cost,
            &format!("the cost of class {name}"),
            "tokens",
            1,
            u64::MAX,
        )?;
        let weight = whole_number(
            weight,
            &format!("the weight of class {name}"),
            "",
            1,
            MAX_WEIGHT,
        )?;
        if classes.iter().any(|c: &Class| c.name == name) {
            return Err(format!("class {name} is named twice"));
        }
        classes.push(Class {
            name: name.to_string(),
            cost,
            weight,
        });
    }
    Ok(Mix(classes))
}

impl Mix {
    fn total_weight(&self) -> u64 {
        self.0.iter().map(|c| c.weight).sum()
    }

    /// Mean cost per request, in tokens.
    fn mean_cost(&self) -> f64 {
        let w: f64 = self.0.iter().map(|c| c.cost as f64 * c.weight as f64).sum();
        w / self.total_weight() as f64
    }

    /// The class for a uniform draw in `0..total_weight`.
    fn pick(&self, mut draw: u64) -> usize {
        for (i, c) in self.0.iter().enumerate() {
            if draw < c.weight {
                return i;
            }
            draw -= c.weight;
        }
        self.0.len() - 1
    }
}

/// splitmix64: small, seedable, good enough for traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

#[derive(Clone, Debug, Default)]
struct ClassStats {
    admitted: u64,
    rejected: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Bin {
    offered_tokens: u128,
    admitted_tokens: u128,
    /// Bucket level at the bin's start, in tokens.
    level: f64,
    /// The lowest and highest level seen in the bin: at its start, and just before and
    /// after each decision in it. A chart of a long run plots this range, not one sample
    /// a bin, so fills and drains shorter than a bin are not lost between samples.
    low: f64,
    high: f64,
}

impl Bin {
    fn saw(&mut self, level: f64) {
        self.low = self.low.min(level);
        self.high = self.high.max(level);
    }
}

/// What a simulation produced.
#[derive(Debug)]
struct Outcome {
    per_class: Vec<ClassStats>,
    bins: Vec<Bin>,
    /// Time of the first rejection.
    first_rejection: Option<Duration>,
    /// Tokens admitted from the first rejection to the end.
    tokens_after_dry: u128,
    requests_after_dry: u64,
}

/// Arrival times in nanoseconds, in order.
fn arrivals(args: &Args, rng: &mut Rng) -> impl Iterator<Item = u64> {
    let end = args.duration.as_nanos() as f64;
    let gap = 1e9 / args.rate;
    let period = args.burst_period().as_nanos() as f64;
    let (pattern, duty) = (args.pattern, args.duty());
    let mut k = 0u64;
    let mut t = 0.0f64;
    let mut seed = Rng(rng.next());
    std::iter::from_fn(move || {
        let at = match pattern {
            Pattern::Steady => k as f64 * gap,
            Pattern::Poisson => {
                t += -seed.unit().ln() * gap;
                t
            }
            Pattern::Bursty => {
                // Steady arrivals in virtual time, each period squeezed into its first
                // `duty` fraction.
                let v = k as f64 * gap;
                let p = (v / period).floor();
                p * period + (v - p * period) * duty
            }
        };
        k += 1;
        (at < end).then_some(at as u64)
    })
}

fn simulate(args: &Args, policy: Policy) -> Result<Outcome, String> {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(policy, clock.clone());
    let mut rng = Rng(args.seed);
    let total_weight = args.mix.total_weight();
    let end = args.duration.as_nanos() as u64;
    let width = (end / BINS as u64).max(1);
    let mut bins = vec![Bin::default(); BINS];
    let mut next_edge = 0u64;
    let mut edge_index = 0usize;
    let mut out = Outcome {
        per_class: vec![ClassStats::default(); args.mix.0.len()],
        bins: Vec::new(),
        first_rejection: None,
        tokens_after_dry: 0,
        requests_after_dry: 0,
    };
    let mut sample_until = |at: u64, bins: &mut Vec<Bin>| {
        while edge_index < BINS && next_edge <= at {
            clock.set(Duration::from_nanos(next_edge));
            let level = bucket.available();
            let bin = &mut bins[edge_index];
            bin.level = level;
            bin.low = level;
            bin.high = level;
            edge_index += 1;
            next_edge = edge_index as u64 * width;
        }
    };
    let times: Vec<u64> = arrivals(args, &mut rng).collect();
    for at in times {
        sample_until(at, &mut bins);
        clock.set(Duration::from_nanos(at));
        let class = args.mix.pick(rng.below(total_weight));
        let cost = args.mix.0[class].cost;
        let before = bucket.available();
        let decision = bucket.try_acquire(cost).map_err(|e| e.to_string())?;
        let bin = &mut bins[((at / width) as usize).min(BINS - 1)];
        bin.saw(before);
        bin.saw(bucket.available());
        bin.offered_tokens += u128::from(cost);
        let stats = &mut out.per_class[class];
        if decision.is_admitted() {
            stats.admitted += 1;
            bin.admitted_tokens += u128::from(cost);
            if out.first_rejection.is_some() {
                out.tokens_after_dry += u128::from(cost);
                out.requests_after_dry += 1;
            }
        } else {
            stats.rejected += 1;
            out.first_rejection.get_or_insert(Duration::from_nanos(at));
        }
    }
    sample_until(end, &mut bins);
    out.bins = bins;
    Ok(out)
}

/// Checks what the parser cannot see alone, before any work: the options that go
/// together, each class's cost against the capacity, the size of the run; and builds
/// the policy.
fn validate(args: &Args) -> Result<Policy, String> {
    if args.pattern != Pattern::Bursty {
        for (given, option) in [
            (args.duty.is_some(), "--duty"),
            (args.burst_period.is_some(), "--burst-period"),
        ] {
            if given {
                return Err(format!(
                    "{option} shapes --pattern bursty only, and the pattern is {}; \
                     add --pattern bursty or leave {option} out",
                    args.pattern.name()
                ));
            }
        }
    }
    let start = match args.start {
        StartArg::Full => Start::Full,
        StartArg::Empty => Start::Empty,
    };
    let policy = Policy::builder(args.capacity, args.refill)
        .start(start)
        .build()
        .map_err(|e| format!("invalid policy: {e}"))?;
    for class in &args.mix.0 {
        if class.cost > args.capacity {
            let e = AcquireError::CostExceedsCapacity {
                cost: class.cost,
                capacity: args.capacity,
            };
            return Err(format!(
                "class {}: {e}; raise --capacity or lower its cost",
                class.name
            ));
        }
    }
    let arrivals = args.rate * args.duration.as_secs_f64();
    if arrivals > MAX_ARRIVALS {
        return Err(format!(
            "--rate x --duration is {} requests, above the {} one run replays; \
             shorten --duration or lower --rate",
            show_number(arrivals.round()),
            show_number(MAX_ARRIVALS)
        ));
    }
    Ok(policy)
}

/// Runs the simulation and prints the report.
pub fn run(args: Args, out: &mut Out<impl Write>) -> Result<(), String> {
    let policy = validate(&args)?;
    let svg_path = args
        .svg
        .clone()
        .unwrap_or_else(|| args.out.join("simulate.svg"));
    let svg_file = open_output(&svg_path)?;

    let outcome = simulate(&args, policy)?;
    out.print(&report(&args, &policy, &outcome))?;
    let chart = draw(&args, &policy, &outcome)?;
    write_output(svg_file, &svg_path, &chart)?;
    out.print(&format!("\nWrote {}.\n", svg_path.display()))
}

/// A `--duration` long enough for 100 arrivals and twice `absorb` seconds (the time a
/// full bucket hides an excess), in whole seconds, if one run can replay it.
fn longer_run(args: &Args, absorb: f64) -> Option<String> {
    let secs = (2.0 * absorb).max(100.0 / args.rate).max(1.0).ceil();
    (secs <= MAX_DURATION.as_secs_f64() && secs * args.rate <= MAX_ARRIVALS)
        .then(|| format!("{secs}s"))
}

fn pattern_text(args: &Args) -> String {
    match args.pattern {
        Pattern::Steady => format!("steady {} req/s", show_number(args.rate)),
        Pattern::Poisson => format!("Poisson, mean {} req/s", show_number(args.rate)),
        Pattern::Bursty => format!(
            "bursty, mean {} req/s ({} req/s for the first {:.0}% of every {})",
            show_number(args.rate),
            show_number(args.rate / args.duty()),
            args.duty() * 100.0,
            show_duration(args.burst_period())
        ),
    }
}

fn report(args: &Args, policy: &Policy, out: &Outcome) -> String {
    let mut s = String::new();
    let r = args.refill;
    let offered_tokens = args.rate * args.mix.mean_cost();
    let _ = writeln!(
        s,
        "tokengate simulate: B = {} tokens, r = {} tokens/s, starting {}; {} for {} (seed {})",
        args.capacity,
        show_number(args.refill),
        if policy.starts_full() {
            "full"
        } else {
            "empty"
        },
        pattern_text(args),
        show_duration(args.duration),
        args.seed
    );
    let _ = writeln!(
        s,
        "offered load: {} tokens/s on average ({} req/s x mean cost {})\n",
        show_number(offered_tokens),
        show_number(args.rate),
        show_number(args.mix.mean_cost())
    );
    let _ = writeln!(
        s,
        "  {:<14}{:>6}{:>11}{:>11}{:>10}",
        "class", "cost", "admitted", "rejected", "rejected"
    );
    let (mut admitted, mut rejected, mut tokens) = (0u64, 0u64, 0u128);
    let mut tokens_rejected = 0u128;
    for (class, stats) in args.mix.0.iter().zip(&out.per_class) {
        let n = stats.admitted + stats.rejected;
        let _ = writeln!(
            s,
            "  {:<14}{:>6}{:>11}{:>11}{:>9.1}%",
            class.name,
            class.cost,
            stats.admitted,
            stats.rejected,
            100.0 * stats.rejected as f64 / n.max(1) as f64
        );
        admitted += stats.admitted;
        rejected += stats.rejected;
        tokens += u128::from(stats.admitted) * u128::from(class.cost);
        tokens_rejected += u128::from(stats.rejected) * u128::from(class.cost);
    }
    let _ = writeln!(
        s,
        "  {:<14}{:>6}{:>11}{:>11}{:>9.1}%\n",
        "all",
        "",
        admitted,
        rejected,
        100.0 * rejected as f64 / (admitted + rejected).max(1) as f64
    );
    // The share of requests (the table) and the share of tokens (what the rate bounds)
    // differ when costs differ: a request is refused whole, so a cheap one may pass where
    // an expensive one is refused.
    let request_share = 100.0 * rejected as f64 / (admitted + rejected).max(1) as f64;
    let token_share = 100.0 * tokens_rejected as f64 / (tokens + tokens_rejected).max(1) as f64;
    let this_run = if args.mix.0.iter().all(|c| c.cost == args.mix.0[0].cost) {
        format!("this run rejected {request_share:.1}% of the requests")
    } else {
        format!(
            "this run rejected {request_share:.1}% of the requests and {token_share:.1}% of \
             the tokens they asked for"
        )
    };
    let secs = args.duration.as_secs_f64();
    let _ = writeln!(
        s,
        "admitted overall: {} tokens/s, {} req/s",
        show_number(tokens as f64 / secs),
        show_number(admitted as f64 / secs)
    );
    match out.first_rejection {
        Some(dry) => {
            let window = secs - dry.as_secs_f64();
            if window > 0.0 {
                let _ = writeln!(
                    s,
                    "sustained after the initial burst (from {:.2} s, the first rejection): {} tokens/s, {} req/s; r = {} (effective {})",
                    dry.as_secs_f64(),
                    show_number(out.tokens_after_dry as f64 / window),
                    show_number(out.requests_after_dry as f64 / window),
                    show_number(r),
                    show_number(policy.effective_refill_per_second())
                );
            }
        }
        None => {
            let _ = writeln!(
                s,
                "no request was rejected in the {} simulated",
                show_duration(args.duration)
            );
        }
    }
    // What the numbers say about B and r, from what this run saw.
    let arrived = admitted + rejected;
    let excess = offered_tokens - r;
    // How long a full bucket hides an excess of offered tokens over r.
    let absorb = if excess > 0.0 && policy.starts_full() {
        args.capacity as f64 / excess
    } else {
        0.0
    };
    if arrived < MIN_ARRIVALS_FOR_ADVICE {
        let _ = writeln!(
            s,
            "\nOnly {arrived} request(s) arrived in {}: too few to say anything about B and r. \
             Simulate a longer --duration{}.",
            show_duration(args.duration),
            longer_run(args, absorb).map_or(String::new(), |d| format!(" (e.g. {d})"))
        );
        return s;
    }
    if excess > 0.0 {
        let share = 100.0 * excess / offered_tokens;
        if out.first_rejection.is_none() {
            let why = if policy.starts_full() {
                format!(
                    "a full bucket absorbs the excess for B / (offered - r) = {} s, longer \
                     than this run",
                    show_number(absorb)
                )
            } else {
                "this run is too short for the excess to show".to_string()
            };
            let _ = writeln!(
                s,
                "\nThe offered {} tokens/s exceed r by {} tokens/s, but {why}. Over a longer \
                 run a share {share:.0}% is rejected{}.\n\
                 To admit it all, r must be at least {} tokens/s.",
                show_number(offered_tokens),
                show_number(excess),
                longer_run(args, absorb).map_or(String::new(), |d| format!(
                    " (simulate --duration {d} to see it)"
                )),
                show_number(offered_tokens)
            );
        } else {
            let _ = writeln!(
                s,
                "\nThe offered {} tokens/s exceed r by {} tokens/s: in the long run at least \
                 {share:.0}% of the tokens asked for are rejected ({this_run}). A full bucket \
                 absorbs the excess for B / (offered - r) = {} s.\n\
                 To admit it all, r must be at least {} tokens/s.",
                show_number(offered_tokens),
                show_number(excess),
                show_number(args.capacity as f64 / excess),
                show_number(offered_tokens)
            );
        }
    } else if rejected == 0 {
        let _ = writeln!(
            s,
            "\nr covers the average load ({} <= {} tokens/s) and B held every burst of this run.",
            show_number(offered_tokens),
            show_number(r)
        );
    } else {
        let _ = writeln!(
            s,
            "\nr covers the average load ({} <= {} tokens/s); rejections come from {}bursts \
             larger than B can hold.",
            show_number(offered_tokens),
            show_number(r),
            if policy.starts_full() {
                ""
            } else {
                "the empty start and from "
            }
        );
    }
    if args.pattern == Pattern::Bursty {
        let burst_secs = args.burst_period().as_secs_f64() * args.duty();
        let burst_tokens = offered_tokens * args.burst_period().as_secs_f64();
        let need = burst_tokens - r * burst_secs;
        let _ = writeln!(
            s,
            "Each burst brings {} tokens in {}; with r = {} it needs B >= {} to pass whole \
             (and r >= {} to refill between bursts).",
            show_number(burst_tokens),
            show_duration(Duration::from_secs_f64(burst_secs)),
            show_number(r),
            show_number(need.max(0.0).ceil()),
            show_number(offered_tokens)
        );
    }
    s
}

/// The SVG chart: the bucket level above, offered and admitted rates below.
fn draw(args: &Args, policy: &Policy, out: &Outcome) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot draw the chart: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(
                &format!(
                    "B = {}, r = {}/s, {}",
                    args.capacity,
                    show_number(args.refill),
                    pattern_text(args)
                ),
                ("sans-serif", 18),
            )
            .map_err(|e| err(&e))?;
        let (upper, lower) = root.split_vertically(300);
        let secs = args.duration.as_secs_f64();
        let width = secs / BINS as f64;
        let capacity = args.capacity as f64;

        let mut level = ChartBuilder::on(&upper)
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..secs, 0.0..capacity * 1.1)
            .map_err(|e| err(&e))?;
        level
            .configure_mesh()
            .y_desc("tokens in the bucket")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| err(&e))?;
        let blue = RGBColor(0x1f, 0x77, 0xb4);
        let red = RGBColor(0xd6, 0x27, 0x28);
        // The range of each bin, lowest to highest: the band a long run fills.
        let band: Vec<(f64, f64)> = out
            .bins
            .iter()
            .enumerate()
            .map(|(i, b)| ((i as f64 + 0.5) * width, b.high))
            .chain(
                out.bins
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, b)| ((i as f64 + 0.5) * width, b.low)),
            )
            .collect();
        level
            .draw_series(std::iter::once(Polygon::new(band, blue.mix(0.3).filled())))
            .map_err(|e| err(&e))?
            .label("lowest to highest in each sample")
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 4), (x + 18, y + 4)], blue.mix(0.3).filled())
            });
        level
            .draw_series(LineSeries::new(
                out.bins
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (i as f64 * width, b.level)),
                blue.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label("bucket level")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], blue.stroke_width(2))
            });
        level
            .draw_series(LineSeries::new(
                [(0.0, capacity), (secs, capacity)],
                red.stroke_width(1),
            ))
            .map_err(|e| err(&e))?
            .label("capacity B")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], red.stroke_width(1)));
        level
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|e| err(&e))?;

        // Rates over groups of bins holding about 20 arrivals each, so that a steady load
        // does not read as a saw of 2 and 3 arrivals per bin; bursts stay visible.
        let mut group = (20.0 / (args.rate * width))
            .ceil()
            .clamp(1.0, (BINS / 10) as f64) as usize;
        if args.pattern == Pattern::Bursty {
            let burst_bins = args.burst_period().as_secs_f64() * args.duty() / width / 2.0;
            group = group.min(burst_bins.floor().max(1.0) as usize);
        }
        let rates: Vec<(f64, f64, f64)> = out
            .bins
            .chunks(group)
            .enumerate()
            .map(|(i, chunk)| {
                let w = width * chunk.len() as f64;
                let offered: u128 = chunk.iter().map(|b| b.offered_tokens).sum();
                let admitted: u128 = chunk.iter().map(|b| b.admitted_tokens).sum();
                let mid = (i * group) as f64 * width + w / 2.0;
                (mid, offered as f64 / w, admitted as f64 / w)
            })
            .collect();
        let r = policy.effective_refill_per_second();
        let top = rates.iter().map(|&(_, o, _)| o).fold(r, f64::max) * 1.15;
        let mut rate = ChartBuilder::on(&lower)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..secs, 0.0..top.max(1.0))
            .map_err(|e| err(&e))?;
        rate.configure_mesh()
            .x_desc("simulated time (s)")
            .y_desc("tokens per second")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| err(&e))?;
        let grey = RGBColor(0x99, 0x99, 0x99);
        let green = RGBColor(0x2c, 0xa0, 0x2c);
        rate.draw_series(LineSeries::new(
            rates.iter().map(|&(t, o, _)| (t, o)),
            grey.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label("offered")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], grey.stroke_width(1)));
        rate.draw_series(LineSeries::new(
            rates.iter().map(|&(t, _, a)| (t, a)),
            green.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label("admitted")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], green.stroke_width(2)));
        rate.draw_series(LineSeries::new([(0.0, r), (secs, r)], red.stroke_width(1)))
            .map_err(|e| err(&e))?
            .label("refill rate r")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], red.stroke_width(1)));
        rate.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["simulate"];
        argv.extend_from_slice(extra);
        Wrap::try_parse_from(argv).unwrap().args
    }

    fn sim(args: &Args) -> Outcome {
        let policy = Policy::builder(args.capacity, args.refill).build().unwrap();
        simulate(args, policy).unwrap()
    }

    #[test]
    fn mix_parses_weighted_classes_and_refuses_bad_ones() {
        let mix = parse_mix("metadata=1:70,search=3:25,export=20:5").unwrap();
        assert_eq!(mix.0.len(), 3);
        assert_eq!(mix.total_weight(), 100);
        assert!((mix.mean_cost() - (70.0 + 75.0 + 100.0) / 100.0).abs() < 1e-12);
        assert_eq!(mix.pick(69), 0);
        assert_eq!(mix.pick(70), 1);
        assert_eq!(mix.pick(99), 2);
        assert!(parse_mix("a=0:1").unwrap_err().contains("at least 1"));
        assert!(
            parse_mix("a=1:0")
                .unwrap_err()
                .contains("the weight of class a must be a whole number, from 1 to 1000000")
        );
        assert!(parse_mix("a=1:1000001").is_err());
        assert!(parse_mix("a=1").unwrap_err().contains(":WEIGHT"));
        assert!(parse_mix("a=1:1,a=2:1").unwrap_err().contains("twice"));
        assert!(parse_mix("").unwrap_err().contains("no class"));
        for stray in ["a=1:1,", ",a=1:1", "a=1:1,,b=2:1"] {
            assert!(
                parse_mix(stray).unwrap_err().contains("empty class"),
                "{stray}"
            );
        }
    }

    #[test]
    fn mean_cost_of_huge_classes_does_not_overflow() {
        let mix = parse_mix(&format!("a={}:1000000,b=1:1000000", u64::MAX)).unwrap();
        assert!((mix.mean_cost() - u64::MAX as f64 / 2.0).abs() < 1e6);
    }

    #[test]
    fn duty_and_burst_period_without_bursty_pattern_are_refused() {
        for extra in [
            &["--duty", "0.5"][..],
            &["--burst-period", "2s"],
            &["--pattern", "poisson", "--duty", "0.5"],
        ] {
            let err = validate(&args(extra)).unwrap_err();
            assert!(err.contains("--pattern bursty only"), "{extra:?}: {err}");
        }
        let a = args(&[
            "--pattern",
            "bursty",
            "--duty",
            "0.5",
            "--burst-period",
            "2s",
        ]);
        assert!(validate(&a).is_ok());
        assert_eq!((a.duty(), a.burst_period()), (0.5, Duration::from_secs(2)));
        let a = args(&["--pattern", "bursty"]);
        assert_eq!((a.duty(), a.burst_period()), (0.25, Duration::from_secs(1)));
    }

    #[test]
    fn absurd_sizes_are_refused_before_any_work_in_short_messages() {
        // No number is written out in hundreds of digits.
        let longest_number = |text: &str| {
            text.split(|c: char| !c.is_ascii_digit())
                .map(str::len)
                .max()
                .unwrap_or(0)
        };
        let a = args(&["--capacity", "18446744073709551615", "--refill", "1e300"]);
        let err = validate(&a).unwrap_err();
        assert!(err.contains("1e300") && longest_number(&err) <= 20, "{err}");
        let a = args(&["--capacity", "18446744073709551615", "--refill", "1e9"]);
        let err = validate(&a).unwrap_err();
        assert!(
            err.contains("1e9 tokens/s") && longest_number(&err) <= 20,
            "{err}"
        );
        let a = args(&["--rate", "1e9", "--duration", "1m"]);
        let err = validate(&a).unwrap_err();
        assert!(err.contains("is 6e10 requests, above the 5e7"), "{err}");
        let wrap = |argv: &[&str]| {
            let mut v = vec!["simulate"];
            v.extend_from_slice(argv);
            Wrap::try_parse_from(v).unwrap_err().to_string()
        };
        assert!(wrap(&["--rate", "1e300"]).contains("at most 1e9, got 1e300"));
        assert!(wrap(&["--duration", "25h"]).contains("at most 24 h"));
        assert!(wrap(&["--burst-period", "1000000000m"]).contains("at most 24 h"));
    }

    fn report_of(extra: &[&str]) -> String {
        let a = args(extra);
        let policy = validate(&a).unwrap();
        let out = simulate(&a, policy).unwrap();
        report(&a, &policy, &out)
    }

    #[test]
    fn a_long_run_keeps_each_samples_lowest_and_highest_level() {
        // Bursts every second over 2000 s: each of the 200 bins spans 10 bursts, which
        // drain the bucket and let it refill. A sample at each bin's start alone would
        // show one arbitrary point of that cycle.
        let a = args(&[
            "--pattern",
            "bursty",
            "--burst-period",
            "1s",
            "--duration",
            "2000s",
            "--rate",
            "40",
            "--capacity",
            "20",
            "--refill",
            "20",
        ]);
        let policy = validate(&a).unwrap();
        let out = simulate(&a, policy).unwrap();
        for (i, b) in out.bins.iter().enumerate().skip(1) {
            assert!(b.low <= b.level && b.level <= b.high, "bin {i}: {b:?}");
            assert!(b.low < 1.0, "bin {i} never drained: {b:?}");
            assert!(b.high > 15.0, "bin {i} never refilled: {b:?}");
        }
        let svg = draw(&a, &policy, &out).unwrap();
        assert!(svg.contains("lowest to highest in each sample"));
    }

    #[test]
    fn the_text_and_the_table_give_the_same_rejected_share() {
        let text = report_of(&["--mix", "search=1:3,export=20:1"]);
        let all = text
            .lines()
            .find(|l| l.trim_start().starts_with("all "))
            .expect("the table's total row");
        let table_share = all.split_whitespace().last().unwrap();
        assert!(
            text.contains(&format!("this run rejected {table_share} of the requests")),
            "{text}"
        );
        assert!(text.contains("% of the tokens they asked for"), "{text}");
    }

    #[test]
    fn a_run_with_too_few_arrivals_says_it_cannot_tell() {
        let text = report_of(&["--duration", "1us"]);
        assert!(
            text.contains("no request was rejected in the 1 us simulated"),
            "{text}"
        );
        assert!(text.contains("too few to say anything"), "{text}");
        assert!(text.contains("(e.g. 8s)"), "{text}");
        assert!(!text.contains("rejected. A full bucket"), "{text}");
        assert!(!text.contains("cover this load"), "{text}");
    }

    #[test]
    fn an_excess_hidden_by_the_full_bucket_is_called_so() {
        // 25 arrivals in 1 s, all admitted from the full bucket of 60.
        let text = report_of(&["--duration", "1s"]);
        assert!(
            text.contains("no request was rejected in the 1 s simulated"),
            "{text}"
        );
        assert!(
            text.contains(
                "a full bucket absorbs the excess for B / (offered - r) = 4 s, longer than this run"
            ),
            "{text}"
        );
        assert!(text.contains("simulate --duration 8s to see it"), "{text}");
        // The 20 s default run does see it.
        let text = report_of(&[]);
        assert!(
            text.contains("in the long run at least 60% of the tokens asked for are rejected"),
            "{text}"
        );
        assert!(!text.contains("no request was rejected"), "{text}");
    }

    #[test]
    fn a_load_within_r_and_b_says_both_held() {
        let text = report_of(&["--rate", "5"]);
        assert!(text.contains("no request was rejected"), "{text}");
        assert!(text.contains("B held every burst of this run"), "{text}");
        let text = report_of(&[
            "--rate",
            "0.2",
            "--duration",
            "100s",
            "--start",
            "empty",
            "--mix",
            "big=30:1",
        ]);
        assert!(text.contains("the empty start"), "{text}");
    }

    #[test]
    fn seed_example_drains_the_full_bucket_then_admits_the_refill_rate() {
        // B = 60, r = 10/s, 25 req/s offered: 60 pass at once, the balance drains at
        // 15/s and runs dry after 4 s; from then on 10 per second are admitted.
        let a = args(&["--duration", "20s"]);
        let out = sim(&a);
        let dry = out.first_rejection.unwrap().as_secs_f64();
        assert!((3.9..4.2).contains(&dry), "ran dry at {dry}");
        let admitted = out.per_class[0].admitted;
        // 60 up front + 10/s for 20 s, less the rounding down of r (never more).
        assert!((255..=260).contains(&admitted), "{admitted}");
        let sustained = out.tokens_after_dry as f64 / (20.0 - dry);
        assert!((9.8..=10.0).contains(&sustained), "{sustained}");
        // The first bin holds the full bucket, the level at the end is near empty.
        assert!(out.bins[0].level > 59.9);
        assert!(out.bins[BINS - 1].level < 1.0);
    }

    #[test]
    fn same_seed_replays_the_same_traffic_and_another_seed_does_not() {
        let run = |seed: &str| {
            let a = args(&[
                "--pattern",
                "poisson",
                "--mix",
                "a=1:1,b=3:1",
                "--seed",
                seed,
            ]);
            sim(&a)
                .per_class
                .iter()
                .map(|c| (c.admitted, c.rejected))
                .collect::<Vec<_>>()
        };
        assert_eq!(run("7"), run("7"));
        assert_ne!(run("7"), run("8"));
    }

    #[test]
    fn bursty_traffic_keeps_the_average_rate() {
        let a = args(&["--pattern", "bursty", "--rate", "100", "--duration", "10s"]);
        let mut rng = Rng(1);
        let times: Vec<u64> = arrivals(&a, &mut rng).collect();
        assert_eq!(times.len(), 1000);
        // Every arrival lies in the first quarter of its second.
        assert!(times.iter().all(|t| t % 1_000_000_000 < 250_000_000));
    }

    #[test]
    fn costly_class_above_capacity_is_refused() {
        let a = args(&["--capacity", "10", "--mix", "export=20:1"]);
        let err = run(a, &mut Out::new(Vec::new())).unwrap_err();
        assert!(err.contains("export") && err.contains("capacity"), "{err}");
    }

    #[test]
    fn invalid_policy_is_refused_with_the_library_message() {
        let a = args(&["--capacity", "100", "--refill", "1e-300"]);
        let err = run(a, &mut Out::new(Vec::new())).unwrap_err();
        assert!(
            err.starts_with("invalid policy: refill rate 1e-300"),
            "{err}"
        );
    }
}
