//! `tokengate fleet`: K instance processes share one budget on Redis, by token leases or
//! rate leases; prints each instance's admissions and the total against the bound, and
//! can kill one instance mid-run. `--compare-chart` instead sweeps K and the offered rate
//! for rate leases, token leases and a per-request Lua bucket (`compare`).

mod compare;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokengate_redis::{FailMode, Mode, PoolConfig, RateConfig, RatePool, RedisPool, RemotePolicy};

use crate::Out;

/// Options of `tokengate fleet`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The Redis server holding the shared budget.
    #[arg(
        long,
        env = "TOKENGATE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis: String,

    /// Instance processes K (1 to 64).
    #[arg(long, short = 'k', default_value = "4", value_parser = clap::value_parser!(u64).range(1..=64))]
    instances: u64,

    /// Threads per instance (1 to 64).
    #[arg(long, default_value = "2", value_parser = clap::value_parser!(u64).range(1..=64))]
    threads: u64,

    /// Bucket capacity B, whole tokens.
    #[arg(long, short = 'b', default_value = "200")]
    capacity: u64,

    /// Refill rate r, tokens per second.
    #[arg(long, short = 'r', default_value = "100")]
    refill: f64,

    /// Largest lease L, tokens.
    #[arg(long, short = 'l', default_value = "10")]
    lease: u64,

    /// Lease depth d: the most leases one instance holds at once (2 to 64); an instance
    /// holds at most H = d*L tokens, the term of the loose bound.
    #[arg(long, default_value = "32", value_parser = clap::value_parser!(u64).range(2..=64))]
    depth: u64,

    /// Lease time-to-live, milliseconds.
    #[arg(long, default_value = "1000")]
    ttl_ms: u64,

    /// Run length, seconds (1 to 600).
    #[arg(long, short = 'd', default_value = "5", value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,

    /// Each instance offers this many times its share (r/K) of the rate.
    #[arg(long, default_value = "10")]
    offer: f64,

    /// Exact (refill capped at B - outstanding) or loose mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Exact)]
    mode: ModeArg,

    /// SIGKILL instance 0 this many milliseconds into the run.
    #[arg(long)]
    kill_after_ms: Option<u64>,

    /// Instead of one run, one run per lease size 1, 5, 10, 50 and 100 (each --seconds
    /// long), and an SVG chart at this path of the tokens one instance holds (what its
    /// death would strand, until ttl + grace) and of Redis round trips per second, against
    /// the lease size.
    #[arg(long, value_name = "SVG")]
    sweep_chart: Option<std::path::PathBuf>,

    /// Token leases (batches of tokens from Redis) or rate leases (each instance holds a
    /// share of (B, r) with an expiry, refreshed every ttl/4, decided locally).
    #[arg(long, value_enum, default_value_t = LeaseMode::Token)]
    lease_mode: LeaseMode,

    /// Instead of one run: rate leases, token leases and a per-request Lua bucket side by
    /// side, K instances (threads, each with its own pool) for each K of --sweep-k and
    /// each offered rate of --sweep-offer (equal demand), then skewed and shifting demand
    /// at the largest offer; each run --seconds long after 1 s of warm-up. Prints the
    /// table and writes an SVG chart at this path of round trips per instance per second
    /// and efficiency against the offered rate.
    #[arg(long, value_name = "SVG")]
    compare_chart: Option<std::path::PathBuf>,

    /// The instance counts of --compare-chart (1 to 64 each).
    #[arg(long, value_delimiter = ',', default_value = "8,32,64")]
    sweep_k: Vec<u64>,

    /// The offered request rates of --compare-chart, in multiples of r (above 0, at most
    /// 1000).
    #[arg(long, value_delimiter = ',', default_value = "1.5,4,16")]
    sweep_offer: Vec<f64>,

    /// The demand patterns of --compare-chart: equal (at each offer), skewed and shifting
    /// (at the largest offer).
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "equal,skewed,shifting"
    )]
    sweep_demand: Vec<DemandArg>,

    /// The modes of --compare-chart.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "rate,token,per-request"
    )]
    sweep_modes: Vec<SweepMode>,

    /// Internal: run as one instance (started by the fleet).
    #[arg(long, hide = true)]
    instance: Option<String>,
}

