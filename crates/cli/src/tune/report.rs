//! What the grid's replay says: the measures of every cell, the recommendation rule, the
//! summary table, the CSV file and the SVG heatmap.

use std::fmt::Write as _;
use std::time::Duration;

use clap::ValueEnum;
use plotters::prelude::*;

use super::grid::{Stats, delay_quantile};
use crate::show_number;

/// The measure the recommendation rule bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Objective {
    /// The share of requests rejected among keys whose volume is below the volume
    /// percentile's key (--volume-percentile, default p99): ordinary clients, not the
    /// heaviest ones the limit is there to hold back. When no key is below it (a single
    /// key, or all keys equally busy), every request counts.
    SmallKeys,
    /// The share of all requests rejected.
    Requests,
    /// The share of all tokens rejected.
    Tokens,
    /// The share of keys rejected at least once.
    Keys,
}

impl Objective {
    pub(crate) fn describe(self, percentile: f64) -> String {
        match self {
            Objective::SmallKeys => format!(
                "requests rejected from keys below the p{} key's volume",
                show_number(percentile)
            ),
            Objective::Requests => "requests rejected".into(),
            Objective::Tokens => "tokens rejected".into(),
            Objective::Keys => "keys rejected at least once".into(),
        }
    }
}

/// Which keys count as small, and the heaviest keys, from the volume of every key.
#[derive(Clone, Debug)]
pub(crate) struct Population {
    /// Requests of each key.
    volumes: Vec<u64>,
    /// Keys with fewer requests than this are small.
    pub(crate) threshold: u64,
    /// Whether key `k` counts toward the small-key measure.
    small: Vec<bool>,
    pub(crate) small_keys: usize,
    pub(crate) small_requests: u64,
    /// No key was below the threshold: the small-key measure counts every request.
    pub(crate) all_count: bool,
    /// The heaviest keys, heaviest first (ties: first seen first).
    pub(crate) heavy: Vec<u32>,
}

impl Population {
    /// `percentile` in (0, 100]; `top` heaviest keys kept.
    pub(crate) fn new(volumes: &[u64], percentile: f64, top: usize) -> Population {
        let mut sorted = volumes.to_vec();
        sorted.sort_unstable();
        let n = sorted.len();
        let rank = ((percentile / 100.0 * n as f64).ceil() as usize).clamp(1, n.max(1));
        let threshold = sorted.get(rank - 1).copied().unwrap_or(0);
        let mut small: Vec<bool> = volumes.iter().map(|&v| v < threshold).collect();
        let mut small_requests: u64 = volumes.iter().filter(|&&v| v < threshold).sum();
        let all_count = small_requests == 0;
        if all_count {
            small = vec![true; volumes.len()];
            small_requests = volumes.iter().sum();
        }
        let mut order: Vec<u32> = (0..volumes.len() as u32).collect();
        order.sort_by_key(|&k| std::cmp::Reverse(volumes[k as usize]));
        order.truncate(top);
        Population {
            volumes: volumes.to_vec(),
            threshold,
            small_keys: small.iter().filter(|&&s| s).count(),
            small,
            small_requests,
            all_count,
            heavy: order,
        }
    }
}

/// The measures of one cell.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Measures {
    pub(crate) requests: f64,
    pub(crate) tokens: f64,
    pub(crate) keys: f64,
    pub(crate) small_keys: f64,
    /// The rejection share of each heavy key, in [`Population::heavy`]'s order.
    pub(crate) heavy: Vec<f64>,
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

impl Measures {
    pub(crate) fn of(s: &Stats, p: &Population) -> Measures {
        let keys_rejected = s.rejected_by_key.iter().filter(|&&n| n > 0).count() as u64;
        let small_rejected: u64 = s
            .rejected_by_key
            .iter()
            .zip(&p.small)
            .filter(|(_, small)| **small)
            .map(|(n, _)| n)
            .sum();
        let heavy = p
            .heavy
            .iter()
            .map(|&k| {
                let rejected = s.rejected_by_key.get(k as usize).copied().unwrap_or(0);
                share(rejected, p.volumes[k as usize])
            })
            .collect();
        Measures {
            requests: share(s.rejected, s.requests),
            tokens: share(s.rejected_tokens, s.tokens),
            keys: share(keys_rejected, p.volumes.len() as u64),
            small_keys: share(small_rejected, p.small_requests),
            heavy,
        }
    }

