//! The packed word and its pure transition functions.
//!
//! Every bucket is one `u64`:
//!
//! ```text
//!  63                 token_bits   token_bits-1                  0
//! +----------------------------+----------------------------------+
//! |  tick (T bits, wrapping)   |  units (64 - T bits)             |
//! +----------------------------+----------------------------------+
//!
//! tick  = (monotonic nanoseconds >> tick_shift) mod 2^T
//! units = base + balance * 2^frac_bits          (0 <= units <= max_units)
//! ```
//!
//! `units` is the balance in fixed point, offset by `base`: the number of units the
//! bucket may owe to reservations (zero unless the policy allows reserving ahead, see
//! [`Policy::max_reservation`](crate::Policy::max_reservation)). A balance of zero tokens
//! is `units == base`, a full bucket is `units == max_units == base + capacity * 2^F`.
//!
//! Refill is exact integer arithmetic on an absolute tick grid: each tick adds
//! `refill_per_tick` units, capped at `max_units`. Nothing is rounded per update, so a
//! bucket refilled in a thousand small steps holds exactly what it holds refilled in
//! one (invariant I3). The only approximation is turning the configured rate into an
//! integer `refill_per_tick`, done once, rounded down, in [`Policy`](crate::Policy).
//!
//! # Reservations: debt below zero
//!
//! A policy with a reservation horizon `h`
//! ([`max_reservation`](crate::PolicyBuilder::max_reservation)) gets an allowance of
//! `base = ceil(h / tick) * R` units: the refill of the horizon's whole ticks. The token
//! field then holds `units = base + balance`, so the balance runs from `-base` (the most
//! the bucket may owe) to `+capacity`, and no sign bit or second field is needed:
//!
//! ```text
//!  units:  0 ............ base ..................... base + capacity * 2^F = max_units
//! balance: -base (most owed)  0 (empty)               capacity (full)
//! ```
//!
//! * [`Layout::reserve`] takes a cost even when the balance does not cover it, down to
//!   `units = 0`, and returns how many ticks after the snapshot's tick refill brings the
//!   balance back to zero: `ceil((base - units_after) / R)`, [`Layout::ticks_until`]
//!   (one more when the write anchors at the next edge). The reservation's holder may
//!   proceed at that tick edge. Refill there exceeds the debt by less than `R`; when the
//!   holder's cost plus that excess is more than a full bucket, the excess is charged too
//!   (the debt becomes whole ticks of refill), so the next holder waits whole ticks for
//!   its own cost and no two holders are closer than the refill rate allows. The caller
//!   bounds the wait by the horizon and its own maximum (see
//!   [`Bucket::reserve`](crate::Bucket::reserve)).
//! * [`Layout::take`] (and so every `try_acquire`) needs `units >= base + cost`: while
//!   anything is owed, it refuses, and its `retry_after` counts the debt. Later
//!   reservations add to the debt and get later times. Requests are therefore served in
//!   the order they reserved, at the refill rate: the queue is the debt, a single number,
//!   and each reservation's place in it is fixed by the time it was made.
//! * [`Layout::cancel`] of a reservation not yet due gives its whole charge back when
//!   no reservation was made after it (exactly the state without it, I6), and nothing
//!   when one was: the later holders' ready times are fixed, and the tokens credited
//!   ahead of them would be refilled again while they wait (2B at one instant). Its
//!   tokens then count as used.
//! * [`Layout::refund`] gives nothing back while the balance is below zero, for the same
//!   reason (the debt may be holders'); at zero or above, `min(max, units + refund)`.
//! * Refill is unchanged: it adds `R` per tick up to `max_units`; a bucket in debt refills
//!   towards zero and then towards full like any other.
//!
//! Reservations cost the word precision: the token field needs the bits of
//! `base + capacity * 2^F`, so a long horizon at a high rate leaves fewer bits for the
//! tick or the fraction; [`Policy`](crate::Policy) searches the layout with the allowance
//! included and refuses horizons the word cannot owe
//! ([`PolicyError::ReservationTooLong`](crate::PolicyError::ReservationTooLong)).
//!
//! Nothing in this module touches an atomic or a clock: the CAS loops in
//! [`Bucket`](crate::Bucket) call these functions, and the tests, the fuzzer and the loom
//! models share this one definition.
//!
//! # Exact times: never above the curve, between tick edges too
//!
//! Time is read on the tick grid, but requests arrive between edges. A stored tick
//! stands for its *start*, earlier than the reading that stored it: a refill counted from
//! there credits the part of the tick that passed before the write. That is credit the
//! ideal bucket also had, unless the ideal bucket was full in between (refill past the
//! cap is lost), which needs the balance within one tick's refill `R` of full. So
//! [`Layout::store`] anchors a write whose balance before or after is above
//! [`Layout::near_full_units`] (`max_units - R - 1`) at the *next* tick edge, and fresh
//! and reset buckets start there ([`Layout::start_word`], [`Layout::restart`]): refill
//! then counts only whole ticks after the reading. Together, for every pair of real
//! times `s <= e`:
//!
//! ```text
//! admitted in [s, e] <= B + r * (e - s)      (and <= r * (e - s) from a start-empty creation)
//! ```
//!
//! with `r` the configured rate, for every bucket, reservation and lease of the crate: a
//! reservation's holder counts as admitted at its ready time, a cancelled one not at all,
//! and a refund is a credit at its time (`tests/exact_time.rs` and
//! `tests/reservation_curve.rs` check it on random histories at nanosecond times, with
//! cancellations, consumes and refunds, against `testkit::Ideal`, an exact ideal bucket;
//! the fuzzer's rounding target does too). The price is lag, never lead: refill reaches a
//! bucket less than two ticks after the ideal bucket when the bucket was anchored at the
//! next tick edge (a fresh or reset bucket, a write near full), less than one tick
//! otherwise; a queued holder whose cost plus the rounding excess would pass a full
//! bucket waits up to one more tick; and the full burst `B` is always there once the
//! bucket is full. A stored tick is never more than one tick ahead of the reading that
//! stored it, so the race tolerance is at least [`MIN_TOLERANCE_TICKS`].
//!
//! # Reading time from a wrapping tick
//!
//! The tick field holds the tick modulo `2^T`. The difference `d = (now - stored) mod 2^T`
//! is read as forward, except in a *back window* of [`Layout::back_window_ticks`] just
//! below `2^T` (at most [`BACK_WINDOW_NANOS`], about 19.5 hours), where `now` is read as
//! behind the stored tick by `2^T - d` ([`Snapshot::behind`]). The limiters read their
//! clock through a [`Monotonic`](crate::clock::Monotonic) guard (free for clocks that
//! declare [`is_monotonic`](crate::Clock::is_monotonic), a `fetch_max` high-water mark
//! for the others), so a clock stepping back, by any amount, is time standing still, and
//! a behind reading has only two causes:
//!
//! * a thread that read the clock, then lost a CAS race to threads that read it later
//!   (or one tick less: the anchor of a write near full). The snapshot is the stored
//!   state unchanged and keeps the stored tick (invariant I2). Beyond
//!   [`Layout::tolerance_ticks`], the limiter loads the word *first* and reads the clock
//!   *after*, so that the reading is not earlier than any reading stored in the word;
//! * an idle longer than the wrap period less the back window, wrapped into the back
//!   window. Seen from a reading taken after the load, that is the only way to be far
//!   behind, and every layout wraps after at least twice its fill time plus the back
//!   window ([`Layout::wraps_comfortably`] for every [`Policy`](crate::Policy),
//!   [`LayoutError::WrapTooShort`] below the fill time plus the window): the bucket idled
//!   for longer than it takes to fill, so it is full ([`Layout::reanchor_full`]).
//!
//! An idle shorter than the wrap period less the back window reads its true balance; a
//! bucket full when it went idle stays full for any idle. Longer idles are the
//! limiters' part: each re-anchors its words in passes a fraction of the wrap apart, run
//! by the first operation due (on a plain bucket, the first that writes), and a pass that
//! comes due after an idle longer
//! than the fill time writes them full (`src/pass.rs` has the timing and its proof). So
//! with any limiter of the crate, any idle reads its true balance.
//!

