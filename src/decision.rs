//! The outcome of an admission attempt.

use std::fmt;
use std::time::Duration;

use crate::state::{Layout, Snapshot};

/// Admitted or rejected, with the balance left and, for a rejection, when the cost will be
/// there.
///
/// A decision is a small `Copy` value computed on the hot path without division or
/// floating point; [`tokens_remaining`](Decision::tokens_remaining) and
/// [`retry_after`](Decision::retry_after) do their arithmetic only when called.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{Bucket, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let bucket = Bucket::with_clock(Policy::new(10, 2.0)?, clock.clone());
/// let d = bucket.try_acquire(8)?;
/// assert!(d.is_admitted());
/// assert_eq!(d.tokens_remaining(), 2.0);
///
/// let d = bucket.try_acquire(5)?;
/// assert!(d.is_rejected());
/// // 3 more tokens at 2 per second: 1.5 s, rounded up to the next tick edge (0.5 ms).
/// let wait = d.retry_after().unwrap();
/// assert!(wait >= Duration::from_millis(1500) && wait < Duration::from_millis(1502));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    cost: u64,
    /// Balance after the decision, in units (negative while reservations are owed).
    balance: i64,
    refill_per_tick: u64,
    /// Nanoseconds from the clock reading to the tick edge the snapshot is at:
    /// `behind << S` minus the time already spent in the current tick.
    lead_nanos: i64,
    /// `admitted` (bit 0), `F` (bits 8..16) and `S` (bits 16..24) in one word, so that a
    /// decision is written with whole-word stores only: a caller copying it then reads
    /// each word straight back from the store buffer, where three byte stores read back
    /// as one word stall store-to-load forwarding (measured: BENCHMARKS.md).
    bits: u64,
}

const ADMITTED: u64 = 1;
const FRAC_SHIFT: u32 = 8;
const TICK_SHIFT: u32 = 16;

/// `frac_bits` and `tick_shift` in their places in [`Decision`]'s `bits`, computed once
/// per layout.
pub(crate) const fn pack_shifts(frac_bits: u32, tick_shift: u32) -> u64 {
    (frac_bits as u64) << FRAC_SHIFT | (tick_shift as u64) << TICK_SHIFT
}

impl Decision {
    #[inline]
    pub(crate) fn new(
        layout: &Layout,
        snapshot: &Snapshot,
        now_nanos: u64,
        cost: u64,
        cost_units: u64,
        admitted: bool,
    ) -> Decision {
        let mut balance = layout.balance_units(snapshot);
        if admitted {
            balance -= cost_units as i64;
        }
        Decision::with_balance(
            layout,
            balance,
            snapshot.behind(),
            now_nanos,
            cost,
            admitted,
        )
    }

    #[inline]
    fn frac_bits(&self) -> u32 {
        (self.bits >> FRAC_SHIFT) as u8 as u32
    }

    #[inline]
    fn tick_shift(&self) -> u32 {
        (self.bits >> TICK_SHIFT) as u8 as u32
    }

    /// A decision from a balance already computed (in units, after the cost when
    /// admitted), for limiters whose balance is not one snapshot, such as
    /// [`LeasedBucket`](crate::LeasedBucket). `behind` and `now_nanos` place the balance on
    /// the tick grid as in [`Decision::new`].
    #[inline]
    pub(crate) fn with_balance(
        layout: &Layout,
        balance: i64,
        behind: u64,
        now_nanos: u64,
        cost: u64,
        admitted: bool,
    ) -> Decision {
        let into_tick = layout.nanos_into_tick(now_nanos);
        Decision {
            cost,
            balance,
            refill_per_tick: layout.refill_per_tick(),
            lead_nanos: ((behind << layout.tick_shift()) as i64) - into_tick as i64,
            bits: u64::from(admitted) | layout.decision_shifts(),
        }
    }

    /// The parts of this decision that its layout and cost do not give back: the
    /// balance in units and the lead to the tick edge. [`Decision::from_parts`] rebuilds it.
    #[inline]
    pub(crate) fn parts(&self) -> (i64, i64) {
        (self.balance, self.lead_nanos)
    }

    /// The decision whose [`parts`](Decision::parts) are `balance` and `lead_nanos`, on
    /// `layout`, for `cost`.
    #[inline]
    pub(crate) fn from_parts(
        layout: &Layout,
        balance: i64,
        lead_nanos: i64,
        cost: u64,
        admitted: bool,
    ) -> Decision {
        Decision {
            cost,
            balance,
            refill_per_tick: layout.refill_per_tick(),
            lead_nanos,
            bits: u64::from(admitted) | layout.decision_shifts(),
        }
    }

    /// Whether the cost was taken.
    #[inline]
    pub fn is_admitted(&self) -> bool {
        self.bits & ADMITTED != 0
    }

    /// Whether the cost was refused (nothing was taken).
    #[inline]
    pub fn is_rejected(&self) -> bool {
        !self.is_admitted()
    }

    /// The cost asked for, in tokens.
    #[inline]
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// Tokens left after the decision (fractional; negative while reservations are owed).
    pub fn tokens_remaining(&self) -> f64 {
        self.balance as f64 / (1u64 << self.frac_bits()) as f64
    }

    /// The balance after the decision in fixed-point units (`2^F` per token).
    #[inline]
    pub fn balance_units(&self) -> i64 {
        self.balance
    }

    /// For a rejection, the time from the decision until `cost` tokens will be there
    /// (refill arrives at tick edges, so this is exact on the bucket's tick grid); the
    /// basis of a `Retry-After`. `None` for an admission.
    ///
    /// It assumes nobody else takes tokens meanwhile: under contention the tokens may be
    /// gone again, and the caller should decide afresh then.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.is_admitted() {
            return None;
        }
        Some(self.wait_for(self.cost))
    }

    /// Time until `tokens` tokens are there, from the state this decision saw (zero if
    /// they are already there), saturating at `Duration::MAX`. For more tokens than the
    /// capacity, which never come, it is the time refill would take ignoring the cap.
    pub fn wait_for(&self, tokens: u64) -> Duration {
        let needed = (i128::from(tokens) << self.frac_bits()) - i128::from(self.balance);
        if needed <= 0 {
            return Duration::ZERO;
        }
        let ticks = (needed as u128).div_ceil(u128::from(self.refill_per_tick));
        // `ticks << S` can exceed u128 for absurd requests on tiny rates: saturate.
        let Some(nanos) = ticks
            .checked_mul(1u128 << self.tick_shift())
            .and_then(|n| n.checked_add_signed(i128::from(self.lead_nanos)))
        else {
            return Duration::MAX;
        };
        duration_from_nanos(nanos)
    }
}

pub(crate) fn duration_from_nanos(nanos: u128) -> Duration {
    let secs = nanos / 1_000_000_000;
    match u64::try_from(secs) {
        Ok(secs) => Duration::new(secs, (nanos % 1_000_000_000) as u32),
        Err(_) => Duration::MAX,
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("admitted", &self.is_admitted())
            .field("cost", &self.cost)
            .field("tokens_remaining", &self.tokens_remaining())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}