    pub(crate) fn get(&self, objective: Objective) -> f64 {
        match objective {
            Objective::SmallKeys => self.small_keys,
            Objective::Requests => self.requests,
            Objective::Tokens => self.tokens,
            Objective::Keys => self.keys,
        }
    }
}

/// A cell of the grid: its policy, and what its replay measured or why it could not run.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) capacity: u64,
    pub(crate) rate: f64,
    pub(crate) result: Result<(Stats, Measures), String>,
}

/// The longest fill time `B / r` of a cell the log can judge, as a share of the log's
/// span. A bucket that takes longer to refill than that never shows its rate in the log:
/// its key's traffic fits in the burst, and any lower rate would have decided the same.
pub(crate) const MAX_FILL_SHARE: f64 = 0.5;

/// Whether the log, spanning `span_secs` seconds, can judge the cell `capacity`, `rate`:
/// its fill time `capacity / rate` is at most [`MAX_FILL_SHARE`] of the span.
pub(crate) fn judgeable(capacity: u64, rate: f64, span_secs: f64) -> bool {
    capacity as f64 / rate <= span_secs * MAX_FILL_SHARE
}

/// What the recommendation rule found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recommendation {
    /// The index of the recommended cell.
    Chosen(usize),
    /// No judgeable cell meets the objective; the nearest cells, by index.
    NoneMeets {
        /// The judgeable cell with the lowest share (then the smallest rate, then the
        /// smallest capacity), if any cell is judgeable.
        closest: Option<usize>,
        /// The cell meeting the objective with the shortest fill time, if one does: the
        /// log is too short to judge it.
        unjudged: Option<usize>,
    },
}

impl Recommendation {
    /// The recommended cell's index, if there is one.
    pub(crate) fn chosen(self) -> Option<usize> {
        match self {
            Recommendation::Chosen(i) => Some(i),
            Recommendation::NoneMeets { .. } => None,
        }
    }
}

/// The recommendation rule: among the cells the log can judge (see [`judgeable`]), the
/// smallest rate, then the smallest capacity, whose `objective` is at most `max_share`.
pub(crate) fn recommend(
    cells: &[Outcome],
    objective: Objective,
    max_share: f64,
    span_secs: f64,
) -> Recommendation {
    let mut best: Option<usize> = None;
    let mut closest: Option<(f64, usize)> = None;
    let mut unjudged: Option<(f64, usize)> = None;
    let key = |c: &Outcome| (c.rate, c.capacity);
    for (i, c) in cells.iter().enumerate() {
        let Ok((_, m)) = &c.result else { continue };
        let share = m.get(objective);
        if !judgeable(c.capacity, c.rate, span_secs) {
            let fill = c.capacity as f64 / c.rate;
            if share <= max_share && unjudged.is_none_or(|(f, _)| fill < f) {
                unjudged = Some((fill, i));
            }
            continue;
        }
        if closest.is_none_or(|(s, j)| share < s || (share == s && key(c) < key(&cells[j]))) {
            closest = Some((share, i));
        }
        if share > max_share {
            continue;
        }
        if best.is_none_or(|b| key(c) < key(&cells[b])) {
            best = Some(i);
        }
    }
    match best {
        Some(i) => Recommendation::Chosen(i),
        None => Recommendation::NoneMeets {
            closest: closest.map(|(_, i)| i),
            unjudged: unjudged.map(|(_, i)| i),
        },
    }
}

fn pct(v: f64) -> String {
    format!("{}%", show_number(v * 100.0))
}

fn ms(d: Option<Duration>) -> String {
    d.map_or(String::new(), |d| show_number(d.as_secs_f64() * 1e3))
}

