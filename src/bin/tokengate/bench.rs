//! `tokengate bench`: sweeps thread counts, regimes and engines; prints millions of
//! decisions per second and the ratio to governor; writes CSV and an SVG chart.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use clap::builder::PossibleValue;
use plotters::prelude::*;

use crate::engines::{self, Engine, Limiter, Regime, Sample, Visit};
use crate::{create_parent, default_output, parse_duration, show_duration};

/// Options of `tokengate bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Largest thread count: every count from 1 to N is measured. Default: every core
    /// of this machine. Also read from TOKENGATE_THREADS.
    #[arg(long, short = 't', value_name = "N", env = "TOKENGATE_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,

    /// Measured time per cell (one engine, one regime, one thread count, one round),
    /// with a unit: ns, us, ms, s or m. Each cell also runs a short unmeasured warm-up
    /// (a fifth of this, at most 50 ms).
    #[arg(long, short = 'd', value_name = "DURATION", default_value = "200ms",
          value_parser = parse_duration)]
    duration: Duration,

    /// Rounds over the whole sweep; each cell reports the median round. More rounds
    /// smooth out a busy machine.
    #[arg(long, short = 'r', value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,

    /// Engines to compare, comma-separated.
    #[arg(
        long,
        short = 'e',
        value_name = "ENGINE",
        value_delimiter = ',',
        default_value = "tokengate,tokengate-coarse,tokengate-leased,tokengate-leased-coarse,governor,mutex,tokengate-keyed,governor-keyed"
    )]
    engines: Vec<Engine>,

    /// Regimes to run, comma-separated. admit: B = 1e6, r = 1e9 tokens/s (every request
    /// admitted); reject: B = 1, r = 1 token/s (every request rejected); keyed: B = 100,
    /// r = 1000 tokens/s per key over 100,000 random keys (keyed engines only).
    #[arg(
        long,
        value_name = "REGIME",
        value_delimiter = ',',
        default_value = "admit,reject,keyed"
    )]
    regimes: Vec<Regime>,

    /// CSV output: one row per regime, engine and thread count (median, min and max in
    /// millions of decisions per second, and the ratio to governor). Default:
    /// target/tokengate-bench/bench.csv.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,

    /// SVG chart of throughput against threads, one line per engine, one panel per
    /// regime. Default: target/tokengate-bench/bench.svg.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
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
pub fn run(args: Args) -> Result<(), String> {
    let max_threads = match args.threads {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let engines = dedup(&args.engines);
    let regimes = dedup(&args.regimes);
    for &regime in &regimes {
        if !engines.iter().any(|e| e.regimes().contains(&regime)) {
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
    }
    let csv_path = args.csv.unwrap_or_else(|| default_output("bench.csv"));
    let svg_path = args.svg.unwrap_or_else(|| default_output("bench.svg"));
    create_parent(&csv_path)?;
    create_parent(&svg_path)?;

    let warmup = (args.duration / 5).min(Duration::from_millis(50));
    let plan: Vec<(Regime, usize, Engine)> = regimes
        .iter()
        .flat_map(|&r| (1..=max_threads).map(move |t| (r, t)))
        .flat_map(|(r, t)| {
            engines
                .iter()
                .filter(move |e| e.regimes().contains(&r))
                .map(move |&e| (r, t, e))
        })
        .collect();
    let total = plan.len() * args.rounds as usize;
    let estimate = (args.duration + warmup) * total as u32;
    println!(
        "tokengate bench: {} cells x {} round(s), {} each, about {} in all, on {}",
        plan.len(),
        args.rounds,
        show_duration(args.duration),
        show_duration(estimate),
        machine()
    );

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

    print!("{}", table(&cells, &regimes, &engines, max_threads));
    print!("{}", summary(&cells, &regimes, max_threads));
    write_csv(&csv_path, &cells, args.rounds, args.duration)?;
    draw(&svg_path, &cells, &regimes, &engines, max_threads)?;
    println!(
        "\nFinished in {}. Wrote {} and {}.",
        show_duration(started.elapsed()),
        csv_path.display(),
        svg_path.display()
    );
    Ok(())
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

fn table(cells: &[Cell], regimes: &[Regime], engines: &[Engine], max_threads: usize) -> String {
    let mut out = String::new();
    for &regime in regimes {
        let _ = writeln!(out, "\n{}", regime.describe());
        let _ = writeln!(
            out,
            "  millions of decisions per second, all threads together (x = ratio to {})",
            regime.baseline().label()
        );
        let mut header = format!("  {:<26}", "engine");
        for t in 1..=max_threads {
            let label = if t == 1 {
                "1 thread".to_string()
            } else {
                format!("{t} threads")
            };
            let _ = write!(header, "{label:>18}");
        }
        let _ = writeln!(out, "{header}");
        for &engine in engines.iter().filter(|e| e.regimes().contains(&regime)) {
            let mut line = format!("  {:<26}", engine.label());
            for t in 1..=max_threads {
                let Some(cell) = find(cells, regime, engine, t) else {
                    continue;
                };
                let r = ratio(cells, cell).map_or("     ".to_string(), |r| format!("{r:>4.2}x"));
                let _ = write!(line, "{:>11.2} {r:>6}", cell.median());
            }
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

fn summary(cells: &[Cell], regimes: &[Regime], max_threads: usize) -> String {
    let mut out = String::from("\nSummary (higher is better; medians of the rounds)\n");
    for &regime in regimes {
        let baseline = regime.baseline();
        for t in [1, max_threads] {
            let Some(base) = find(cells, regime, baseline, t) else {
                continue;
            };
            for cell in cells.iter().filter(|c| {
                c.regime == regime
                    && c.threads == t
                    && c.engine != baseline
                    && c.engine != Engine::Mutex
            }) {
                let _ = writeln!(
                    out,
                    "  {:<7} {t} thread(s): {} makes {:.2}x the decisions of {} ({:.1} vs {:.1} M/s)",
                    regime.name(),
                    cell.engine.label(),
                    cell.median() / base.median(),
                    baseline.label(),
                    cell.median(),
                    base.median()
                );
            }
            if t == max_threads {
                break;
            }
        }
        if max_threads > 1 {
            for cell in cells
                .iter()
                .filter(|c| c.regime == regime && c.threads == max_threads)
            {
                if let Some(one) = find(cells, regime, cell.engine, 1) {
                    if matches!(cell.engine, Engine::Tokengate | Engine::TokengateKeyed)
                        || cell.engine == baseline
                    {
                        let _ = writeln!(
                            out,
                            "  {:<7} scaling: {} at {max_threads} threads = {:.2}x its 1-thread throughput",
                            regime.name(),
                            cell.engine.label(),
                            cell.median() / one.median()
                        );
                    }
                }
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

fn write_csv(path: &Path, cells: &[Cell], rounds: u32, duration: Duration) -> Result<(), String> {
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
    std::fs::write(path, out).map_err(|e| format!("cannot write {}: {e}", path.display()))
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

fn draw(
    path: &Path,
    cells: &[Cell],
    regimes: &[Regime],
    engines: &[Engine],
    max_threads: usize,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    let width = 520 * regimes.len() as u32;
    let root = SVGBackend::new(path, (width, 400)).into_drawing_area();
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
            let points: Vec<(f64, f64)> = (1..=max_threads)
                .filter_map(|t| find(cells, regime, engine, t).map(|c| (t as f64, c.median())))
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
    root.present().map_err(|e| err(&e))
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
        let dir = std::env::temp_dir().join(format!("tokengate-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cells = vec![
            cell(Regime::Admit, Engine::Tokengate, 1, &[40.0, 42.0, 41.0]),
            cell(Regime::Admit, Engine::Governor, 1, &[20.0, 21.0, 22.0]),
        ];
        let (csv, svg) = (dir.join("b.csv"), dir.join("b.svg"));
        write_csv(&csv, &cells, 3, Duration::from_millis(200)).unwrap();
        draw(
            &svg,
            &cells,
            &[Regime::Admit],
            &[Engine::Tokengate, Engine::Governor],
            1,
        )
        .unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        let row = text.lines().nth(1).unwrap();
        assert!(
            row.starts_with("admit,tokengate,1,41.0000,40.0000,42.0000,1.9524,governor,"),
            "{row}"
        );
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(svg.contains("<svg") && svg.contains("tokengate (TSC clock)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_regime_without_a_selected_engine_is_refused() {
        let args = Args {
            threads: Some(1),
            duration: Duration::from_millis(1),
            rounds: 1,
            engines: vec![Engine::Tokengate],
            regimes: vec![Regime::Keyed],
            csv: None,
            svg: None,
        };
        let err = run(args).unwrap_err();
        assert!(
            err.contains("keyed") && err.contains("governor-keyed"),
            "{err}"
        );
    }
}