use std::fmt;
use std::time::Duration;

/// Width of the packed word in bits.
pub const WORD_BITS: u32 = 64;

/// Clock readings older than the stored tick by at most this many nanoseconds (or one
/// tick, whichever is longer) are treated as a lost race, not as a clock stepping back.
pub const TOLERANCE_NANOS: u64 = 1 << 20;

/// The longest clock step back that is detected as one (2^46 ns, about 19.5 hours, or
/// half the wrap period if that is shorter).
pub const BACK_WINDOW_NANOS: u64 = 1 << 46;

/// The smallest race tolerance, in ticks: a write near full anchors one tick ahead of its
/// reading, and a lost race may add one more.
pub const MIN_TOLERANCE_TICKS: u64 = 2;

/// The largest tick shift a layout may use: ticks of up to 2^40 ns (about 18 minutes).
pub const MAX_TICK_SHIFT: u32 = 40;

/// The largest `refill_per_tick`, so that `units + refill` never overflows a `u64`.
pub const MAX_REFILL_PER_TICK: u64 = 1 << 62;

/// The largest `max_units`: at least two tick bits always remain.
pub const MAX_UNITS: u64 = (1 << 62) - 2;

/// A word no layout ever stores: every layout's token field has room for
/// `max_units + 1`, so a token field of all ones is never a balance. A
/// [`LiveBucket`](crate::LiveBucket) seals the word of a policy it replaces with it, so
/// that no operation still holding the old policy can write that word again.
pub const SEALED: u64 = u64::MAX;

/// Why a set of layout parameters cannot describe a packed word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The capacity is zero.
    ZeroCapacity,
    /// `refill_per_tick` is zero or above [`MAX_REFILL_PER_TICK`].
    RefillOutOfRange(u64),
    /// `tick_shift` is above [`MAX_TICK_SHIFT`].
    TickShiftOutOfRange(u32),
    /// `base + capacity * 2^frac_bits` does not fit in the token field (at most [`MAX_UNITS`]).
    TokensDoNotFit,
    /// The tick field wraps before the back window plus the time to fill the bucket: a
    /// reading far behind the stored tick could not be read as an idle long enough to
    /// fill it (or fewer than three tick bits remain).
    WrapTooShort,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::ZeroCapacity => f.write_str("capacity must be at least 1 token, got 0"),
            LayoutError::RefillOutOfRange(r) => write!(
                f,
                "refill per tick must be between 1 and 2^62 units, got {r}"
            ),
            LayoutError::TickShiftOutOfRange(s) => {
                write!(f, "tick shift must be at most {MAX_TICK_SHIFT}, got {s}")
            }
            LayoutError::TokensDoNotFit => write!(
                f,
                "base + capacity * 2^frac_bits must be at most 2^62 - 1 units"
            ),
            LayoutError::WrapTooShort => f.write_str(
                "the tick field must wrap after at least the back window plus the fill time",
            ),
        }
    }
}

impl std::error::Error for LayoutError {}

/// The fixed-point layout of one bucket's packed word: bit widths, the tick length and
/// the integer refill per tick.
///
/// A layout is chosen once per [`Policy`](crate::Policy); see
/// [`Policy::layout`](crate::Policy::layout). It is public so that the numbers behind a
/// policy can be inspected, and so that tests and fuzzers can drive the pure transitions.
///
/// ```
/// use tokengate::Policy;
///
/// let policy = Policy::new(100, 20.0)?;
/// let layout = policy.layout();
/// // 100 tokens need 7 integer bits; the rest of the token field is fraction.
/// assert_eq!(layout.token_bits(), 7 + layout.frac_bits());
/// assert_eq!(layout.tick_bits() + layout.token_bits(), 64);
/// // The refill per tick is the configured rate rounded down, never up.
/// assert!(policy.effective_refill_per_second() <= 20.0);
/// # Ok::<(), tokengate::PolicyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    capacity: u64,
    tick_shift: u32,
    token_bits: u32,
    frac_bits: u32,
    refill_per_tick: u64,
    base_units: u64,
    max_units: u64,
    token_mask: u64,
    /// `2^T - 1`: the tick field's values, shifted down.
    tick_mask: u64,
    /// `2^S - 1`: the nanoseconds of a reading into its tick.
    nanos_mask: u64,
    /// `F` and `S` as a [`Decision`](crate::Decision) packs them, so that building one
    /// computes nothing from them.
    decision_shifts: u64,
    /// Ticks after which any balance has refilled to `max_units`: `ceil(max_units / R)`.
    fill_ticks: u64,
    /// Tick differences `d <= forward_max` read as forward, the others as behind.
    forward_max: u64,
    tolerance_ticks: u64,
    /// Units at or below which a write may keep the current tick: `max_units - R - 1`
    /// (saturating). A write from or to more is anchored at the next tick edge.
    near_full: u64,
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layout")
            .field("capacity", &self.capacity)
            .field("tick_shift", &self.tick_shift)
            .field("tick_bits", &self.tick_bits())
            .field("frac_bits", &self.frac_bits)
            .field("refill_per_tick", &self.refill_per_tick)
            .field("base_units", &self.base_units)
            .field("max_units", &self.max_units)
            .finish()
    }
}