/// The CSV of every cell.
pub(crate) fn csv(
    cells: &[Outcome],
    pop: &Population,
    max_wait: Option<Duration>,
    span_secs: f64,
) -> String {
    let mut out = String::from(
        "capacity,rate,fill_time_s,judgeable,requests,rejected,requests_rejected_share,tokens_rejected_share,\
         keys_rejected_share,small_keys_rejected_share,key_limit_rejections,\
         cost_above_capacity",
    );
    for i in 1..=pop.heavy.len() {
        let _ = write!(out, ",heavy{i}_rejected_share");
    }
    out.push_str(",delayed,delay_p50_ms,delay_p90_ms,delay_p99_ms,delay_max_ms,error\n");
    for c in cells {
        let _ = write!(
            out,
            "{},{},{},{}",
            c.capacity,
            c.rate,
            c.capacity as f64 / c.rate,
            judgeable(c.capacity, c.rate, span_secs)
        );
        match &c.result {
            Ok((s, m)) => {
                let _ = write!(
                    out,
                    ",{},{},{},{},{},{},{},{}",
                    s.requests,
                    s.rejected,
                    m.requests,
                    m.tokens,
                    m.keys,
                    m.small_keys,
                    s.key_limit,
                    s.too_costly
                );
                for h in &m.heavy {
                    let _ = write!(out, ",{h}");
                }
                match max_wait {
                    Some(w) => {
                        let q = |q| ms(delay_quantile(s, q, w));
                        let _ = write!(
                            out,
                            ",{},{},{},{},{},",
                            s.delayed,
                            q(0.5),
                            q(0.9),
                            q(0.99),
                            show_number(s.max_delay.as_secs_f64() * 1e3)
                        );
                    }
                    None => out.push_str(",,,,,,"),
                }
            }
            Err(e) => {
                out.push_str(&",".repeat(8 + pop.heavy.len() + 5));
                let _ = write!(out, ",\"{}\"", e.replace('"', "\"\""));
            }
        }
        out.push('\n');
    }
    out
}

/// The summary table: for each rate, the smallest capacity the log can judge that meets
/// the rule; else the smallest that meets it, marked as too slow to fill for the log to
/// judge; else the largest capacity, marked.
pub(crate) fn table(
    cells: &[Outcome],
    objective: Objective,
    max_share: f64,
    recommended: Option<usize>,
    span_secs: f64,
) -> String {
    let mut rates: Vec<f64> = cells.iter().map(|c| c.rate).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>10} {:>9} {:>10} {:>9} {:>9} {:>11}  heaviest keys rejected",
        "rate/s", "capacity", "requests", "tokens", "keys", "small keys"
    );
    for rate in rates {
        let row: Vec<(usize, &Outcome)> = cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.rate == rate && c.result.is_ok())
            .collect();
        let meets = |c: &Outcome| matches!(&c.result, Ok((_, m)) if m.get(objective) <= max_share);
        let pick = row
            .iter()
            .find(|(_, c)| meets(c) && judgeable(c.capacity, c.rate, span_secs))
            .or_else(|| row.iter().find(|(_, c)| meets(c)))
            .or(row.last());
        let Some(&(i, c)) = pick else {
            let _ = writeln!(
                out,
                "{:>10} {:>9}  no valid policy at this rate",
                show_number(rate),
                "-"
            );
            continue;
        };
        let Ok((_, m)) = &c.result else { continue };
        let meets = m.get(objective) <= max_share;
        let mark = if Some(i) == recommended {
            "  <- recommended"
        } else if !meets {
            "  (none meets the rule)"
        } else if !judgeable(c.capacity, c.rate, span_secs) {
            "  (fills in over half the log: not judged)"
        } else {
            ""
        };
        let heavy: Vec<String> = m.heavy.iter().map(|&h| pct(h)).collect();
        let _ = writeln!(
            out,
            "{:>10} {:>9} {:>10} {:>9} {:>9} {:>11}  {}{}",
            show_number(rate),
            c.capacity,
            pct(m.requests),
            pct(m.tokens),
            pct(m.keys),
            pct(m.small_keys),
            heavy.join(" "),
            mark
        );
    }
    out
}

