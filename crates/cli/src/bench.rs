//! `tokengate bench`: sweeps thread counts, regimes and engines; prints millions of
//! decisions per second and the ratio to governor; writes CSV and an SVG chart.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use clap::builder::PossibleValue;
use plotters::prelude::*;

use crate::engines::{self, Engine, Limiter, Regime, Sample, Visit};
use crate::{Out, open_output, parse_duration, show_duration, whole_number, write_output};

/// The most threads a sweep runs.
const MAX_THREADS: u64 = 1024;

/// The longest measured time per cell.
const MAX_CELL: Duration = Duration::from_secs(60);

/// The shortest measured time per cell: below it, starting the threads is most of it.
const MIN_CELL: Duration = Duration::from_millis(1);

/// Options of `tokengate bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Largest thread count N, from 1 to 1024. The sweep measures 1, 2, 4, 8, ...
    /// threads below N, and N itself (every count with --every-count). Default: every
    /// core of this machine. Also read from TOKENGATE_THREADS.
    #[arg(long, short = 't', value_name = "N", env = "TOKENGATE_THREADS",
          allow_negative_numbers = true, value_parser = thread_count)]
    threads: Option<usize>,

    /// Measure every thread count from 1 to N instead of the powers of two and N.
    #[arg(long)]
    every_count: bool,

    /// Measured time per cell (one engine, one regime, one thread count, one round),
    /// with a unit: ns, us, ms, s or m; from 1ms to 1m. Each cell also runs a short
    /// unmeasured warm-up (a fifth of this, at most 50 ms).
    #[arg(long, short = 'd', value_name = "DURATION", default_value = "100ms",
          allow_hyphen_values = true, value_parser = cell_duration)]
    duration: Duration,

    /// Rounds over the whole sweep, from 1 to 100; each cell reports the median round.
    /// More rounds smooth out a busy machine.
    #[arg(long, short = 'r', value_name = "N", default_value = "3",
          allow_negative_numbers = true, value_parser = rounds)]
    rounds: u32,

    /// Engines to compare, comma-separated.
    #[arg(
        long,
        short = 'e',
        value_name = "ENGINE",
        value_delimiter = ',',
        default_value = "tokengate,tokengate-coarse,tokengate-leased,tokengate-leased-coarse,governor,mutex,tokengate-keyed,governor-keyed,floor-keyed"
    )]
    engines: Vec<Engine>,

    /// Regimes to run, comma-separated. admit: B = 1e6, r = 1e9 tokens/s (every request
    /// admitted); reject: B = 1, r = 1 token/s (every request rejected); keyed: B = 100,
    /// r = 1000 tokens/s per key over 100,000 random keys (keyed engines only).
    /// Default: every regime one of the selected engines runs in.
    #[arg(long, value_name = "REGIME", value_delimiter = ',')]
    regimes: Option<Vec<Regime>>,

    /// CSV output: one row per regime, engine and thread count (median, min and max in
    /// millions of decisions per second, and the ratio to governor). Default: bench.csv in
    /// the --out directory.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,

    /// SVG chart of throughput against threads, one line per engine, one panel per
    /// regime. Default: bench.svg in the --out directory.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,

    /// The directory the output files go to unless --csv or --svg names a path; it is
    /// created if missing.
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,
}

fn thread_count(text: &str) -> Result<usize, String> {
    whole_number(text, "the thread count", "", 1, MAX_THREADS).map(|n| n as usize)
}

fn rounds(text: &str) -> Result<u32, String> {
    whole_number(text, "the number of rounds", "", 1, 100).map(|n| n as u32)
}

fn cell_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if (MIN_CELL..=MAX_CELL).contains(&d) {
        Ok(d)
    } else {
        Err(format!(
            "the measured time per cell must be from {} to {}, got {text}",
            show_duration(MIN_CELL),
            show_duration(MAX_CELL)
        ))
    }
}