/// How instances share the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LeaseMode {
    Token,
    Rate,
}

/// A demand pattern of the comparison sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DemandArg {
    Equal,
    Skewed,
    Shifting,
}

/// A mode of the comparison sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SweepMode {
    Rate,
    Token,
    PerRequest,
}

/// The pool's mode.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Exact,
    Loose,
}

pub fn run(args: Args, out: &mut Out<impl Write>) -> Result<(), String> {
    let mode = match args.mode {
        ModeArg::Exact => Mode::Exact,
        ModeArg::Loose => Mode::Loose,
    };
    let policy = RemotePolicy::new(args.capacity, args.refill)
        .map_err(|e| e.to_string())?
        .with_mode(mode);
    if let Some(ns) = &args.instance {
        return instance(&args, ns, policy);
    }
    if let Some(path) = args.compare_chart.clone() {
        return compare_sweep(&args, &path, out);
    }
    let Some(path) = args.sweep_chart.clone() else {
        return once(&args, args.lease, mode, out).map(drop);
    };
    let file = crate::open_output(&path)?;
    let mut points = Vec::new();
    for lease in [1, 5, 10, 50, 100] {
        let r = once(&args, lease, mode, out)?;
        points.push((lease, r));
    }
    out.print("| lease L | tokens held per instance (stranded if it dies) | Redis round trips/s | admitted |\n|---|---|---|---|\n")?;
    for (lease, r) in &points {
        out.print(&format!(
            "| {lease} | {:.1} | {:.0} | {} |\n",
            r.held, r.round_trips_per_s, r.admitted
        ))?;
    }
    let svg = draw(&args, &points)?;
    crate::write_output(file, &path, &svg)?;
    out.print(&format!("chart: {}\n", path.display()))
}

/// `--compare-chart`: the sweep of `compare`, its table and its chart.
fn compare_sweep(
    args: &Args,
    path: &std::path::Path,
    out: &mut Out<impl Write>,
) -> Result<(), String> {
    if let Some(k) = args.sweep_k.iter().find(|k| !(1..=64).contains(*k)) {
        return Err(format!("--sweep-k must list counts of 1 to 64, got {k}"));
    }
    if let Some(o) = args
        .sweep_offer
        .iter()
        .find(|o| !(o.is_finite() && **o > 0.0 && **o <= 1000.0))
    {
        return Err(format!(
            "--sweep-offer must list multiples of r above 0 and at most 1000, got {o}"
        ));
    }
    if !(args.refill.is_finite() && args.refill >= 1.0 && args.refill.fract() == 0.0) {
        return Err(format!(
            "--compare-chart needs a whole refill rate of at least 1/s, got {}",
            args.refill
        ));
    }
    let file = crate::open_output(path)?;
    let ks: Vec<usize> = args.sweep_k.iter().map(|&k| k as usize).collect();
    let demands: Vec<compare::Demand> = args
        .sweep_demand
        .iter()
        .map(|d| match d {
            DemandArg::Equal => compare::Demand::Equal,
            DemandArg::Skewed => compare::Demand::Skewed,
            DemandArg::Shifting => compare::Demand::Shifting,
        })
        .collect();
    let modes: Vec<compare::Mode> = args
        .sweep_modes
        .iter()
        .map(|m| match m {
            SweepMode::Rate => compare::Mode::Rate,
            SweepMode::Token => compare::Mode::Token,
            SweepMode::PerRequest => compare::Mode::PerRequest,
        })
        .collect();
    let rows = compare::sweep(
        &args.redis,
        &ks,
        &args.sweep_offer,
        (&demands, &modes),
        args.capacity,
        args.refill as u64,
        Duration::from_millis(args.ttl_ms),
        args.seconds as f64,
        out,
    )?;
    let svg = compare::draw(
        &rows,
        &format!(
            "B = {}, r = {}/s, lease ttl {} ms: rate leases (blue), token leases (red), per-request Lua (grey); thicker = larger K",
            args.capacity, args.refill, args.ttl_ms
        ),
    )?;
    crate::write_output(file, path, &svg)?;
    out.print(&format!("chart: {}\n", path.display()))
}

/// What one fleet run measured.
#[derive(Debug, Clone, Copy)]
struct Summary {
    admitted: u64,
    round_trips_per_s: f64,
    /// Mean tokens one instance held in its leases, sampled every 100 ms.
    held: f64,
}