/// A bucket's state brought forward to a point in time: the result of
/// [`Layout::refill`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    units: u64,
    /// The tick this state is at, already shifted into the tick field.
    tick_field: u64,
    behind: u64,
}

/// What [`Layout::reserve_charge`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    /// The word to store.
    pub word: u64,
    /// Whole ticks after the snapshot's tick at which the reservation is ready (0: now).
    pub wait_ticks: u64,
    /// Units taken: the cost, or the cost and the refill excess at the ready edge when
    /// that excess is charged too.
    pub charged_units: u64,
    /// Units by which refill at the ready edge exceeds the debt up to and including this
    /// reservation (less than `R`; zero when charged).
    pub excess_units: u64,
}

/// What [`Layout::first_take`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstTake {
    /// Refused, read forward (`behind` zero): the balance, as
    /// [`Layout::balance_units`] gives it.
    Short { balance: i64 },
    /// The word to store, the balance after the take, and the snapshot's `behind`.
    Take {
        next: u64,
        balance: i64,
        behind: u64,
    },
    /// Neither: [`refill`](Layout::refill) and [`take`](Layout::take) decide.
    Elsewhere,
}

impl Snapshot {
    /// Units held, offset by the layout's base (see the module docs).
    #[inline]
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The tick (modulo 2^T) this state is at: `now`, or the stored tick when `now` was
    /// behind it.
    #[inline]
    pub fn tick(&self, layout: &Layout) -> u64 {
        self.tick_field >> layout.token_bits
    }

    /// How many ticks `now` was behind the stored tick; zero for a forward reading.
    ///
    /// Above [`Layout::tolerance_ticks`] this means the clock stepped back (or a bucket
    /// that was not full idled past half the wrap period): the state is the stored one,
    /// unchanged, and operations other than refunds refuse with a typed error.
    #[inline]
    pub fn behind(&self) -> u64 {
        self.behind
    }

    /// The packed word for this snapshot with `units` replaced.
    #[inline]
    pub(crate) fn with_units(&self, units: u64) -> u64 {
        self.tick_field | units
    }

    /// The word re-anchored for the tick wrap: this refilled state at its own tick, which
    /// refills exactly as the old word would (not anchored at the next tick edge, as a
    /// write near full is); `None` for a reading behind the stored tick, which keeps the
    /// word as it is.
    #[inline]
    pub(crate) fn reanchored(&self) -> Option<u64> {
        (self.behind == 0).then(|| self.with_units(self.units))
    }
}

impl Layout {
    /// Builds a layout from its free parameters, deriving the tick width: the token field
    /// gets the bits `base_units + capacity * 2^frac_bits + 1` needs (so that a field of
    /// all ones is never a balance: [`SEALED`]), and the tick
    /// field the rest.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] when a parameter is out of range or the token field would leave
    /// fewer than two tick bits.
    pub fn new(
        capacity: u64,
        tick_shift: u32,
        frac_bits: u32,
        refill_per_tick: u64,
        base_units: u64,
    ) -> Result<Layout, LayoutError> {
        if capacity == 0 {
            return Err(LayoutError::ZeroCapacity);
        }
        if refill_per_tick == 0 || refill_per_tick > MAX_REFILL_PER_TICK {
            return Err(LayoutError::RefillOutOfRange(refill_per_tick));
        }
        if tick_shift > MAX_TICK_SHIFT {
            return Err(LayoutError::TickShiftOutOfRange(tick_shift));
        }
        let capacity_units = capacity
            .checked_shl(frac_bits)
            .filter(|u| u >> frac_bits == capacity)
            .ok_or(LayoutError::TokensDoNotFit)?;
        let max_units = capacity_units
            .checked_add(base_units)
            .filter(|&u| u <= MAX_UNITS)
            .ok_or(LayoutError::TokensDoNotFit)?;
        // Room for `max_units + 1`: a token field of all ones is never a balance, so
        // `SEALED` is never a valid word.
        let token_bits = WORD_BITS - (max_units + 1).leading_zeros();
        let tick_bits = WORD_BITS - token_bits;
        let half_ticks = 1u64 << (tick_bits - 1);
        // Two ticks at least: a write near full stores the next tick edge (one tick ahead
        // of its own reading), and a lost race may add one more.
        let tolerance_ticks = (TOLERANCE_NANOS >> tick_shift)
            .max(MIN_TOLERANCE_TICKS)
            .min(half_ticks - 1);
        let window = (BACK_WINDOW_NANOS >> tick_shift).clamp(tolerance_ticks + 1, half_ticks);
        let tick_mask = u64::MAX >> token_bits;
        let fill_ticks = max_units.div_ceil(refill_per_tick);
        // A reading far behind the stored tick is read as an idle longer than the wrap
        // period less the back window: that must be long enough to fill any balance.
        if tolerance_ticks < MIN_TOLERANCE_TICKS
            || u128::from(tick_mask) + 1 < u128::from(window) + u128::from(fill_ticks)
        {
            return Err(LayoutError::WrapTooShort);
        }
        Ok(Layout {
            capacity,
            tick_shift,
            token_bits,
            frac_bits,
            refill_per_tick,
            base_units,
            max_units,
            token_mask: (1u64 << token_bits) - 1,
            tick_mask,
            nanos_mask: (1u64 << tick_shift) - 1,
            decision_shifts: crate::decision::pack_shifts(frac_bits, tick_shift),
            fill_ticks,
            forward_max: tick_mask - window,
            tolerance_ticks,
            near_full: max_units.saturating_sub(refill_per_tick.saturating_add(1)),
        })
    }