/// The thread counts of a sweep up to `max`: 1, 2, 4, 8, ... below `max`, then `max`;
/// or every count from 1 to `max`.
fn thread_counts(max: usize, every_count: bool) -> Vec<usize> {
    if every_count {
        return (1..=max).collect();
    }
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |&t| t.checked_mul(2))
        .take_while(|&t| t < max)
        .collect();
    counts.push(max);
    counts
}

/// The regimes to run: those asked for (each must have a selected engine that runs in
/// it), or by default every regime one of `engines` runs in, in table order.
fn selected_regimes(engines: &[Engine], asked: Option<&[Regime]>) -> Result<Vec<Regime>, String> {
    let runs_in = |regime: Regime| engines.iter().any(|e| e.regimes().contains(&regime));
    let Some(asked) = asked else {
        return Ok(Regime::ALL.into_iter().filter(|&r| runs_in(r)).collect());
    };
    let regimes = dedup(asked);
    if let Some(&regime) = regimes.iter().find(|&&r| !runs_in(r)) {
        let runs_it: Vec<_> = Engine::ALL
            .iter()
            .filter(|e| e.regimes().contains(&regime))
            .map(|e| e.name())
            .collect();
        return Err(format!(
            "no selected engine runs in the {} regime; add one of: {}",
            regime.name(),
            runs_it.join(", ")
        ));
    }
    Ok(regimes)
}

/// The cells of a sweep, regime by regime, thread count by thread count.
fn plan(regimes: &[Regime], counts: &[usize], engines: &[Engine]) -> Vec<(Regime, usize, Engine)> {
    let mut plan = Vec::new();
    for &regime in regimes {
        for &threads in counts {
            for &engine in engines.iter().filter(|e| e.regimes().contains(&regime)) {
                plan.push((regime, threads, engine));
            }
        }
    }
    plan
}

/// The unmeasured warm-up before each cell's measurement.
fn warmup(duration: Duration) -> Duration {
    (duration / 5).min(Duration::from_millis(50))
}

/// The time a sweep of `cells` cells takes: every cell, every round, warm-up and
/// measurement.
fn estimate(cells: usize, rounds: u32, duration: Duration) -> Duration {
    (duration + warmup(duration)).mul_f64(cells as f64 * f64::from(rounds))
}

impl ValueEnum for Engine {
    fn value_variants<'a>() -> &'a [Self] {
        &Engine::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()).help(self.label()))
    }
}

