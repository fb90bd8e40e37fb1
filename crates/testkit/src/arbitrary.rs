//! How fuzz inputs become typed scenarios (feature `arbitrary`).
//!
//! Raw `Arbitrary` integers and floats are mostly useless here: a uniform `u64` is a
//! duration of centuries, a uniform `f64` is rarely a finite positive rate. So each value
//! is decoded through a small selector byte that picks a distribution spread over
//! magnitudes (the bit length first, then the bits below it), with the raw value kept as
//! one of the choices so that garbage is still tried. Most inputs then build valid
//! policies across the whole representable range (capacities from 1 to 2^62 tokens,
//! rates from 1e-18 to 1e19 tokens per second), and invalid ones must still be refused
//! with an error, never a panic.
//!
//! The decoded values are the plain fields of the scenario types, so `Debug` of a
//! decoded input (what `cargo fuzz fmt` prints) reads as the policy and the operations.

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::check::{Op, PolicySpec, Scenario};
use crate::multi::{MultiOp, MultiScenario};
use crate::packing::{LayoutParams, PackingCase, Probe, TickSpec, UnitsSpec, WordSpec};
use crate::reconfigure::{ConvertProbe, LiveOp, ReconfigureCase};

/// Longest operation list decoded from one input: keeps every execution short.
const MAX_OPS: usize = 256;

/// Most buckets in one multi-bucket scenario (above `INLINE_MEMBERS`, so the allocating
/// path runs too).
const MAX_BUCKETS: usize = 10;

/// Most probes in one packing case.
const MAX_PROBES: usize = 64;

/// A value with exactly `bits` significant bits (zero for `bits == 0`): spread over
/// magnitudes when `bits` is uniform.
fn magnitude(u: &mut Unstructured<'_>, max_bits: u32) -> Result<u64> {
    let bits = u.int_in_range(0..=max_bits.min(64))?;
    let raw: u64 = u.arbitrary()?;
    Ok(match bits {
        0 => 0,
        64 => raw | 1 << 63,
        b => (raw >> (64 - b)) | 1 << (b - 1),
    })
}

/// A duration in nanoseconds: mostly up to ~73 minutes (every tick length and fill
/// time of ordinary policies), sometimes anything up to the end of the clock.
fn nanos(u: &mut Unstructured<'_>) -> Result<u64> {
    match u.int_in_range(0u8..=9)? {
        0 => Ok(0),
        1..=7 => magnitude(u, 42),
        _ => magnitude(u, 64),
    }
}

/// A cost in tokens: mostly tiny, often any magnitude (the checks reduce large ones
/// modulo the capacity + 2), sometimes raw.
fn cost(u: &mut Unstructured<'_>) -> Result<u64> {
    match u.int_in_range(0u8..=7)? {
        0..=3 => u.int_in_range(0..=4),
        4..=6 => magnitude(u, 64),
        _ => u.arbitrary(),
    }
}

/// A capacity: often small, often up to 2^40 tokens, sometimes anything (most of those
/// are too large for the word and must be refused).
fn capacity(u: &mut Unstructured<'_>) -> Result<u64> {
    match u.int_in_range(0u8..=15)? {
        0..=7 => u.int_in_range(1..=256),
        8..=13 => magnitude(u, 40),
        14 => magnitude(u, 64),
        _ => u.arbitrary(),
    }
}

/// Rates people write (`20.0`, `0.5`, `1e6`).
const ROUND_RATES: [f64; 12] = [
    0.1, 0.5, 1.0, 2.0, 3.0, 10.0, 20.0, 100.0, 1000.0, 1e6, 1e9, 1e12,
];

fn rate(u: &mut Unstructured<'_>) -> Result<f64> {
    Ok(match u.int_in_range(0u8..=15)? {
        // m * 10^e: 1e-12 to ~1e16 tokens per second, as decimal as users write them.
        0..=9 => {
            let m = f64::from(u.int_in_range(1u16..=9999)?);
            // Exponent 0 first, so that an exhausted input (all zeros) means 1 token/s.
            let e = (u.int_in_range(0i32..=24)? + 12) % 25 - 12;
            if e < 0 {
                m / 10f64.powi(-e)
            } else {
                m * 10f64.powi(e)
            }
        }
        10..=11 => *u.choose(&ROUND_RATES)?,
        // m * 2^e exactly, up to 53-bit mantissas: ~1e-27 to ~1e19.
        12..=14 => {
            let m = magnitude(u, 53)?.max(1);
            let e: i32 = u.int_in_range(-90..=10)?;
            m as f64 * 2f64.powi(e)
        }
        // Anything, NaN and infinities included.
        _ => f64::from_bits(u.arbitrary()?),
    })
}

