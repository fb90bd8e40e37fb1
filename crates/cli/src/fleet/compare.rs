//! `tokengate fleet --compare-chart`: rate leases, token leases and a per-request Lua
//! bucket side by side, K instances (threads, each with its own pool and connection) on
//! one budget that binds, swept over K and the offered request rate; and the same three
//! under skewed and shifting demand. Prints a table per run and writes an SVG chart of
//! round trips per instance per second and efficiency against the offered rate.
//!
//! Every admission is logged as [wall clock before, after] and checked by the ideal
//! bucket of the Redis tests (`tokengate_redis::ideal`, the same module): the
//! worst window of 10 ms, 100 ms, 1 s and 5 s against `B + r*w`.

use std::io::Write;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use tokengate_redis::{
    FailMode, PoolConfig, RateConfig, RatePool, RedisPool, RedisScopes, RemotePolicy, StrictScope,
};

use crate::Out;

use tokengate_redis::ideal;

/// How the fleet shares the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Rate,
    Token,
    PerRequest,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Rate => "rate leases",
            Mode::Token => "token leases",
            Mode::PerRequest => "per-request Lua",
        }
    }
}

/// Who offers what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Demand {
    /// Every instance offers `offer * r / K`.
    Equal,
    /// Instance i offers in proportion to 1/(i+1) (Zipf), `offer * r` in all.
    Skewed,
    /// One hot instance offers `offer * r`, the others `r / (4K)` each; the hot spot
    /// moves to the next instance every quarter of the run.
    Shifting,
}

/// The settings of one run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Setup {
    pub(super) k: usize,
    pub(super) capacity: u64,
    pub(super) rate: u64,
    pub(super) offer: f64,
    pub(super) ttl: Duration,
    pub(super) seconds: f64,
    pub(super) warmup: f64,
    pub(super) demand: Demand,
    pub(super) mode: Mode,
}

/// What one run measured, over the measured window.
#[derive(Clone, Debug)]
pub(super) struct Measured {
    pub(super) setup: Setup,
    pub(super) admitted: u64,
    pub(super) rt_per_instance_s: f64,
    /// admitted / (B + r*T).
    pub(super) efficiency: f64,
    /// Jain's index of the instances' admissions (equal demand only).
    pub(super) jain: Option<f64>,
    /// The worst window: (admitted, bound, window ms) of the largest admitted/bound.
    pub(super) worst: (u64, u64, u64),
    /// Shifting demand: after each move, ms until a 100 ms bin admits >= 95% of r*100ms.
    pub(super) recovery_ms: Vec<u64>,
}

fn offered_per_s(s: &Setup, i: usize, t: f64) -> f64 {
    let r = s.rate as f64;
    let k = s.k as f64;
    match s.demand {
        Demand::Equal => s.offer * r / k,
        Demand::Skewed => {
            let h: f64 = (1..=s.k).map(|j| 1.0 / j as f64).sum();
            s.offer * r / (i as f64 + 1.0) / h
        }
        Demand::Shifting => {
            let quarter = s.seconds / 4.0;
            let hot = if t < 0.0 {
                0
            } else {
                ((t / quarter) as usize).min(3) % s.k
            };
            if i == hot { s.offer * r } else { r / (4.0 * k) }
        }
    }
}

/// When (seconds from the measured window's start) after `t` the offered rates next
/// change: the hot spot's next move, or `None`.
fn next_change(s: &Setup, t: f64) -> Option<f64> {
    let quarter = s.seconds / 4.0;
    (s.demand == Demand::Shifting && t < 3.0 * quarter)
        .then(|| {
            if t < 0.0 {
                0.0
            } else {
                ((t / quarter).floor() + 1.0) * quarter
            }
        })
        .map(|c| c.max(t))
}

/// One instance's admissions (wall ns before, after) and its round trips when the
/// measured window began and at the end.
type InstanceRun = (Vec<(u64, u64)>, u64, u64);