impl ValueEnum for Regime {
    fn value_variants<'a>() -> &'a [Self] {
        &Regime::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

/// One cell's result: every round's sample.
#[derive(Debug)]
struct Cell {
    regime: Regime,
    engine: Engine,
    threads: usize,
    samples: Vec<Sample>,
}

impl Cell {
    fn sorted_mops(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.samples.iter().map(Sample::mops).collect();
        v.sort_by(f64::total_cmp);
        v
    }

    fn median(&self) -> f64 {
        let v = self.sorted_mops();
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    fn admitted_fraction(&self) -> f64 {
        let (d, a) = self
            .samples
            .iter()
            .fold((0, 0), |(d, a), s| (d + s.decisions, a + s.admitted));
        a as f64 / d.max(1) as f64
    }
}

struct Measure {
    threads: usize,
    warmup: Duration,
    duration: Duration,
}

impl Visit for &Measure {
    type Out = Sample;
    fn visit<L: Limiter>(self, limiter: &L) -> Sample {
        engines::run_for(limiter, self.threads, self.warmup);
        engines::run_for(limiter, self.threads, self.duration)
    }
}

/// Runs the sweep and prints the report.
pub fn run(args: Args, out: &mut Out<impl Write>) -> Result<(), String> {
    let max_threads = match args.threads {
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let counts = thread_counts(max_threads, args.every_count);
    let engines = dedup(&args.engines);
    let regimes = selected_regimes(&engines, args.regimes.as_deref())?;
    let left_out: Vec<_> = engines
        .iter()
        .filter(|e| !e.regimes().iter().any(|r| regimes.contains(r)))
        .map(|e| e.name())
        .collect();
    let csv_path = args.csv.unwrap_or_else(|| args.out.join("bench.csv"));
    let svg_path = args.svg.unwrap_or_else(|| args.out.join("bench.svg"));
    let csv_file = open_output(&csv_path)?;
    let svg_file = open_output(&svg_path)?;

    let warmup = warmup(args.duration);
    let plan = plan(&regimes, &counts, &engines);
    let total = plan.len() * args.rounds as usize;
    out.print(&format!(
        "tokengate bench: {} cells x {} round(s), {} each, about {} in all, on {}\n",
        plan.len(),
        args.rounds,
        show_duration(args.duration),
        show_duration(estimate(plan.len(), args.rounds, args.duration)),
        machine()
    ))?;
    if !left_out.is_empty() {
        out.print(&format!(
            "left out: {} (no selected regime runs them)\n",
            left_out.join(", ")
        ))?;
    }

    engines::warm_clocks();
    let mut cells: Vec<Cell> = plan
        .iter()
        .map(|&(regime, threads, engine)| Cell {
            regime,
            engine,
            threads,
            samples: Vec::new(),
        })
        .collect();
    let progress = Progress::new();
    let started = Instant::now();
    let mut done = 0;
    // Rounds outermost, engines innermost: a burst of noise from the rest of the machine
    // hits every engine of a cell alike, and the median drops it.
    for round in 1..=args.rounds {
        for cell in &mut cells {
            done += 1;
            progress.show(&format!(
                "[{done:>3}/{total}] round {round}/{}: {}, {} thread(s), {}",
                args.rounds,
                cell.regime.name(),
                cell.threads,
                cell.engine.label()
            ));
            let measure = Measure {
                threads: cell.threads,
                warmup,
                duration: args.duration,
            };
            cell.samples.push(cell.engine.visit(cell.regime, &measure)?);
        }
    }
    progress.clear();

    out.print(&table(&cells, &regimes, &engines, &counts))?;
    out.print(&summary(&cells, &regimes, &engines, &counts))?;
    write_output(
        csv_file,
        &csv_path,
        &csv(&cells, args.rounds, args.duration),
    )?;
    let chart = draw(&cells, &regimes, &engines, max_threads)?;
    write_output(svg_file, &svg_path, &chart)?;
    out.print(&format!(
        "\nFinished in {}. Wrote {} and {}.\n",
        show_duration(started.elapsed()),
        csv_path.display(),
        svg_path.display()
    ))
}

fn dedup<T: PartialEq + Copy>(items: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn find(cells: &[Cell], regime: Regime, engine: Engine, threads: usize) -> Option<&Cell> {
    cells
        .iter()
        .find(|c| c.regime == regime && c.engine == engine && c.threads == threads)
}

fn ratio(cells: &[Cell], cell: &Cell) -> Option<f64> {
    find(cells, cell.regime, cell.regime.baseline(), cell.threads)
        .map(|b| cell.median() / b.median())
}

/// "1 thread", "4 threads".
fn threads_label(t: usize) -> String {
    if t == 1 {
        "1 thread".to_string()
    } else {
        format!("{t} threads")
    }
}

fn table(cells: &[Cell], regimes: &[Regime], engines: &[Engine], counts: &[usize]) -> String {
    let mut out = String::new();
    // One label column for every regime, as wide as the longest label shown.
    let width = engines
        .iter()
        .filter(|e| e.regimes().iter().any(|r| regimes.contains(r)))
        .map(|e| e.label().len())
        .chain(["engine".len()])
        .max()
        .unwrap_or(0);
    for &regime in regimes {
        let shown: Vec<Engine> = engines
            .iter()
            .copied()
            .filter(|e| e.regimes().contains(&regime))
            .collect();
        let _ = writeln!(out, "\n{}", regime.describe());
        let _ = writeln!(
            out,
            "  millions of decisions per second, all threads together (x = ratio to {})",
            regime.baseline().label()
        );
        let mut header = format!("  {:<width$}", "engine");
        for &t in counts {
            let _ = write!(header, "{:>18}", threads_label(t));
        }
        let _ = writeln!(out, "{header}");
        for engine in shown {
            let mut line = format!("  {:<width$}", engine.label());
            for &t in counts {
                let Some(cell) = find(cells, regime, engine, t) else {
                    continue;
                };
                let r = ratio(cells, cell).map_or("     ".to_string(), |r| format!("{r:>4.2}x"));
                let _ = write!(line, "{:>11.2} {r:>6}", cell.median());
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out
}

/// The plain-language summary: per regime, each engine against the baseline at 1 thread,
/// 2 threads and the largest count, then each engine's scaling (its throughput at 2 and
/// at the largest count over its own 1-thread throughput).
fn summary(cells: &[Cell], regimes: &[Regime], engines: &[Engine], counts: &[usize]) -> String {
    let mut out = String::from("\nSummary (higher is better; medians of the rounds)\n");
    let max = counts.iter().copied().max().unwrap_or(1);
    let shown = dedup(&[1, 2, max].map(|t| t.min(max)));
    for &regime in regimes {
        let baseline = regime.baseline();
        let in_regime = || engines.iter().filter(|e| e.regimes().contains(&regime));
        for &t in &shown {
            let Some(base) = find(cells, regime, baseline, t) else {
                continue;
            };
            for &engine in in_regime().filter(|&&e| e != baseline && e != Engine::Mutex) {
                let Some(cell) = find(cells, regime, engine, t) else {
                    continue;
                };
                let _ = writeln!(
                    out,
                    "  {:<7} {}: {} makes {:.2}x the decisions of {} ({:.1} vs {:.1} M/s)",
                    regime.name(),
                    threads_label(t),
                    engine.label(),
                    cell.median() / base.median(),
                    baseline.label(),
                    cell.median(),
                    base.median()
                );
            }
        }
        for &engine in in_regime() {
            let Some(one) = find(cells, regime, engine, 1) else {
                continue;
            };
            let scaling: Vec<String> = shown
                .iter()
                .filter(|&&t| t > 1)
                .filter_map(|&t| find(cells, regime, engine, t))
                .map(|c| {
                    format!(
                        "{:.2}x at {}",
                        c.median() / one.median(),
                        threads_label(c.threads)
                    )
                })
                .collect();
            if !scaling.is_empty() {
                let _ = writeln!(
                    out,
                    "  {:<7} scaling over 1 thread: {} {}",
                    regime.name(),
                    engine.label(),
                    scaling.join(", ")
                );
            }
        }
    }
    out.push_str(
        "  Each figure is aggregate admission decisions per second on ONE shared limiter.\n  \
         Admit-heavy cells measure the write path under contention; reject-heavy cells the\n  \
         read-only path that an overloaded limiter lives on. Numbers vary with other load on\n  \
         the machine: rerun with --rounds 5 --duration 1s for steadier medians.\n",
    );
    out
}

/// The CSV report, one row per cell.
fn csv(cells: &[Cell], rounds: u32, duration: Duration) -> String {
    let mut out = String::from(
        "regime,engine,threads,mops_median,mops_min,mops_max,ratio_to_baseline,baseline,admitted_fraction,rounds,duration_ms\n",
    );
    for cell in cells {
        let v = cell.sorted_mops();
        let _ = writeln!(
            out,
            "{},{},{},{:.4},{:.4},{:.4},{},{},{:.6},{rounds},{}",
            cell.regime.name(),
            cell.engine.name(),
            cell.threads,
            cell.median(),
            v.first().copied().unwrap_or(0.0),
            v.last().copied().unwrap_or(0.0),
            ratio(cells, cell).map_or(String::new(), |r| format!("{r:.4}")),
            cell.regime.baseline().name(),
            cell.admitted_fraction(),
            duration.as_millis()
        );
    }
    out
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The SVG chart: one panel per regime, one line per engine.
fn draw(
    cells: &[Cell],
    regimes: &[Regime],
    engines: &[Engine],
    max_threads: usize,
) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot draw the chart: {e}");
    let width = 520 * regimes.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let panels = root.split_evenly((1, regimes.len()));
        for (panel, &regime) in panels.iter().zip(regimes) {
            let top = cells
                .iter()
                .filter(|c| c.regime == regime)
                .map(Cell::median)
                .fold(0.0, f64::max)
                * 1.6; // headroom for the legend above the lines
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("{} regime", regime.name()), ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(52)
                .build_cartesian_2d(0.5f64..max_threads as f64 + 0.5, 0.0..top.max(1.0))
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("threads")
                .y_desc("million decisions / s")
                .x_labels(max_threads.min(16))
                .x_label_formatter(&|x| format!("{x:.0}"))
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            for (i, &engine) in engines.iter().enumerate() {
                let points: Vec<(f64, f64)> = cells
                    .iter()
                    .filter(|c| c.regime == regime && c.engine == engine)
                    .map(|c| (c.threads as f64, c.median()))
                    .collect();
                if points.is_empty() {
                    continue;
                }
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(engine.label())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK.mix(0.3))
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// The CPU model and core count, for the report header.
pub fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model}, {cores} cores")
}

/// A progress line on stderr, overwritten in place; silent when stderr is not a terminal.
struct Progress {
    on: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
        }
    }

    fn show(&self, line: &str) {
        if self.on {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        }
    }

    fn clear(&self) {
        if self.on {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(regime: Regime, engine: Engine, threads: usize, mops: &[f64]) -> Cell {
        Cell {
            regime,
            engine,
            threads,
            samples: mops
                .iter()
                .map(|&m| Sample {
                    decisions: (m * 1e6) as u64,
                    admitted: 0,
                    elapsed: Duration::from_secs(1),
                })
                .collect(),
        }
    }

    #[test]
    fn median_of_rounds_drops_the_outlier() {
        let c = cell(Regime::Admit, Engine::Tokengate, 1, &[50.0, 2.0, 48.0]);
        assert!((c.median() - 48.0).abs() < 1e-9);
        let c = cell(Regime::Admit, Engine::Tokengate, 1, &[10.0, 20.0]);
        assert!((c.median() - 15.0).abs() < 1e-9);
    }

    #[test]
    fn ratio_is_taken_against_governor_at_the_same_thread_count() {
        let cells = vec![
            cell(Regime::Admit, Engine::Tokengate, 2, &[60.0]),
            cell(Regime::Admit, Engine::Governor, 1, &[10.0]),
            cell(Regime::Admit, Engine::Governor, 2, &[30.0]),
        ];
        assert!((ratio(&cells, &cells[0]).unwrap() - 2.0).abs() < 1e-9);
        let alone = vec![cell(Regime::Reject, Engine::Mutex, 1, &[5.0])];
        assert_eq!(ratio(&alone, &alone[0]), None);
    }

    #[test]
    fn csv_and_svg_are_written() {
        let cells = vec![
            cell(Regime::Admit, Engine::Tokengate, 1, &[40.0, 42.0, 41.0]),
            cell(Regime::Admit, Engine::Governor, 1, &[20.0, 21.0, 22.0]),
        ];
        let text = csv(&cells, 3, Duration::from_millis(200));
        let row = text.lines().nth(1).unwrap();
        assert!(
            row.starts_with("admit,tokengate,1,41.0000,40.0000,42.0000,1.9524,governor,"),
            "{row}"
        );
        let svg = draw(
            &cells,
            &[Regime::Admit],
            &[Engine::Tokengate, Engine::Governor],
            1,
        )
        .unwrap();
        assert!(svg.contains("<svg") && svg.contains("tokengate (TSC clock)"));
    }

    #[derive(Debug, clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(extra);
        <Wrap as clap::Parser>::try_parse_from(argv).map(|w| w.args)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tokengate-bench-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regime_asked_for_without_a_selected_engine_is_refused() {
        let mut args = parse(&["--threads", "1", "--engines", "tokengate"]).unwrap();
        args.regimes = Some(vec![Regime::Keyed]);
        let mut out = Out::new(Vec::new());
        let err = run(args, &mut out).unwrap_err();
        assert!(
            err.contains("keyed") && err.contains("governor-keyed"),
            "{err}"
        );
    }

    #[test]
    fn regimes_default_to_those_the_selected_engines_run_in() {
        let direct = [Engine::Tokengate, Engine::Governor];
        assert_eq!(
            selected_regimes(&direct, None),
            Ok(vec![Regime::Admit, Regime::Reject])
        );
        assert_eq!(
            selected_regimes(&[Engine::GovernorKeyed], None),
            Ok(vec![Regime::Keyed])
        );
        assert_eq!(
            selected_regimes(&Engine::ALL, None),
            Ok(Regime::ALL.to_vec())
        );
        assert_eq!(
            selected_regimes(&direct, Some(&[Regime::Reject, Regime::Reject])),
            Ok(vec![Regime::Reject])
        );
        assert!(selected_regimes(&direct, Some(&[Regime::Admit, Regime::Keyed])).is_err());
    }

    #[test]
    fn thread_counts_are_powers_of_two_and_n_or_every_count() {
        assert_eq!(thread_counts(1, false), [1]);
        assert_eq!(thread_counts(2, false), [1, 2]);
        assert_eq!(thread_counts(6, false), [1, 2, 4, 6]);
        assert_eq!(thread_counts(16, false), [1, 2, 4, 8, 16]);
        assert_eq!(thread_counts(64, false), [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(thread_counts(3, true), [1, 2, 3]);
        assert_eq!(thread_counts(1024, true).len(), 1024);
    }

    #[test]
    fn default_sweep_takes_well_under_a_minute_up_to_sixty_four_cores() {
        let args = parse(&[]).unwrap();
        let engines = dedup(&args.engines);
        let regimes = selected_regimes(&engines, args.regimes.as_deref()).unwrap();
        for (cores, most) in [(2, 12), (16, 30), (64, 45)] {
            let cells = plan(&regimes, &thread_counts(cores, false), &engines).len();
            let time = estimate(cells, args.rounds, args.duration);
            assert!(
                time <= Duration::from_secs(most),
                "{cores} cores: {cells} cells, {time:?}"
            );
        }
        // Every count on 16 cores is what --every-count is for: several times longer.
        let every = plan(&regimes, &thread_counts(16, true), &engines).len();
        assert!(estimate(every, args.rounds, args.duration) > Duration::from_secs(60));
    }

    #[test]
    fn numeric_options_take_negative_values_to_their_range_check() {
        for (argv, range) in [
            (&["--threads", "-1"][..], "from 1 to 1024, got -1"),
            (&["--rounds", "-2"], "from 1 to 100, got -2"),
            (&["--duration", "-1s"], "must be greater than zero"),
            (&["--duration", "1000000000m"], "from 1 ms to 60 s"),
            (&["--duration", "500us"], "from 1 ms to 60 s"),
            (&["--threads", "1025"], "from 1 to 1024"),
        ] {
            let err = parse(argv).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{argv:?}"
            );
            assert!(err.to_string().contains(range), "{argv:?}: {err}");
        }
        let args = parse(&["--threads", "8", "--duration", "1m", "--every-count"]).unwrap();
        assert_eq!(
            (args.threads, args.duration, args.every_count),
            (Some(8), Duration::from_secs(60), true)
        );
    }

    #[test]
    fn a_bad_output_path_is_refused_before_the_sweep() {
        let dir = scratch("paths");
        let file = dir.join("plain-file");
        std::fs::write(&file, "").unwrap();
        let under_a_file = file.join("bench.csv");
        let mut args = parse(&["--threads", "1", "--duration", "1m", "--rounds", "100"]).unwrap();
        args.csv = Some(under_a_file.clone());
        args.svg = Some(dir.join("bench.svg"));
        let mut out = Out::new(Vec::new());
        let err = run(args, &mut out).unwrap_err();
        assert!(err.contains("cannot create directory"), "{err}");
        // Nothing was printed: the sweep (and its estimate line) never started.
        assert!(out.sink.is_empty());
        let mut args = parse(&["--threads", "1", "--duration", "1m", "--rounds", "100"]).unwrap();
        args.csv = Some(dir.clone());
        let err = run(args, &mut out).unwrap_err();
        assert!(err.contains("for writing"), "{err}");
        assert!(out.sink.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn table_column_fits_the_longest_engine_label() {
        let engines = [Engine::LeasedCoarse, Engine::Governor, Engine::Mutex];
        let cells: Vec<Cell> = engines
            .iter()
            .flat_map(|&e| [1, 2].map(|t| cell(Regime::Admit, e, t, &[12.5])))
            .collect();
        let text = table(&cells, &[Regime::Admit], &engines, &[1, 2]);
        let lines: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(lines.len(), 1 + engines.len(), "{text}");
        let header = lines[0];
        assert!(header.starts_with("  engine "), "{text}");
        for line in &lines[1..] {
            // Every row ends where the header does: its figures sit under the headings.
            assert_eq!(line.len(), header.len(), "{text}");
        }
        assert!(lines[1].starts_with("  tokengate leased (coarse clock) "));
        // The keyed regime's table lines up with the others.
        let keyed = cell(Regime::Keyed, Engine::GovernorKeyed, 1, &[10.0]);
        let both = [Engine::LeasedCoarse, Engine::GovernorKeyed];
        let text = table(
            &[keyed, cell(Regime::Admit, Engine::LeasedCoarse, 1, &[1.0])],
            &[Regime::Admit, Regime::Keyed],
            &both,
            &[1],
        );
        let headers: Vec<usize> = text
            .lines()
            .filter(|l| l.starts_with("  engine "))
            .map(str::len)
            .collect();
        assert_eq!(headers.len(), 2, "{text}");
        assert_eq!(headers[0], headers[1], "{text}");
    }

    #[test]
    fn summary_gives_one_two_and_n_threads_and_every_engines_scaling() {
        let engines = [Engine::Tokengate, Engine::Leased, Engine::Governor];
        let mut cells = Vec::new();
        for (i, &e) in engines.iter().enumerate() {
            for t in [1, 2, 4, 8] {
                let mops = 10.0 * t as f64 * (i + 1) as f64;
                cells.push(cell(Regime::Admit, e, t, &[mops]));
            }
        }
        let text = summary(&cells, &[Regime::Admit], &engines, &[1, 2, 4, 8]);
        for line in [
            "admit   1 thread: tokengate leased (TSC clock) makes 0.67x the decisions of governor check() (20.0 vs 30.0 M/s)",
            "admit   2 threads: tokengate (TSC clock) makes 0.33x",
            "admit   8 threads: tokengate leased (TSC clock) makes 0.67x",
            "admit   scaling over 1 thread: tokengate (TSC clock) 2.00x at 2 threads, 8.00x at 8 threads\n",
            "admit   scaling over 1 thread: tokengate leased (TSC clock) 2.00x at 2 threads, 8.00x",
            "admit   scaling over 1 thread: governor check() 2.00x",
        ] {
            assert!(text.contains(line), "missing `{line}` in\n{text}");
        }
        assert!(!text.contains("4 threads"), "{text}");
    }
}