    /// Capacity `B` in whole tokens.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// `S`: a tick is `2^S` nanoseconds.
    #[inline]
    pub fn tick_shift(&self) -> u32 {
        self.tick_shift
    }

    /// The tick length, `2^S` nanoseconds. Refill arrives at tick edges.
    pub fn tick(&self) -> Duration {
        Duration::from_nanos(1u64 << self.tick_shift)
    }

    /// `T`: bits of the tick field.
    #[inline]
    pub fn tick_bits(&self) -> u32 {
        WORD_BITS - self.token_bits
    }

    /// `64 - T`: bits of the token field.
    #[inline]
    pub fn token_bits(&self) -> u32 {
        self.token_bits
    }

    /// `F`: one token is `2^F` units.
    #[inline]
    pub fn frac_bits(&self) -> u32 {
        self.frac_bits
    }

    /// `R`: units added per tick.
    #[inline]
    pub fn refill_per_tick(&self) -> u64 {
        self.refill_per_tick
    }

    /// Units the balance may go below zero for reservations (zero unless the policy
    /// allows reserving ahead).
    #[inline]
    pub fn base_units(&self) -> u64 {
        self.base_units
    }

    /// Units held by a full bucket: `base + capacity * 2^F`.
    #[inline]
    pub fn max_units(&self) -> u64 {
        self.max_units
    }

    /// Units above which a write is anchored at the next tick edge: `max_units - R - 1`
    /// (saturating), the balances within one tick's refill of full. See
    /// [`store`](Layout::store).
    #[inline]
    pub fn near_full_units(&self) -> u64 {
        self.near_full
    }

    /// Ticks after which any balance, however low, has refilled to full:
    /// `ceil(max_units / R)`.
    #[inline]
    pub fn fill_ticks(&self) -> u64 {
        self.fill_ticks
    }

    /// Whether the tick field wraps comfortably later than the bucket fills: after at
    /// least twice the fill time plus the back window. Every [`Policy`](crate::Policy)'s
    /// layout does, so an idle bucket reads its true balance for any idle shorter than
    /// the wrap period, and one idle longer than the fill time is full.
    pub fn wraps_comfortably(&self) -> bool {
        let wrap = 1u128 << self.tick_bits();
        wrap >= 2 * u128::from(self.fill_ticks) + u128::from(self.back_window_ticks())
    }

    /// Race tolerance: a `now` behind the stored tick by at most this many ticks is a
    /// lost race (or cross-core clock skew), not a clock stepping back.
    #[inline]
    pub fn tolerance_ticks(&self) -> u64 {
        self.tolerance_ticks
    }

    /// Ticks of the back window: a `now` up to this many ticks behind the stored tick is
    /// read as behind (a race or a clock step back), not as a forward wrap.
    pub fn back_window_ticks(&self) -> u64 {
        (u64::MAX >> self.token_bits) - self.forward_max
    }

    /// The exact refill rate this layout implements, in tokens per second:
    /// `R * 1e9 / 2^(S + F)`, rounded once to the nearest `f64`. Never above the
    /// configured rate: the exact value is not, and a single rounding keeps it so.
    pub fn effective_refill_per_second(&self) -> f64 {
        // `R * 1e9 < 2^92` is exact in `u128`; dividing by a power of two is exact.
        let scaled = u128::from(self.refill_per_tick) * 1_000_000_000;
        scaled as f64 / 2f64.powi((self.tick_shift + self.frac_bits) as i32)
    }

    /// The tick field wraps after `2^(T + S)` nanoseconds (saturating at `u64::MAX` ns,
    /// about 584 years, when the field cannot wrap within the clock's range).
    ///
    /// A bucket left untouched for longer than this reads its idle time modulo the wrap
    /// (see the [module docs](self)); never crediting more than the truth.
    pub fn wrap_period(&self) -> Duration {
        let bits = self.tick_bits() + self.tick_shift;
        if bits >= 64 {
            Duration::from_nanos(u64::MAX)
        } else {
            Duration::from_nanos(1u64 << bits)
        }
    }

    /// Nanoseconds from the start of the tick containing `nanos` to `nanos`.
    #[inline]
    pub(crate) fn nanos_into_tick(&self, nanos: u64) -> u64 {
        nanos & self.nanos_mask
    }

    /// `F` and `S` packed as a [`Decision`](crate::Decision) carries them.
    #[inline]
    pub(crate) fn decision_shifts(&self) -> u64 {
        self.decision_shifts
    }

    /// The tick containing `nanos`: `nanos >> S`.
    #[inline]
    pub fn tick_of(&self, nanos: u64) -> u64 {
        nanos >> self.tick_shift
    }

    /// Converts whole tokens to units. `None` when `tokens` is above the capacity: such a
    /// cost can never be paid (invariant I8).
    #[inline]
    pub fn units_of(&self, tokens: u64) -> Option<u64> {
        if tokens > self.capacity {
            None
        } else {
            Some(tokens << self.frac_bits)
        }
    }

    /// Packs `tick` (taken modulo 2^T) and `units` into a word; `None` when `units` is
    /// above [`max_units`](Layout::max_units).
    pub fn encode(&self, tick: u64, units: u64) -> Option<u64> {
        (units <= self.max_units).then(|| self.tick_field(tick) | units)
    }

    /// Unpacks a word into `(tick, units)`; `None` when its units are above
    /// [`max_units`](Layout::max_units), so a word from another layout is never misread
    /// as a larger balance.
    pub fn decode(&self, word: u64) -> Option<(u64, u64)> {
        let units = word & self.token_mask;
        (units <= self.max_units).then_some((word >> self.token_bits, units))
    }

    /// The word of a fresh bucket read at `now_tick`: full, or empty (balance zero),
    /// anchored at the next tick edge (`now_tick + 1`), so that the first refill comes a
    /// whole tick after the reading, never a sliver of one (see "Exact times" in the
    /// module docs).
    #[inline]
    pub fn start_word(&self, now_tick: u64, full: bool) -> u64 {
        let units = if full {
            self.max_units
        } else {
            self.base_units
        };
        self.tick_field(now_tick.wrapping_add(1)) | units
    }