enum Decider {
    Rate(RatePool, tokengate_redis::RateBucket),
    Token(RedisPool, tokengate_redis::RemoteBucket),
    /// The strict per-request mode: one script per decision; its calls counted.
    PerRequest(Box<RedisScopes>, StrictScope, u64),
}

impl Decider {
    fn decide(&mut self) -> bool {
        match self {
            Decider::Rate(_, b) => b.try_acquire(1).is_ok(),
            Decider::Token(_, b) => b.try_acquire(1).is_ok(),
            Decider::PerRequest(scopes, scope, calls) => {
                *calls += 1;
                scopes
                    .try_acquire("fleet", &[(&*scope, "global", 1)])
                    .is_ok()
            }
        }
    }

    fn round_trips(&self) -> u64 {
        match self {
            Decider::Rate(p, _) => p.round_trips(),
            Decider::Token(p, _) => p.round_trips(),
            Decider::PerRequest(.., calls) => *calls,
        }
    }
}

fn connect(url: &str, ns: &str, s: &Setup, policy: RemotePolicy) -> Result<Decider, String> {
    let config = PoolConfig::new(url, ns)
        .lease_ttl(s.ttl)
        .grace(Duration::from_millis(50))
        .fail_mode(FailMode::FailClosed)
        .instances(s.k as u64)
        // A busy two-core machine with 64 instances: no run aborted by a slow reply.
        .exchange_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2));
    Ok(match s.mode {
        Mode::Rate => {
            let pool = RatePool::connect(
                RateConfig::new(config)
                    .refresh_divisor(4)
                    .min_share_divisor(16 * s.k as u64),
            )
            .map_err(|e| e.to_string())?;
            let b = pool.bucket("global", policy).map_err(|e| e.to_string())?;
            Decider::Rate(pool, b)
        }
        Mode::Token => {
            let pool = RedisPool::connect(config).map_err(|e| e.to_string())?;
            let b = pool.bucket("global", policy).map_err(|e| e.to_string())?;
            Decider::Token(pool, b)
        }
        Mode::PerRequest => {
            let scopes = RedisScopes::connect(config).map_err(|e| e.to_string())?;
            let scope = scopes.scope("global", policy).map_err(|e| e.to_string())?;
            Decider::PerRequest(Box::new(scopes), scope, 0)
        }
    })
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One run: K threads, each its own pool, driven at their offered rates for warm-up plus
/// the measured window.
pub(super) fn run_one(url: &str, s: Setup) -> Result<Measured, String> {
    let policy = RemotePolicy::new(s.capacity, s.rate as f64).map_err(|e| e.to_string())?;
    let nanos = wall_ns();
    let ns = format!("cmp-{}-{nanos}", std::process::id());
    let deciders: Vec<Decider> = (0..s.k)
        .map(|_| connect(url, &ns, &s, policy))
        .collect::<Result<_, _>>()?;
    let barrier = Barrier::new(s.k);
    let begin = Instant::now() + Duration::from_millis(200);
    let measure_from = begin + Duration::from_secs_f64(s.warmup);
    let end = measure_from + Duration::from_secs_f64(s.seconds);
    let wall_at_measure = wall_ns() + (measure_from - Instant::now()).as_nanos() as u64;
    let results: Vec<InstanceRun> = std::thread::scope(|sc| {
        let handles: Vec<_> = deciders
            .into_iter()
            .enumerate()
            .map(|(i, mut d)| {
                let barrier = &barrier;
                sc.spawn(move || {
                    barrier.wait();
                    let mut log = Vec::new();
                    let mut rt_at_measure = None;
                    // The last offer; the next is 1/rate after it at the rate offered now,
                    // re-read at every change of demand (the hot spot moving), so a change
                    // takes effect when it happens, not at the next offer the old rate had
                    // scheduled.
                    let mut last = begin;
                    loop {
                        let now = Instant::now();
                        if now >= end {
                            break;
                        }
                        if rt_at_measure.is_none() && now >= measure_from {
                            rt_at_measure = Some(d.round_trips());
                        }
                        let t = now.saturating_duration_since(measure_from).as_secs_f64()
                            - measure_from.saturating_duration_since(now).as_secs_f64();
                        let per_s = offered_per_s(&s, i, t);
                        if per_s <= 0.0 {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        let next = last + Duration::from_secs_f64(1.0 / per_s);
                        if let Some(wait) = next.checked_duration_since(now) {
                            let change = next_change(&s, t)
                                .map_or(wait, |c| wait.min(Duration::from_secs_f64(c - t)));
                            std::thread::sleep(change);
                            if change < wait {
                                continue;
                            }
                        }
                        // Behind by more than 20 ms: no catching up in a burst.
                        last = next.max(now - Duration::from_millis(20).min(now - begin));
                        let before = wall_ns();
                        if d.decide() && Instant::now() >= measure_from {
                            log.push((before, wall_ns()));
                        }
                    }
                    let rt_end = d.round_trips();
                    (log, rt_at_measure.unwrap_or(rt_end), rt_end)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let per_instance: Vec<u64> = results
        .iter()
        .map(|r| r.0.iter().filter(|a| a.0 >= wall_at_measure).count() as u64)
        .collect();
    let mut all: Vec<(u64, u64)> = results
        .iter()
        .flat_map(|r| r.0.iter().copied())
        .filter(|a| a.0 >= wall_at_measure)
        .collect();
    all.sort_unstable();
    let admitted = all.len() as u64;
    let rts: u64 = results.iter().map(|r| r.2 - r.1).sum();
    let bound = s.capacity as f64 + s.rate as f64 * s.seconds;
    let worst = ideal::worst_windows(&all, s.capacity, s.rate * 1000, 0)
        .into_iter()
        .max_by(|a, b| {
            (a.admitted as f64 / a.bound as f64).total_cmp(&(b.admitted as f64 / b.bound as f64))
        })
        .map_or((0, 0, 0), |w| {
            (w.admitted, w.bound, w.window_ns / 1_000_000)
        });
    let jain = (s.demand == Demand::Equal).then(|| {
        let sum: f64 = per_instance.iter().map(|&x| x as f64).sum();
        let sq: f64 = per_instance.iter().map(|&x| (x as f64).powi(2)).sum();
        if sq == 0.0 {
            0.0
        } else {
            sum * sum / (s.k as f64 * sq)
        }
    });
    let mut recovery_ms = Vec::new();
    if s.demand == Demand::Shifting {
        let quarter_ns = (s.seconds / 4.0 * 1e9) as u64;
        let bin = 100_000_000u64;
        let want = (s.rate as f64 * 0.1 * 0.95) as usize;
        for q in 1..4u64 {
            let shift = wall_at_measure + q * quarter_ns;
            let mut t = shift;
            while t + bin <= shift + quarter_ns {
                let n = all.iter().filter(|a| a.0 >= t && a.0 < t + bin).count();
                if n >= want {
                    break;
                }
                t += 10_000_000;
            }
            recovery_ms.push((t - shift) / 1_000_000);
        }
    }
    Ok(Measured {
        setup: s,
        admitted,
        rt_per_instance_s: rts as f64 / s.k as f64 / s.seconds,
        efficiency: admitted as f64 / bound,
        jain,
        worst,
        recovery_ms,
    })
}

/// The table header and one row.
pub(super) const HEADER: &str = "| mode | K | demand | offered (x r) | admitted | efficiency | round trips / instance / s | Jain | worst window (admitted / bound) | recovery after a move (ms) |\n|---|---|---|---|---|---|---|---|---|---|\n";

pub(super) fn row(m: &Measured) -> String {
    let s = &m.setup;
    format!(
        "| {} | {} | {:?} | {} | {} | {:.1}% | {:.2} | {} | {} / {} ({} ms) | {} |\n",
        s.mode.name(),
        s.k,
        s.demand,
        s.offer,
        m.admitted,
        m.efficiency * 100.0,
        m.rt_per_instance_s,
        m.jain.map_or("-".to_owned(), |j| format!("{j:.3}")),
        m.worst.0,
        m.worst.1,
        m.worst.2,
        if m.recovery_ms.is_empty() {
            "-".to_owned()
        } else {
            format!("{:?}", m.recovery_ms)
        },
    )
}

/// The sweep: for each K, each offered rate, each mode (equal demand); then skewed and
/// shifting demand at the largest offer (the demands and modes named). Prints each row as it comes; returns them.
#[allow(clippy::too_many_arguments)]
pub(super) fn sweep(
    url: &str,
    ks: &[usize],
    offers: &[f64],
    (demands, modes): (&[Demand], &[Mode]),
    capacity: u64,
    rate: u64,
    ttl: Duration,
    seconds: f64,
    out: &mut Out<impl Write>,
) -> Result<Vec<Measured>, String> {
    out.print(&format!(
        "fleet comparison: B = {capacity}, r = {rate}/s, lease ttl {} ms (rate leases refresh every ttl/4), {seconds} s measured after 1 s of warm-up; instances are threads with their own pool and connection\n",
        ttl.as_millis()
    ))?;
    out.print(HEADER)?;
    let mut rows = Vec::new();
    let top = offers.iter().copied().fold(1.0, f64::max);
    for &k in ks {
        let mut runs: Vec<(Demand, f64)> = Vec::new();
        if demands.contains(&Demand::Equal) {
            runs.extend(offers.iter().map(|&o| (Demand::Equal, o)));
        }
        for d in [Demand::Skewed, Demand::Shifting] {
            if demands.contains(&d) {
                runs.push((d, top));
            }
        }
        for (demand, offer) in runs {
            for mode in [Mode::Rate, Mode::Token, Mode::PerRequest] {
                if !modes.contains(&mode) {
                    continue;
                }
                let m = run_one(
                    url,
                    Setup {
                        k,
                        capacity,
                        rate,
                        offer,
                        ttl,
                        seconds,
                        warmup: 1.0,
                        demand,
                        mode,
                    },
                )?;
                out.print(&row(&m))?;
                rows.push(m);
            }
        }
    }
    Ok(rows)
}

/// The chart: round trips per instance per second (log scale) and efficiency against the
/// offered rate, one line per mode and K (equal demand).
pub(super) fn draw(rows: &[Measured], title: &str) -> Result<String, String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("cannot draw the chart: {e}");
    let equal: Vec<&Measured> = rows
        .iter()
        .filter(|m| m.setup.demand == Demand::Equal)
        .collect();
    let max_x = equal.iter().map(|m| m.setup.offer).fold(1.0, f64::max) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 720)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(title, ("sans-serif", 18))
            .map_err(|e| err(&e))?;
        let (upper, lower) = root.split_vertically(350);
        let mut ks: Vec<usize> = equal.iter().map(|m| m.setup.k).collect();
        ks.sort_unstable();
        ks.dedup();
        let colors = |mode: Mode| match mode {
            Mode::Rate => RGBColor(0x1f, 0x77, 0xb4),
            Mode::Token => RGBColor(0xd6, 0x27, 0x28),
            Mode::PerRequest => RGBColor(0x7f, 0x7f, 0x7f),
        };
        let top_rt = equal
            .iter()
            .map(|m| m.rt_per_instance_s)
            .fold(1.0, f64::max)
            * 2.0;
        {
            let mut chart = ChartBuilder::on(&upper)
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..max_x, (0.1..top_rt).log_scale())
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("offered request rate (x r)")
                .y_desc("round trips / instance / s")
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            for mode in [Mode::Rate, Mode::Token, Mode::PerRequest] {
                for (n, &k) in ks.iter().enumerate() {
                    let pts: Vec<(f64, f64)> = equal
                        .iter()
                        .filter(|m| m.setup.mode == mode && m.setup.k == k)
                        .map(|m| (m.setup.offer, m.rt_per_instance_s.max(0.1)))
                        .collect();
                    let style = colors(mode).stroke_width(1 + n as u32);
                    chart
                        .draw_series(LineSeries::new(pts.clone(), style))
                        .map_err(|e| err(&e))?
                        .label(format!("{}, K = {k}", mode.name()))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&p| Circle::new(p, 3, colors(mode).filled())),
                        )
                        .map_err(|e| err(&e))?;
                }
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        {
            let mut chart = ChartBuilder::on(&lower)
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..max_x, 0.0..110.0)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("offered request rate (x r)")
                .y_desc("efficiency: admitted / (B + r*T), %")
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            for mode in [Mode::Rate, Mode::Token, Mode::PerRequest] {
                for (n, &k) in ks.iter().enumerate() {
                    let pts: Vec<(f64, f64)> = equal
                        .iter()
                        .filter(|m| m.setup.mode == mode && m.setup.k == k)
                        .map(|m| (m.setup.offer, m.efficiency * 100.0))
                        .collect();
                    chart
                        .draw_series(LineSeries::new(
                            pts.clone(),
                            colors(mode).stroke_width(1 + n as u32),
                        ))
                        .map_err(|e| err(&e))?;
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&p| Circle::new(p, 3, colors(mode).filled())),
                        )
                        .map_err(|e| err(&e))?;
                }
            }
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(mode: Mode, k: usize, offer: f64, rt: f64, eff: f64) -> Measured {
        Measured {
            setup: Setup {
                k,
                capacity: 100,
                rate: 1000,
                offer,
                ttl: Duration::from_secs(1),
                seconds: 8.0,
                warmup: 1.0,
                demand: Demand::Equal,
                mode,
            },
            admitted: (eff * 8100.0) as u64,
            rt_per_instance_s: rt,
            efficiency: eff,
            jain: Some(0.99),
            worst: (8000, 8100, 8000),
            recovery_ms: Vec::new(),
        }
    }

    #[test]
    fn the_chart_has_a_line_per_mode_and_k_and_the_row_its_figures() {
        let rows: Vec<Measured> = [Mode::Rate, Mode::Token, Mode::PerRequest]
            .into_iter()
            .flat_map(|m| {
                [8, 64].into_iter().flat_map(move |k| {
                    [1.5, 16.0]
                        .into_iter()
                        .map(move |o| measured(m, k, o, 4.0 * o, 0.98))
                })
            })
            .collect();
        let svg = draw(&rows, "test").unwrap();
        assert!(svg.contains("<svg"));
        for label in [
            "rate leases, K = 64",
            "token leases, K = 8",
            "per-request Lua, K = 64",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
        let line = row(&rows[0]);
        assert!(
            line.starts_with("| rate leases | 8 | Equal | 1.5 | 7938 | 98.0% | 6.00 | 0.990 | 8000 / 8100 (8000 ms) | - |"),
            "{line}"
        );
    }

    #[test]
    fn demand_patterns_offer_what_they_say() {
        let s = |demand| Setup {
            k: 4,
            capacity: 100,
            rate: 1000,
            offer: 2.0,
            ttl: Duration::from_secs(1),
            seconds: 8.0,
            warmup: 1.0,
            demand,
            mode: Mode::Rate,
        };
        let total = |st: &Setup, t: f64| (0..4).map(|i| offered_per_s(st, i, t)).sum::<f64>();
        assert!((total(&s(Demand::Equal), 1.0) - 2000.0).abs() < 1e-6);
        assert!((total(&s(Demand::Skewed), 1.0) - 2000.0).abs() < 1e-6);
        // The hot spot: instance 0 for the first quarter, then 1, 2, 3.
        let sh = s(Demand::Shifting);
        for (t, hot) in [(0.5, 0), (2.5, 1), (4.5, 2), (6.5, 3)] {
            assert_eq!(offered_per_s(&sh, hot, t), 2000.0);
            assert_eq!(offered_per_s(&sh, (hot + 1) % 4, t), 1000.0 / 16.0);
        }
        // Offers are rescheduled at each move (and only there).
        assert_eq!(next_change(&sh, -0.5), Some(0.0));
        assert_eq!(next_change(&sh, 0.5), Some(2.0));
        assert_eq!(next_change(&sh, 4.0), Some(6.0));
        assert_eq!(next_change(&sh, 6.5), None);
        assert_eq!(next_change(&s(Demand::Equal), 0.5), None);
    }
}