fn start_nanos(u: &mut Unstructured<'_>) -> Result<u64> {
    match u.int_in_range(0u8..=3)? {
        0 => Ok(0),
        1..=2 => magnitude(u, 50),
        _ => magnitude(u, 64),
    }
}

impl<'a> Arbitrary<'a> for PolicySpec {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(PolicySpec {
            capacity: capacity(u)?,
            refill_per_second: rate(u)?,
            start_empty: u.arbitrary()?,
            max_reservation_nanos: match u.int_in_range(0u8..=15)? {
                0..=10 => 0,
                11..=14 => magnitude(u, 36)?,
                _ => magnitude(u, 64)?,
            },
        })
    }
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(match u.int_in_range(0u8..=15)? {
            0..=4 => Op::Advance(nanos(u)?),
            5 => Op::StepBack(nanos(u)?),
            6..=10 => Op::Acquire(cost(u)?),
            11..=12 => Op::Refund(cost(u)?),
            13 => Op::Reset,
            _ => Op::Peek,
        })
    }
}

/// Elements until the input runs out (or `max` of them).
fn rest<'a, T: Arbitrary<'a>>(u: &mut Unstructured<'a>, max: usize) -> Result<Vec<T>> {
    let mut items = Vec::new();
    while !u.is_empty() && items.len() < max {
        items.push(T::arbitrary(u)?);
    }
    Ok(items)
}

impl<'a> Arbitrary<'a> for Scenario {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let start_nanos = start_nanos(u)?;
        let policy = u.arbitrary()?;
        let ops = u.arbitrary_iter()?.take(MAX_OPS).collect::<Result<_>>()?;
        Ok(Scenario {
            start_nanos,
            policy,
            ops,
        })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> Result<Self> {
        Ok(Scenario {
            start_nanos: start_nanos(&mut u)?,
            policy: u.arbitrary()?,
            ops: rest(&mut u, MAX_OPS)?,
        })
    }
}

impl<'a> Arbitrary<'a> for LayoutParams {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(LayoutParams {
            capacity: capacity(u)?,
            tick_shift: match u.int_in_range(0u8..=7)? {
                0..=6 => u.int_in_range(0..=41)?,
                _ => u.arbitrary()?,
            },
            frac_bits: match u.int_in_range(0u8..=7)? {
                0..=6 => u.int_in_range(0..=64)?,
                _ => u.arbitrary()?,
            },
            refill_per_tick: magnitude(u, 64)?,
            base_units: match u.int_in_range(0u8..=3)? {
                0..=1 => 0,
                _ => magnitude(u, 64)?,
            },
        })
    }
}

fn tick_spec(u: &mut Unstructured<'_>) -> Result<TickSpec> {
    Ok(match u.int_in_range(0u8..=7)? {
        0..=2 => TickSpec::Forward(magnitude(u, 64)?),
        3 => TickSpec::Back(magnitude(u, 64)?),
        4 => TickSpec::WindowEdge(u.int_in_range(-4..=4)?),
        5 => TickSpec::FillEdge(u.int_in_range(-4..=4)?),
        6 => TickSpec::Forward(u.int_in_range(0..=3)?),
        _ => TickSpec::Raw(u.arbitrary()?),
    })
}

fn units_spec(u: &mut Unstructured<'_>) -> Result<UnitsSpec> {
    Ok(match u.int_in_range(0u8..=7)? {
        0..=2 => UnitsSpec::Tokens(cost(u)?),
        3..=5 => UnitsSpec::InRange(magnitude(u, 64)?),
        6 => UnitsSpec::Raw(magnitude(u, 64)?),
        _ => UnitsSpec::Raw(u.arbitrary()?),
    })
}

impl<'a> Arbitrary<'a> for Probe {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(Probe {
            word: match u.int_in_range(0u8..=7)? {
                0..=5 => WordSpec::Packed {
                    tick: magnitude(u, 64)?,
                    units: match u.int_in_range(0u8..=3)? {
                        0 => 0,
                        1 => u64::MAX, // max_units after the reduction
                        _ => magnitude(u, 64)?,
                    },
                },
                _ => WordSpec::Raw(u.arbitrary()?),
            },
            now: tick_spec(u)?,
            later: tick_spec(u)?,
            cost: units_spec(u)?,
            min: units_spec(u)?,
            max_wanted: units_spec(u)?,
            refund: units_spec(u)?,
            max_wait_ticks: magnitude(u, 64)?,
        })
    }
}