    /// The word of the start state after `snapshot`: at the next tick edge, or at the
    /// stored tick when the snapshot reads behind it (the stored tick never moves back).
    #[inline]
    pub fn restart(&self, snapshot: &Snapshot, full: bool) -> u64 {
        let units = if full {
            self.max_units
        } else {
            self.base_units
        };
        if snapshot.behind != 0 {
            snapshot.tick_field | units
        } else {
            snapshot.tick_field.wrapping_add(1 << self.token_bits) | units
        }
    }

    /// The word to store after an operation on `snapshot` leaves `units`: at the
    /// snapshot's tick, or at the next tick edge when the balance before or after the
    /// operation is within one tick's refill of full (`> max_units - R - 1`).
    ///
    /// Why: the stored tick stands for its start, earlier than the reading. Refill
    /// credited from the tick's start is refill the ideal bucket also had, unless the
    /// ideal bucket was full in between (refill past the cap is lost): near full, the
    /// write anchors at the next edge instead, so a later refill credits only whole ticks
    /// after the reading. A snapshot read behind its stored tick keeps that tick: its
    /// state is the stored one, dated just after the write that stored it. So the stored
    /// tick never moves back (I2) and never more than one tick ahead of a reading.
    #[inline]
    pub fn store(&self, snapshot: &Snapshot, units: u64) -> u64 {
        self.store_after(snapshot, snapshot.units, units)
    }

    /// [`store`](Layout::store) for an operation whose balance before the final take was
    /// `before` rather than the snapshot's (an exchange that first takes back given
    /// tokens, then pays): the anchor looks at the highest balance the operation held.
    #[inline]
    pub fn store_after(&self, snapshot: &Snapshot, before: u64, units: u64) -> u64 {
        if snapshot.behind != 0
            || before.max(units) <= self.near_full
            || mutant!(NEAR_FULL_WRITE_KEEPS_TICK)
        {
            snapshot.tick_field | units
        } else {
            snapshot.tick_field.wrapping_add(1 << self.token_bits) | units
        }
    }

    #[inline]
    fn tick_field(&self, tick: u64) -> u64 {
        tick << self.token_bits
    }

    /// Brings `word` forward to `now_tick`: `units = min(max, units + elapsed * R)`.
    ///
    /// Exact on the tick grid (I3): refilling to `t1` then to `t2` gives the same units as
    /// refilling to `t2` at once. A `now_tick` behind the stored tick adds nothing and
    /// keeps the stored tick (I2); see the module docs for how "behind" is read.
    #[inline]
    pub fn refill(&self, word: u64, now_tick: u64) -> Snapshot {
        let stored = word & !self.token_mask;
        let units = word & self.token_mask;
        // Ticks from the stored tick to `now_tick`, modulo 2^T.
        let elapsed = now_tick.wrapping_sub(word >> self.token_bits) & self.tick_mask;
        if elapsed <= self.forward_max {
            if elapsed == 0 {
                // Same tick: nothing to add. A branch, not a select, so that under load
                // (many decisions per tick) the new word depends on the loaded one only,
                // not on the clock reading's arithmetic (measured: BENCHMARKS.md).
                return Snapshot {
                    units: units.min(self.max_units),
                    tick_field: stored,
                    behind: 0,
                };
            }
            // `min(elapsed, fill_ticks) * R < max_units + R`, so the sum cannot overflow.
            let added = elapsed.min(self.fill_ticks) * self.refill_per_tick;
            return Snapshot {
                units: (units + added).min(self.max_units),
                tick_field: self.tick_field(now_tick),
                behind: 0,
            };
        }
        if elapsed == self.tick_mask {
            // The next edge, where a write near full anchored: also nothing to add, and
            // the path of every decision under load near full. A branch of its own, with
            // a constant `behind`, for the same reason.
            return Snapshot {
                units: units.min(self.max_units),
                tick_field: stored,
                behind: 1,
            };
        }
        self.behind(stored, units, self.tick_field(now_tick))
    }

    #[inline]
    fn behind(&self, stored: u64, units: u64, now: u64) -> Snapshot {
        if mutant!(STALE_NOW_MOVES_TICK_BACK) {
            return Snapshot {
                units,
                tick_field: now,
                behind: stored.wrapping_sub(now) >> self.token_bits,
            };
        }
        Snapshot {
            units: units.min(self.max_units),
            tick_field: stored,
            behind: stored.wrapping_sub(now) >> self.token_bits,
        }
    }

    /// A snapshot read far behind its stored tick, at a reading known to be later than
    /// every reading stored in the word (taken after loading it, from a monotonic clock):
    /// the tick field wrapped, so the bucket idled for at least the wrap period less the
    /// back window, which every layout makes longer than the fill time (else
    /// [`LayoutError::WrapTooShort`]). The bucket is full: re-anchored full at the next
    /// tick edge after `now_tick`, adding nothing a full bucket would not hold.
    #[inline]
    pub fn reanchor_full(&self, now_tick: u64) -> Snapshot {
        Snapshot {
            units: self.max_units,
            tick_field: self.tick_field(now_tick.wrapping_add(1)),
            behind: 0,
        }
    }

    /// Whether [`take`](Layout::take) would pay `cost_units` from a snapshot, without
    /// forming the word it would store (for read-only first passes).
    #[inline]
    pub fn can_take(&self, snapshot: &Snapshot, cost_units: u64) -> bool {
        snapshot
            .units
            .checked_sub(cost_units)
            .is_some_and(|left| left >= self.base_units)
    }

    /// The units `word` holds at `now_tick` (refilled, not capped at `max_units`) when the
    /// reading is at or forward of the stored tick, else `None`. Below any `base +
    /// cost_units` (at most `max_units`) it is what [`refill`](Layout::refill) holds,
    /// and at or above it so is `refill`'s: a read-only refusal decides on it alone.
    /// On [`SEALED`] it is above `max_units` (a token field of all ones), never short.
    #[inline(always)]
    pub(crate) fn forward_units(&self, word: u64, now_tick: u64) -> Option<u64> {
        let elapsed = now_tick.wrapping_sub(word >> self.token_bits) & self.tick_mask;
        // As in `refill`: `min(elapsed, fill_ticks) * R < max_units + R`.
        (elapsed <= self.forward_max)
            .then(|| (word & self.token_mask) + elapsed.min(self.fill_ticks) * self.refill_per_tick)
    }

