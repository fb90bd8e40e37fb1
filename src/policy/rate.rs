//! The refill rate as given, and its exact arithmetic.

/// The refill rate as given: tokens per second, or whole tokens per period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rate {
    PerSecond(f64),
    PerPeriod { tokens: u64, nanos: u128 },
}

impl Rate {
    pub(super) fn per_second(&self) -> f64 {
        match *self {
            Rate::PerSecond(r) => r,
            Rate::PerPeriod { tokens, nanos } => tokens as f64 * 1e9 / nanos as f64,
        }
    }

    /// `floor(rate * 2^shift ns)` in units of `2^-0`: the exact integer refill per tick
    /// for `shift = S + F`, rounded down. `None` when it does not fit a `u64`.
    pub(crate) fn units_per_tick(&self, shift: u32) -> Option<u64> {
        let exact = match *self {
            Rate::PerSecond(r) => {
                // r = m * 2^e exactly; R = floor(m * 2^(e + shift) / 1e9).
                let (m, e) = decompose(r);
                let k = e + shift as i32;
                if k >= 0 {
                    let k = k as u32;
                    if k > 127 - 53 {
                        return None;
                    }
                    (u128::from(m) << k) / 1_000_000_000
                } else {
                    let q = u128::from(m) / 1_000_000_000;
                    q.checked_shr(k.unsigned_abs()).unwrap_or(0)
                }
            }
            Rate::PerPeriod { tokens, nanos } => {
                let n = u128::from(tokens).checked_shl(shift)?;
                if n >> shift != u128::from(tokens) {
                    return None;
                }
                n / nanos
            }
        };
        u64::try_from(exact).ok()
    }

    /// The rate as an exact fraction `(numerator, denominator)` of tokens per nanosecond;
    /// `None` when it does not fit in `u128`s.
    pub(super) fn per_nanosecond(&self) -> Option<(u128, u128)> {
        match *self {
            Rate::PerSecond(r) => {
                let (m, e) = decompose(r);
                if e >= 0 {
                    let num = u128::from(m).checked_shl(e as u32)?;
                    (num >> e == u128::from(m)).then_some((num, 1_000_000_000))
                } else {
                    let den = 1_000_000_000u128.checked_shl(e.unsigned_abs())?;
                    (den >> e.unsigned_abs() == 1_000_000_000).then_some((u128::from(m), den))
                }
            }
            Rate::PerPeriod { tokens, nanos } => Some((u128::from(tokens), nanos)),
        }
    }

    /// The exact refill per tick as a float, for the rate error.
    pub(crate) fn units_per_tick_f64(&self, shift: u32) -> f64 {
        match *self {
            Rate::PerSecond(r) => r * 2f64.powi(shift as i32) / 1e9,
            Rate::PerPeriod { tokens, nanos } => {
                tokens as f64 * 2f64.powi(shift as i32) / nanos as f64
            }
        }
    }
}

pub(super) fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Splits a positive finite `f64` into `m * 2^e` exactly, `m < 2^53`.
pub(super) fn decompose(x: f64) -> (u64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1 << 52) - 1);
    if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1 << 52), exp - 1075)
    }
}