impl<'a> Arbitrary<'a> for PackingCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let params = u.arbitrary()?;
        let probes = u
            .arbitrary_iter()?
            .take(MAX_PROBES)
            .collect::<Result<_>>()?;
        Ok(PackingCase { params, probes })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> Result<Self> {
        Ok(PackingCase {
            params: u.arbitrary()?,
            probes: rest(&mut u, MAX_PROBES)?,
        })
    }
}

fn request(u: &mut Unstructured<'_>, buckets: usize) -> Result<Vec<(u8, u64)>> {
    let len = u.int_in_range(0..=buckets + 1)?;
    let mut request = Vec::with_capacity(len);
    if u.ratio(1u8, 2)? {
        // Distinct buckets, in an arbitrary order.
        let mut left: Vec<u8> = (0..buckets as u8).collect();
        while request.len() < len && !left.is_empty() {
            let i = u.choose_index(left.len())?;
            request.push((left.swap_remove(i), cost(u)?));
        }
    } else {
        for _ in 0..len {
            request.push((u.int_in_range(0..=buckets as u8 - 1)?, cost(u)?));
        }
    }
    Ok(request)
}

fn multi_op(u: &mut Unstructured<'_>, buckets: usize) -> Result<MultiOp> {
    let bucket = |u: &mut Unstructured<'_>| u.int_in_range(0..=buckets as u8 - 1);
    Ok(match u.int_in_range(0u8..=15)? {
        0..=5 => MultiOp::AcquireAll(request(u, buckets)?),
        6..=7 => MultiOp::Acquire {
            bucket: bucket(u)?,
            cost: cost(u)?,
        },
        8 => MultiOp::Refund {
            bucket: bucket(u)?,
            cost: cost(u)?,
        },
        9..=10 => MultiOp::Release(u.arbitrary()?),
        11..=13 => MultiOp::Advance(nanos(u)?),
        _ => MultiOp::StepBack(nanos(u)?),
    })
}

impl<'a> Arbitrary<'a> for MultiScenario {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let (start_nanos, buckets) = multi_head(u)?;
        let mut ops = Vec::new();
        while ops.len() < MAX_OPS && u.arbitrary::<bool>()? {
            ops.push(multi_op(u, buckets.len())?);
        }
        Ok(MultiScenario {
            start_nanos,
            buckets,
            ops,
        })
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> Result<Self> {
        let (start_nanos, buckets) = multi_head(&mut u)?;
        let mut ops = Vec::new();
        while ops.len() < MAX_OPS && !u.is_empty() {
            ops.push(multi_op(&mut u, buckets.len())?);
        }
        Ok(MultiScenario {
            start_nanos,
            buckets,
            ops,
        })
    }
}

fn multi_head(u: &mut Unstructured<'_>) -> Result<(u64, Vec<PolicySpec>)> {
    let start = start_nanos(u)?;
    let count = u.int_in_range(1..=MAX_BUCKETS)?;
    let buckets = (0..count)
        .map(|_| PolicySpec::arbitrary(u))
        .collect::<Result<_>>()?;
    Ok((start, buckets))
}

impl<'a> Arbitrary<'a> for LiveOp {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(match u.int_in_range(0u8..=15)? {
            0..=4 => LiveOp::Advance(magnitude(u, 40)?),
            5..=10 => LiveOp::Acquire(cost(u)?),
            11..=12 => LiveOp::Refund(cost(u)?),
            _ => LiveOp::Switch(u.arbitrary()?),
        })
    }
}

impl<'a> Arbitrary<'a> for ConvertProbe {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(ConvertProbe {
            units: u.arbitrary()?,
            now: u.arbitrary()?,
            how: u.arbitrary()?,
            backwards: u.arbitrary()?,
        })
    }
}

impl<'a> Arbitrary<'a> for ReconfigureCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let start_nanos = start_nanos(u)?;
        let first = u.arbitrary()?;
        let second = u.arbitrary()?;
        let n = u.int_in_range(0u8..=8)?;
        let mut probes = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            probes.push(u.arbitrary()?);
        }
        Ok(ReconfigureCase {
            first,
            second,
            start_nanos,
            probes,
            ops: rest(u, MAX_OPS)?,
        })
    }
}