    /// A take of `cost_units` (at most `capacity * 2^F`) decided on `word` at `now_tick`
    /// where that is simple: a reading at or forward of the stored tick, or one tick
    /// behind a word anchored at the next edge (see [`store`](Layout::store)). The same
    /// answer as [`refill`](Layout::refill) then [`take`](Layout::take) there, in fewer
    /// steps: a refusal is found before the snapshot is formed, and a balance short of
    /// such a cost needs no cap at `max_units`.
    #[inline(always)]
    pub(crate) fn first_take(&self, word: u64, now_tick: u64, cost_units: u64) -> FirstTake {
        let elapsed = now_tick.wrapping_sub(word >> self.token_bits) & self.tick_mask;
        let units = word & self.token_mask;
        // At most `max_units`: `base + cost_units` cannot overflow, and a balance below
        // it is below the cap.
        let need = self.base_units + cost_units;
        if elapsed <= self.forward_max {
            // As in `refill`: `min(elapsed, fill_ticks) * R < max_units + R`.
            let held = units + elapsed.min(self.fill_ticks) * self.refill_per_tick;
            if held < need {
                return FirstTake::Short {
                    balance: held as i64 - self.base_units as i64,
                };
            }
            if elapsed == 0 {
                // Same tick: a path of its own, so that under load (many decisions per
                // tick) the new word depends on the loaded one only (see `refill`).
                return self.take_at(word & !self.token_mask, units, cost_units, 0);
            }
            return self.take_at(self.tick_field(now_tick), held, cost_units, 0);
        }
        if elapsed == self.tick_mask && units.min(self.max_units) >= need {
            return self.take_at(word & !self.token_mask, units, cost_units, 1);
        }
        FirstTake::Elsewhere
    }

    /// [`FirstTake::Take`] of `cost_units` from `units` (capped) at `tick_field`.
    #[inline(always)]
    fn take_at(&self, tick_field: u64, units: u64, cost_units: u64, behind: u64) -> FirstTake {
        let snapshot = Snapshot {
            units: units.min(self.max_units),
            tick_field,
            behind,
        };
        let left = snapshot.units - cost_units;
        FirstTake::Take {
            next: self.store(&snapshot, left),
            balance: left as i64 - self.base_units as i64,
            behind,
        }
    }

    /// Takes `cost_units` from a snapshot: the new word, or `None` when the balance is
    /// below the cost, however large the cost (a rejection writes nothing, I5).
    #[inline]
    pub fn take(&self, snapshot: &Snapshot, cost_units: u64) -> Option<u64> {
        // `units - cost >= base`, without forming `base + cost` (which may overflow).
        let left = snapshot.units.checked_sub(cost_units)?;
        (left >= self.base_units).then(|| self.store(snapshot, left))
    }

    /// Takes as much as possible between `min_units` and `max_units_wanted` from a
    /// snapshot (for leasing batches): the new word and the units taken, or `None` when
    /// fewer than `min_units` are available.
    #[inline]
    pub fn take_up_to(
        &self,
        snapshot: &Snapshot,
        min_units: u64,
        max_units_wanted: u64,
    ) -> Option<(u64, u64)> {
        let available = snapshot.units.checked_sub(self.base_units)?;
        if available < min_units {
            return None;
        }
        let taken = available.min(max_units_wanted.max(min_units));
        Some((self.store(snapshot, snapshot.units - taken), taken))
    }

    /// Gives `units` back: `min(max, units + refund)`, the state the bucket would have
    /// had without the admission (I6), when the balance is zero or above. While the
    /// balance is below zero (reservations are owed, see the module docs) a refund gives
    /// nothing back: the debt may belong to reservations whose ready times are fixed, and
    /// tokens credited ahead of them would be refilled again while they wait (the word
    /// stays as it is, refilled to the snapshot).
    #[inline]
    pub fn refund(&self, snapshot: &Snapshot, units: u64) -> u64 {
        if mutant!(REFUND_SKIPS_CAP) {
            return snapshot.with_units(snapshot.units.saturating_add(units) & self.token_mask);
        }
        if snapshot.units < self.base_units {
            return self.store(snapshot, snapshot.units);
        }
        self.store(
            snapshot,
            snapshot.units.saturating_add(units).min(self.max_units),
        )
    }

    /// Cancels a reservation before its ready edge `ready_tick` (modulo 2^T): gives
    /// its charge back when no reservation was made after it, else nothing.
    ///
    /// The debt the reservation and those before it owe at the snapshot is exactly
    /// `(ready_tick - tick) * R - excess` ([`Reserved`]), and each later reservation adds
    /// its cost. A debt no larger than that has nobody behind this reservation: the
    /// charge comes back, and the word holds exactly what it would without the
    /// reservation. A larger debt has later holders, whose ready times are fixed:
    /// crediting the charge would let the bucket refill past them while they wait (up to
    /// 2B at one instant when they proceed), so the tokens count as used. A snapshot at
    /// or after `ready_tick` gives nothing back either.
    pub fn cancel(&self, snapshot: &Snapshot, reserved: &Reserved, ready_tick: u64) -> u64 {
        let tick = snapshot.tick_field >> self.token_bits;
        let ahead = ready_tick.wrapping_sub(tick) & self.tick_mask;
        if ahead == 0 || ahead > self.forward_max {
            return self.store(snapshot, snapshot.units);
        }
        let place = (u128::from(ahead) * u128::from(self.refill_per_tick))
            .saturating_sub(u128::from(reserved.excess_units));
        let debt = u128::from(self.base_units.saturating_sub(snapshot.units));
        if debt > place {
            return self.store(snapshot, snapshot.units);
        }
        self.store(
            snapshot,
            snapshot
                .units
                .saturating_add(reserved.charged_units)
                .min(self.max_units),
        )
    }