/// The heatmap: the objective's share over capacity (x) and rate (y), log-colored, the
/// recommendation circled.
pub(crate) fn heatmap(
    cells: &[Outcome],
    capacities: &[u64],
    rates: &[f64],
    objective: Objective,
    percentile: f64,
    recommended: Option<usize>,
    span_secs: f64,
) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot draw the heatmap: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (nx, ny) = (capacities.len() as f64, rates.len() as f64);
        let title = format!(
            "share of {} (white: none; green to red: 0.01% to 100%; \
             crossed: fills in over half the log, not judged)",
            objective.describe(percentile)
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5..nx - 0.5, -0.5..ny - 0.5)
            .map_err(|e| err(&e))?;
        let cap_label = |v: &f64| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < capacities.len() {
                capacities[i as usize].to_string()
            } else {
                String::new()
            }
        };
        let rate_label = |v: &f64| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < rates.len() {
                show_number(rates[i as usize])
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(capacities.len())
            .y_labels(rates.len())
            .x_label_formatter(&cap_label)
            .y_label_formatter(&rate_label)
            .x_desc("capacity B (tokens)")
            .y_desc("refill rate r (tokens/s)")
            .draw()
            .map_err(|e| err(&e))?;
        let index = |c: &Outcome| {
            let x = capacities.iter().position(|&b| b == c.capacity)?;
            let y = rates.iter().position(|&r| r == c.rate)?;
            Some((x as f64, y as f64))
        };
        chart
            .draw_series(cells.iter().filter_map(|c| {
                let (x, y) = index(c)?;
                let color = match &c.result {
                    Ok((_, m)) => heat(m.get(objective)),
                    Err(_) => RGBColor(170, 170, 170),
                };
                Some(Rectangle::new(
                    [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                    color.filled(),
                ))
            }))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(cells.iter().filter_map(|c| {
                let (x, y) = index(c)?;
                (!judgeable(c.capacity, c.rate, span_secs)).then(|| {
                    PathElement::new(
                        [(x - 0.4, y - 0.4), (x + 0.4, y + 0.4)],
                        RGBColor(90, 90, 90).stroke_width(1),
                    )
                })
            }))
            .map_err(|e| err(&e))?;
        if let Some((x, y)) = recommended.and_then(|i| index(&cells[i])) {
            chart
                .draw_series([Rectangle::new(
                    [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                    BLACK.stroke_width(3),
                )])
                .map_err(|e| err(&e))?;
            chart
                .draw_series([Circle::new((x, y), 6, BLACK.filled())])
                .map_err(|e| err(&e))?
                .label("recommended")
                .legend(|(x, y)| Circle::new((x, y), 5, BLACK.filled()));
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// White for zero; otherwise green (0.01% or less) through yellow to red (100%), on a
/// log scale.
fn heat(share: f64) -> RGBColor {
    if share <= 0.0 {
        return RGBColor(250, 250, 250);
    }
    let t = ((share.log10() + 4.0) / 4.0).clamp(0.0, 1.0);
    // Green (0, 170, 0) -> yellow (230, 200, 0) -> red (210, 0, 0).
    let lerp = |a: f64, b: f64, u: f64| (a + (b - a) * u).round() as u8;
    if t < 0.5 {
        let u = t * 2.0;
        RGBColor(lerp(0.0, 230.0, u), lerp(170.0, 200.0, u), 0)
    } else {
        let u = (t - 0.5) * 2.0;
        RGBColor(lerp(230.0, 210.0, u), lerp(200.0, 0.0, u), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_keys_are_those_below_the_percentile_keys_volume() {
        // 100 keys: 99 with 10 requests, one with 1000. p99 (nearest rank 99) is 10:
        // no key is below it, so every request counts.
        let mut v = vec![10; 99];
        v.push(1000);
        let p = Population::new(&v, 99.0, 2);
        assert_eq!(p.threshold, 10);
        assert!(p.all_count);
        assert_eq!(p.small_requests, 1990);
        assert_eq!(p.heavy, [99, 0]);
        // 100 keys: the 2 heaviest are at or above p99's volume (nearest rank 99).
        let mut v = vec![10; 98];
        v.extend([500, 1000]);
        let p = Population::new(&v, 99.0, 1);
        assert_eq!(p.threshold, 500);
        assert!(!p.all_count);
        assert_eq!((p.small_keys, p.small_requests), (98, 980));
        let stats = Stats {
            requests: 2480,
            rejected: 900,
            rejected_by_key: {
                let mut r = vec![0; 100];
                r[0] = 2;
                r[99] = 898;
                r
            },
            ..Stats::default()
        };
        let m = Measures::of(&stats, &p);
        assert_eq!(m.small_keys, 2.0 / 980.0);
        assert_eq!(m.keys, 2.0 / 100.0);
        assert_eq!(m.heavy, [0.898]);
    }

    fn outcome(capacity: u64, rate: f64, small: f64) -> Outcome {
        let m = Measures {
            requests: small,
            tokens: small,
            keys: small,
            small_keys: small,
            heavy: vec![],
        };
        Outcome {
            capacity,
            rate,
            result: Ok((Stats::default(), m)),
        }
    }

    #[test]
    fn the_rule_takes_the_smallest_rate_then_the_smallest_capacity() {
        let cells = vec![
            outcome(10, 1.0, 0.5),
            outcome(100, 1.0, 0.01),
            outcome(10, 2.0, 0.0005),
            outcome(100, 2.0, 0.0),
            outcome(1000, 1.0, 0.001),
            Outcome {
                capacity: 1,
                rate: 0.1,
                result: Err("bad".into()),
            },
        ];
        // A log of an hour judges every cell here (the longest fill time is 1000 s).
        let hour = 3600.0;
        let pick = |share| recommend(&cells, Objective::SmallKeys, share, hour).chosen();
        assert_eq!(pick(0.001), Some(4));
        assert_eq!(pick(0.0001), Some(3));
        assert_eq!(
            recommend(&cells, Objective::SmallKeys, -1.0, hour),
            Recommendation::NoneMeets {
                closest: Some(3),
                unjudged: None
            }
        );
        let table = table(&cells, Objective::SmallKeys, 0.001, Some(4), hour);
        assert!(table.contains("<- recommended"), "{table}");
        assert!(table.contains("no valid policy"), "{table}");
    }

    #[test]
    fn cells_that_fill_in_over_half_the_log_are_not_recommended() {
        // Every cell meets the rule; a log of 100 s judges fill times up to 50 s.
        let cells = vec![
            outcome(100, 0.1, 0.0), // 1000 s
            outcome(10, 0.1, 0.0),  // 100 s
            outcome(100, 1.0, 0.0), // 100 s
            outcome(40, 1.0, 0.0),  // 40 s
            outcome(50, 1.0, 0.0),  // 50 s
            outcome(10, 2.0, 0.0),  // 5 s
        ];
        assert!(judgeable(50, 1.0, 100.0) && !judgeable(51, 1.0, 100.0));
        let r = recommend(&cells, Objective::SmallKeys, 0.001, 100.0);
        assert_eq!(r, Recommendation::Chosen(3));
        // A log of 10 s judges only the last cell; of 1 s, none: the nearest meeting
        // cell is the one that fills soonest.
        let r = recommend(&cells, Objective::SmallKeys, 0.001, 10.0);
        assert_eq!(r, Recommendation::Chosen(5));
        let r = recommend(&cells, Objective::SmallKeys, 0.001, 1.0);
        assert_eq!(
            r,
            Recommendation::NoneMeets {
                closest: None,
                unjudged: Some(5)
            }
        );
        let t = table(&cells, Objective::SmallKeys, 0.001, None, 10.0);
        assert!(t.contains("not judged"), "{t}");
        let csv = csv(&cells, &Population::new(&[1], 99.0, 0), None, 100.0);
        assert!(csv.contains("\n100,0.1,1000,false,"), "{csv}");
        assert!(csv.contains("\n40,1,40,true,"), "{csv}");
    }

    #[test]
    fn the_heatmap_marks_the_recommendation() {
        let cells = vec![outcome(1, 1.0, 0.5), outcome(2, 1.0, 0.0)];
        let svg = heatmap(
            &cells,
            &[1, 2],
            &[1.0],
            Objective::Requests,
            99.0,
            Some(1),
            60.0,
        )
        .unwrap();
        assert!(svg.contains("recommended"));
        assert!(svg.contains("capacity B"));
        let none = heatmap(
            &cells,
            &[1, 2],
            &[1.0],
            Objective::Requests,
            99.0,
            None,
            60.0,
        )
        .unwrap();
        assert!(!none.contains("recommended"));
    }
}