/// One fleet run with leases of at most `lease` tokens.
fn once(args: &Args, lease: u64, mode: Mode, out: &mut Out<impl Write>) -> Result<Summary, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let ns = format!("fleet-{}-{nanos}", std::process::id());
    // Fail early, with the typed message, when Redis is not there.
    drop(
        RedisPool::connect(PoolConfig::new(args.redis.clone(), ns.clone()))
            .map_err(|e| e.to_string())?,
    );
    out.print(&format!(
        "fleet: K = {} instances x {} threads, B = {}, r = {}/s, {:?} leases, L = {}, d = {}, ttl = {} ms, {:?} mode, {} s, each offering {}x its share\n",
        args.instances, args.threads, args.capacity, args.refill, args.lease_mode, lease, args.depth, args.ttl_ms, args.mode, args.seconds, args.offer
    ))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children: Vec<Child> = (0..args.instances)
        .map(|_| {
            Command::new(&exe)
                .args(["fleet", "--instance", &ns, "--redis", &args.redis])
                .args([
                    "-k",
                    &args.instances.to_string(),
                    "--threads",
                    &args.threads.to_string(),
                ])
                .args([
                    "-b",
                    &args.capacity.to_string(),
                    "-r",
                    &args.refill.to_string(),
                ])
                .args(["--depth", &args.depth.to_string()])
                .args([
                    "-l",
                    &lease.to_string(),
                    "--ttl-ms",
                    &args.ttl_ms.to_string(),
                ])
                .args([
                    "-d",
                    &args.seconds.to_string(),
                    "--offer",
                    &args.offer.to_string(),
                ])
                .args([
                    "--mode",
                    if mode == Mode::Exact {
                        "exact"
                    } else {
                        "loose"
                    },
                ])
                .args([
                    "--lease-mode",
                    match args.lease_mode {
                        LeaseMode::Token => "token",
                        LeaseMode::Rate => "rate",
                    },
                ])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start an instance: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let stdout = c.stdout.take().expect("piped");
            std::thread::spawn(move || {
                let mut last = (0u64, 0u64);
                let (mut held, mut samples) = (0u64, 0u64);
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let v: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
                    if let [adm, rt, h] = v[..] {
                        last = (adm, rt);
                        held += h;
                        samples += 1;
                    }
                }
                (last, held as f64 / samples.max(1) as f64)
            })
        })
        .collect();
    let mut killed = None;
    if let Some(ms) = args.kill_after_ms {
        std::thread::sleep(Duration::from_millis(ms));
        children[0].kill().map_err(|e| e.to_string())?;
        killed = Some(start.elapsed());
    }
    for c in &mut children {
        let _ = c.wait();
    }
    let joined: Vec<((u64, u64), f64)> = readers
        .into_iter()
        .map(|r| r.join().unwrap_or(((0, 0), 0.0)))
        .collect();
    let results: Vec<(u64, u64)> = joined.iter().map(|j| j.0).collect();
    let held = joined.iter().map(|j| j.1).sum::<f64>() / joined.len().max(1) as f64;
    let total: u64 = results.iter().map(|r| r.0).sum();
    let rts: u64 = results.iter().map(|r| r.1).sum();
    for (i, (adm, rt)) in results.iter().enumerate() {
        let note = if i == 0 && killed.is_some() {
            " (killed; last report)"
        } else {
            ""
        };
        out.print(&format!(
            "instance {i}: {adm} admitted, {rt} Redis round trips{note}\n"
        ))?;
    }
    if let Some(at) = killed {
        out.print(&format!("instance 0 killed at {:.2} s: its leases stay stranded until reclaimed (ttl + grace after their grant)\n", at.as_secs_f64()))?;
    }
    let t = args.seconds as f64;
    let exact = args.capacity as f64 + args.refill * t;
    let bound = match mode {
        Mode::Exact => exact,
        Mode::Loose => exact + args.instances as f64 * args.depth as f64 * lease as f64,
    };
    out.print(&format!(
        "total: {total} admitted in {t} s; bound {bound:.0} ({}); {rts} round trips ({:.1} per 1,000 decisions)\n",
        if mode == Mode::Exact { "B + r*T" } else { "B + r*T + K*d*L" },
        rts as f64 * 1000.0 / total.max(1) as f64
    ))?;
    if total as f64 > bound + 1.0 {
        return Err(format!(
            "the fleet admitted {total}, above the bound {bound:.0}"
        ));
    }
    Ok(Summary {
        admitted: total,
        round_trips_per_s: rts as f64 / t,
        held,
    })
}