    /// Reserves `cost_units`, possibly into the future: the new word and the number of
    /// whole ticks after the snapshot's tick at which the reservation is ready (0 when
    /// the tokens are there now). `None` when the reservation would exceed the debt the
    /// layout allows or wait more than `max_wait_ticks`.
    ///
    /// A reservation that waits is ready at the first tick edge where refill has paid the
    /// debt up to and including it; refill then holds a little more than the debt (less
    /// than one tick's refill `R`), which goes to the next holder. Where the holder's
    /// cost plus that excess would be more than a full bucket (an ideal bucket would have
    /// lost the excess to its cap while the holder waited), the excess is charged too:
    /// the debt after the reservation is a whole number of ticks of refill, and the next
    /// holder waits whole ticks for its own cost. So every holder is ready no earlier
    /// than an ideal bucket could pay it. [`reserve_charge`](Layout::reserve_charge) says
    /// what was charged; [`cancel`](Layout::cancel) gives it back.
    pub fn reserve(
        &self,
        snapshot: &Snapshot,
        cost_units: u64,
        max_wait_ticks: u64,
    ) -> Option<(u64, u64)> {
        let r = self.reserve_charge(snapshot, cost_units, max_wait_ticks)?;
        Some((r.word, r.wait_ticks))
    }

    /// [`reserve`](Layout::reserve), with what was charged and where the reservation
    /// stands in the debt.
    pub fn reserve_charge(
        &self,
        snapshot: &Snapshot,
        cost_units: u64,
        max_wait_ticks: u64,
    ) -> Option<Reserved> {
        let units = snapshot.units.checked_sub(cost_units)?;
        let word = self.store(snapshot, units);
        // A write near full anchors at the next edge: refill, and so the wait, starts there.
        let anchored = u64::from(word & !self.token_mask != snapshot.tick_field);
        let owed = self.ticks_until(units, 0);
        if owed == 0 {
            return Some(Reserved {
                word,
                wait_ticks: 0,
                charged_units: cost_units,
                excess_units: 0,
            });
        }
        let wait_ticks = owed.saturating_add(anchored);
        if wait_ticks > max_wait_ticks {
            return None;
        }
        // Refill at the ready edge, from the word's tick: at least the debt, by less than R.
        let paid = owed.checked_mul(self.refill_per_tick)?;
        let excess = paid - (self.base_units - units);
        // A policy's allowance is whole ticks of refill, so the charge always fits it
        // (a bare layout whose allowance is not keeps the excess).
        let capacity_units = self.max_units - self.base_units;
        let (units, excess) = match self.base_units.checked_sub(paid) {
            Some(charged) if cost_units + excess > capacity_units => (charged, 0),
            _ => (units, excess),
        };
        Some(Reserved {
            word: (word & !self.token_mask) | units,
            wait_ticks,
            charged_units: snapshot.units - units,
            excess_units: excess,
        })
    }

    /// Whole ticks until a balance of `units` (offset units) can pay `cost_units`:
    /// `ceil((base + cost - units) / R)`, 0 when it already can, saturating at
    /// `u64::MAX`. Uses a division: call it off the hot path.
    #[inline]
    pub fn ticks_until(&self, units: u64, cost_units: u64) -> u64 {
        let needed = (u128::from(self.base_units) + u128::from(cost_units))
            .saturating_sub(u128::from(units));
        u64::try_from(needed.div_ceil(u128::from(self.refill_per_tick))).unwrap_or(u64::MAX)
    }

    /// The balance a snapshot holds, in units (negative while reservations are owed).
    #[inline]
    pub fn balance_units(&self, snapshot: &Snapshot) -> i64 {
        snapshot.units as i64 - self.base_units as i64
    }

    /// Converts a balance in units to tokens.
    #[inline]
    pub fn units_to_tokens(&self, units: i64) -> f64 {
        units as f64 / (1u64 << self.frac_bits) as f64
    }

    /// Whether a snapshot is full.
    #[inline]
    pub fn is_full(&self, snapshot: &Snapshot) -> bool {
        snapshot.units >= self.max_units
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        // The worked example of the design notes: B = 100, r = 20/s, F = 17, S = 19.
        Layout::new(100, 19, 17, 1374, 0).unwrap()
    }

    #[test]
    fn worked_example_has_forty_tick_bits() {
        let l = layout();
        assert_eq!(l.token_bits(), 24);
        assert_eq!(l.tick_bits(), 40);
        assert_eq!(l.max_units(), 100 << 17);
        let years = l.wrap_period().as_secs_f64() / (365.25 * 86400.0);
        assert!((18.0..18.5).contains(&years), "{years}");
    }

    #[test]
    fn encode_decode_round_trips_and_rejects_out_of_range_units() {
        let l = layout();
        let w = l.encode(12345, 777).unwrap();
        assert_eq!(l.decode(w), Some((12345, 777)));
        assert_eq!(l.encode(1, l.max_units() + 1), None);
        assert_eq!(l.decode(l.max_units() + 1), None);
        // The tick is taken modulo 2^T.
        let w = l.encode((1 << 40) + 5, 0).unwrap();
        assert_eq!(l.decode(w), Some((5, 0)));
    }

    #[test]
    fn refill_in_steps_equals_refill_at_once() {
        let l = layout();
        // A fresh bucket read at tick 1000 is anchored at the next edge.
        let w0 = l.start_word(1000, false);
        assert_eq!(l.decode(w0), Some((1001, 0)));
        let mut w = w0;
        for t in 1001..=1100 {
            w = l.refill(w, t).with_units(l.refill(w, t).units);
        }
        assert_eq!(w, l.refill(w0, 1100).with_units(l.refill(w0, 1100).units));
        assert_eq!(l.refill(w0, 1100).units, 99 * 1374);
    }

    #[test]
    fn same_tick_refill_keeps_the_word_and_never_exceeds_the_capacity() {
        let l = layout();
        let w = l.encode(5000, 10).unwrap();
        let s = l.refill(w, 5000);
        assert_eq!((s.units(), s.tick(&l), s.behind()), (10, 5000, 0));
        // A word with more units than the layout allows (not one a bucket writes) is
        // still read as at most full.
        let over = (5000u64 << l.token_bits()) | (l.max_units() + 1);
        assert_eq!(l.refill(over, 5000).units(), l.max_units());
    }

    #[test]
    fn stale_now_within_tolerance_adds_nothing_and_keeps_the_tick() {
        let l = layout();
        let w = l.encode(5000, 10).unwrap();
        let s = l.refill(w, 4999);
        assert_eq!(s.units(), 10);
        assert_eq!(s.tick(&l), 5000);
        assert_eq!(s.behind(), 1);
    }

