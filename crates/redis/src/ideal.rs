//! An ideal token bucket written from the definition, for admission logs: in any window
//! `[s, e]`, at most `B + r*(e - s)` admissions (plus the named slack of the mode under
//! test). It sees only admission times: each admission is the interval from a wall-clock
//! read before its decision to one after, and counts in a window only when the whole
//! interval lies inside (a descheduled thread can hide an excess, never invent one).

/// The windows every check slides over, ns: 10 ms, 100 ms, 1 s, 5 s (and the whole run).
pub const WINDOWS_NS: [u64; 4] = [10_000_000, 100_000_000, 1_000_000_000, 5_000_000_000];

/// The most admissions wholly inside one window of `w` ns, and where that window starts.
/// `adm` is sorted by start.
pub fn most_in_window(adm: &[(u64, u64)], w: u64) -> (u64, u64) {
    let mut best = (0, 0);
    for (i, &(s, _)) in adm.iter().enumerate() {
        let e = s + w;
        let n = adm[i..]
            .iter()
            .take_while(|(b, _)| *b < e)
            .filter(|(_, a)| *a <= e)
            .count() as u64;
        if n > best.0 {
            best = (n, s);
        }
    }
    best
}

/// One window length's worst case against its bound.
#[derive(Clone, Copy, Debug)]
pub struct Worst {
    /// Window length, ns.
    pub window_ns: u64,
    /// Most admitted in one window of that length.
    pub admitted: u64,
    /// `B + r*w + slack`.
    pub bound: u64,
    /// The window's start, wall-clock ns.
    pub at_ns: u64,
}

impl std::fmt::Display for Worst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ms: {} admitted, bound {}",
            self.window_ns / 1_000_000,
            self.admitted,
            self.bound
        )
    }
}

/// The worst window of each length in [`WINDOWS_NS`], then the whole run (from the first
/// admission's start to the last one's end), against `B + r*w + slack` (`rate_milli` in
/// milli-tokens per second, the bound rounded down).
pub fn worst_windows(adm: &[(u64, u64)], cap: u64, rate_milli: u64, slack: u64) -> Vec<Worst> {
    let mut adm = adm.to_vec();
    adm.sort_unstable();
    let bound =
        |w: u64| cap + (u128::from(rate_milli) * u128::from(w) / 1_000_000_000_000) as u64 + slack;
    let mut worst: Vec<Worst> = WINDOWS_NS
        .iter()
        .map(|&w| {
            let (admitted, at_ns) = most_in_window(&adm, w);
            Worst {
                window_ns: w,
                admitted,
                bound: bound(w),
                at_ns,
            }
        })
        .collect();
    if let (Some(first), Some(last)) = (adm.first(), adm.iter().map(|a| a.1).max()) {
        let w = last - first.0;
        worst.push(Worst {
            window_ns: w,
            admitted: adm.len() as u64,
            bound: bound(w),
            at_ns: first.0,
        });
    }
    worst
}

/// Fails the test with every window's figures, the schedule named, when one exceeds its
/// bound; prints them otherwise.
pub fn assert_within(what: &str, adm: &[(u64, u64)], cap: u64, rate_milli: u64, slack: u64) {
    let worst = worst_windows(adm, cap, rate_milli, slack);
    let line = worst
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    eprintln!("{what}: {line}");
    assert!(
        worst.iter().all(|w| w.admitted <= w.bound),
        "{what}: above B + r*T (B = {cap}, r = {} /s, slack {slack}): {line}",
        rate_milli as f64 / 1000.0
    );
}