/// One instance: drives the shared bucket from its threads at `offer` times its share,
/// printing "admitted round-trips" every 100 ms.
fn instance(args: &Args, ns: &str, policy: RemotePolicy) -> Result<(), String> {
    let config = PoolConfig::new(args.redis.clone(), ns)
        .max_lease(args.lease)
        .lease_depth(args.depth)
        .lease_ttl(Duration::from_millis(args.ttl_ms))
        .fail_mode(FailMode::FailClosed);
    if args.lease_mode == LeaseMode::Rate {
        let pool = RatePool::connect(RateConfig::new(config)).map_err(|e| e.to_string())?;
        let bucket = pool.bucket("global", policy).map_err(|e| e.to_string())?;
        return drive(
            args,
            || bucket.try_acquire(1).is_ok(),
            || pool.round_trips(),
            || bucket.stats().burst,
        );
    }
    let pool = RedisPool::connect(config).map_err(|e| e.to_string())?;
    let bucket = pool.bucket("global", policy).map_err(|e| e.to_string())?;
    drive(
        args,
        || bucket.try_acquire(1).is_ok(),
        || pool.round_trips(),
        || bucket.leased_tokens(),
    )
}

/// Drives `decide` from the instance's threads at `offer` times its share, printing
/// "admitted round-trips held" every 100 ms (`held`: the tokens of its leases, or its
/// burst share under rate leases).
fn drive(
    args: &Args,
    decide: impl Fn() -> bool + Sync,
    round_trips: impl Fn() -> u64,
    held: impl Fn() -> u64,
) -> Result<(), String> {
    let per_thread =
        (args.offer * args.refill / args.instances as f64 / args.threads as f64).max(0.001);
    let gap = Duration::from_secs_f64(1.0 / per_thread);
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let admitted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..args.threads {
            s.spawn(|| {
                let mut next = Instant::now();
                while next < end {
                    if decide() {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    next += gap;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            });
        }
        let mut stdout = std::io::stdout();
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
            let _ = writeln!(
                stdout,
                "{} {} {}",
                admitted.load(std::sync::atomic::Ordering::Relaxed),
                round_trips(),
                held()
            );
        }
    });
    let _ = writeln!(
        std::io::stdout(),
        "{} {} {}",
        admitted.load(std::sync::atomic::Ordering::Relaxed),
        round_trips(),
        held()
    );
    Ok(())
}

/// The sweep's chart: tokens held per instance and round trips per second against L.
fn draw(args: &Args, points: &[(u64, Summary)]) -> Result<String, String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("cannot draw the chart: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(
                &format!(
                    "K = {} instances, B = {}, r = {}/s, ttl = {} ms: by lease size L",
                    args.instances, args.capacity, args.refill, args.ttl_ms
                ),
                ("sans-serif", 18),
            )
            .map_err(|e| err(&e))?;
        let (upper, lower) = root.split_vertically(300);
        let max_l = points.iter().map(|p| p.0).max().unwrap_or(1) as f64 * 1.05;
        let panels = [
            (upper, "tokens held per instance (stranded if it dies)", 0),
            (lower, "Redis round trips per second (all instances)", 1),
        ];
        for (area, label, which) in panels {
            let value = |s: &Summary| {
                if which == 0 {
                    s.held
                } else {
                    s.round_trips_per_s
                }
            };
            let top = points.iter().map(|p| value(&p.1)).fold(1.0, f64::max) * 1.15;
            let mut chart = ChartBuilder::on(&area)
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..max_l, 0.0..top)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("largest lease L (tokens)")
                .y_desc(label)
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            let color = if which == 0 {
                RGBColor(0xd6, 0x27, 0x28)
            } else {
                RGBColor(0x1f, 0x77, 0xb4)
            };
            let series: Vec<(f64, f64)> =
                points.iter().map(|(l, s)| (*l as f64, value(s))).collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?;
            chart
                .draw_series(series.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