    #[test]
    fn step_back_inside_the_window_reads_as_behind_and_beyond_it_as_forward() {
        let l = layout();
        let window = l.back_window_ticks();
        assert_eq!(window, 1 << (46 - 19));
        let w = l.encode(1 << 30, 10).unwrap();
        let s = l.refill(w, (1 << 30) - window);
        assert_eq!((s.units(), s.tick(&l), s.behind()), (10, 1 << 30, window));
        // One tick further back is the far end of the wrap: forward, and full.
        let s = l.refill(w, (1 << 30) - window - 1);
        assert_eq!(s.behind(), 0);
        assert_eq!(s.units(), l.max_units());
    }

    #[test]
    fn take_refuses_a_cost_beyond_the_word_without_overflowing() {
        // With reservation debt, `base + cost` overflowed for costs near 2^64: a panic in
        // debug builds, and in release a wrapped sum that admitted and corrupted the word.
        let l = Layout::new(100, 19, 17, 1 << 20, 1 << 40).unwrap();
        let s = l.refill(l.start_word(7, true), 7);
        for cost in [u64::MAX, u64::MAX - (1 << 40) + 1, l.max_units() + 1] {
            assert_eq!(l.take(&s, cost), None, "cost {cost}");
            assert!(!l.can_take(&s, cost), "cost {cost}");
        }
        // `can_take` agrees with `take` on every cost around the balance.
        let half = l.refill(l.encode(7, (1 << 40) + (50 << 17)).unwrap(), 7);
        for cost in [
            0,
            1,
            49 << 17,
            (50 << 17) - 1,
            50 << 17,
            (50 << 17) + 1,
            100 << 17,
        ] {
            assert_eq!(
                l.can_take(&half, cost),
                l.take(&half, cost).is_some(),
                "{cost}"
            );
        }
        // Full, anchored at the next edge (tick 8): read at tick 7, the take keeps it.
        assert_eq!(
            l.take(&s, 100 << 17),
            l.encode(8, 1 << 40),
            "the whole capacity still pays"
        );
    }

    #[test]
    fn ticks_until_saturates_instead_of_wrapping() {
        // `base + cost` wrapped for huge costs and gave a short wait.
        let l = Layout::new(1, 0, 0, 1, 1).unwrap();
        assert_eq!(l.ticks_until(0, u64::MAX), u64::MAX);
        let l = Layout::new(100, 19, 17, 1 << 20, 1 << 40).unwrap();
        let exact = ((1u128 << 40) + u128::from(u64::MAX)).div_ceil(1 << 20);
        assert_eq!(u128::from(l.ticks_until(0, u64::MAX)), exact);
        assert_eq!(l.ticks_until(l.max_units(), 100 << 17), 0);
    }

    #[test]
    fn elapsed_refill_saturates_without_overflow() {
        let l = Layout::new(1, 0, 0, MAX_REFILL_PER_TICK, 0).unwrap();
        let w = l.start_word(0, false);
        assert_eq!(l.refill(w, (1 << 61) - 1).units(), l.max_units());
    }

    /// What [`Layout::first_take`] must agree with: the snapshot's take, its balance
    /// after the take (or before, refused), and its `behind`.
    fn by_refill(l: &Layout, word: u64, now_tick: u64, cost_units: u64) -> FirstTake {
        let s = l.refill(word, now_tick);
        match l.take(&s, cost_units) {
            Some(next) => FirstTake::Take {
                next,
                balance: l.balance_units(&s) - cost_units as i64,
                behind: s.behind(),
            },
            None => FirstTake::Short {
                balance: l.balance_units(&s),
            },
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 20_000,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// `first_take` decides as `refill` then `take` wherever it decides: the same
        /// word, balance and `behind`; a refusal only on a forward reading; `Elsewhere`
        /// only behind the stored tick (a next-edge refusal included).
        #[test]
        fn first_take_equals_refill_then_take(
            capacity in proptest::prop_oneof![1u64..10, 1u64..1_000_000_000],
            rate_exp in -3.0f64..9.0,
            reserve_ms in proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..10_000],
            word_tick in proptest::prelude::any::<u64>(),
            units_share in 0u64..=1_000,
            ahead in proptest::prop_oneof![
                0u64..4,
                proptest::prelude::any::<u64>(),
                (u64::MAX - 4)..=u64::MAX,
            ],
            cost_share in 1u64..=1_000,
            units_at_cost in proptest::prelude::any::<bool>(),
        ) {
            let policy = crate::Policy::builder(capacity, 10f64.powf(rate_exp))
                .max_reservation(std::time::Duration::from_millis(reserve_ms))
                .build();
            let Ok(policy) = policy else {
                return Ok(());
            };
            let l = *policy.layout();
            let cost = (capacity * cost_share).div_ceil(1_000).max(1);
            let cost_units = l.units_of(cost).unwrap();
            let units = if units_at_cost {
                // Exactly the cost: the edge between a take and a refusal.
                l.base_units() + cost_units
            } else {
                (l.max_units() as u128 * units_share as u128 / 1_000) as u64
            };
            let word = l.encode(word_tick, units).unwrap();
            let now_tick = word_tick.wrapping_add(ahead);
            let expected = by_refill(&l, word, now_tick, cost_units);
            let snapshot = l.refill(word, now_tick);
            // `forward_units`, capped, is `refill`'s balance wherever it answers (a
            // forward reading, `behind` zero).
            if let Some(units) = l.forward_units(word, now_tick) {
                proptest::prop_assert_eq!(snapshot.behind(), 0);
                proptest::prop_assert_eq!(units.min(l.max_units()), snapshot.units());
            }
            // A sealed word is never short of any cost (a refusal on it would be wrong).
            if let Some(units) = l.forward_units(SEALED, now_tick) {
                proptest::prop_assert!(units > l.max_units());
            }
            match l.first_take(word, now_tick, cost_units) {
                FirstTake::Elsewhere => {
                    let refused = matches!(expected, FirstTake::Short { .. });
                    proptest::prop_assert!(
                        snapshot.behind() > 1 || (snapshot.behind() == 1 && refused),
                        "elsewhere at behind {}", snapshot.behind()
                    );
                }
                FirstTake::Short { balance } => {
                    proptest::prop_assert_eq!(snapshot.behind(), 0);
                    proptest::prop_assert_eq!(FirstTake::Short { balance }, expected);
                }
                take => {
                    proptest::prop_assert!(snapshot.behind() <= 1);
                    proptest::prop_assert_eq!(take, expected);
                }
            }
        }
    }
}
