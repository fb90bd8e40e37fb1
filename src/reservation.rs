//! Delay instead of reject: reserving tokens ahead, in time order.
//!
//! A policy built with [`max_reservation`](crate::PolicyBuilder::max_reservation) lets a
//! bucket's balance go below zero, down to `-max_reservation * r`. [`Bucket::reserve`]
//! takes the cost at once, possibly into that debt, and says when the caller may proceed:
//! the tick edge at which refill has paid the debt back. Every later request, a
//! [`try_acquire`](Bucket::try_acquire) or another reservation, sees the debt and waits
//! behind it, so reservations are served first come, first served, at the refill rate,
//! with no queue and no lock: the queue *is* the negative balance in the packed word (see
//! [`state`](crate::state#reservations-debt-below-zero)).
//!
//! A reservation is exact on the tick grid. With nothing else happening to the bucket:
//!
//! - at [`ready_at`](Reservation::ready_at) the balance is back at zero or above, and one
//!   nanosecond earlier it is still below zero;
//! - cancelling it (or dropping it) before then, when no reservation was made after it,
//!   gives its whole charge back: exactly the state the bucket would have had without it
//!   (invariant I6). With a later reservation queued behind it, nothing comes back (see
//!   [`Reservation::cancel`]);
//! - a reservation that would wait longer than its `max_wait` or the policy's horizon
//!   fails at once and writes nothing.
//!
//! Waiting is left to the caller, so the same reservation serves threads, async tasks and
//! simulations: sleep for [`remaining`](Reservation::remaining) with whatever timer the
//! runtime has (for example `tokio::time::sleep(reservation.remaining()).await`), or call
//! [`Bucket::acquire`], which reserves and sleeps the thread.

use std::fmt;
use std::time::Duration;

use crate::bucket::Bucket;
use crate::clock::{Clock, QuantaClock};
use crate::decision::duration_from_nanos;
use crate::error::AcquireError;
pub use crate::sleep::{Sleep, ThreadSleep};
use crate::state::{Layout, Reserved, Snapshot};

/// Why [`Bucket::reserve`] refused. Nothing was taken and nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// The cost is above the bucket's capacity: no wait could pay it (invariant I8).
    CostExceedsCapacity {
        /// The cost asked for, in tokens.
        cost: u64,
        /// The bucket's capacity, in tokens.
        capacity: u64,
    },
    /// The cost would be available only after more than the caller's `max_wait`.
    ExceedsMaxWait {
        /// How long the reservation would have waited (exact on the tick grid).
        wait: Duration,
        /// The caller's limit.
        max_wait: Duration,
    },
    /// The cost would be available only after more than the policy allows reserving
    /// ahead ([`Policy::max_reservation`](crate::Policy::max_reservation); zero unless set
    /// with [`PolicyBuilder::max_reservation`](crate::PolicyBuilder::max_reservation)).
    ExceedsHorizon {
        /// How long the reservation would have waited (exact on the tick grid).
        wait: Duration,
        /// The policy's reservation horizon.
        horizon: Duration,
    },
    /// The clock read well behind the bucket's last update (see
    /// [`AcquireError::ClockWentBackwards`]; never returned by the crate's own limiters).
    ClockWentBackwards {
        /// How far behind the bucket's last update the clock read.
        by: Duration,
    },
    /// A leased bucket's pool could not decide (see
    /// [`AcquireError::PoolUnavailable`]).
    PoolUnavailable {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl ReserveError {
    /// For a wait beyond a limit, by how much the wait exceeds it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::reservation::ReserveError;
    /// let e = ReserveError::ExceedsMaxWait {
    ///     wait: Duration::from_millis(1500),
    ///     max_wait: Duration::from_secs(1),
    /// };
    /// assert_eq!(e.excess(), Some(Duration::from_millis(500)));
    /// ```
    pub fn excess(&self) -> Option<Duration> {
        match *self {
            ReserveError::ExceedsMaxWait { wait, max_wait } => Some(wait.saturating_sub(max_wait)),
            ReserveError::ExceedsHorizon { wait, horizon } => Some(wait.saturating_sub(horizon)),
            _ => None,
        }
    }
}

impl From<AcquireError> for ReserveError {
    fn from(e: AcquireError) -> ReserveError {
        match e {
            AcquireError::CostExceedsCapacity { cost, capacity } => {
                ReserveError::CostExceedsCapacity { cost, capacity }
            }
            AcquireError::ClockWentBackwards { by } => ReserveError::ClockWentBackwards { by },
            AcquireError::PoolUnavailable { retry_after } => {
                ReserveError::PoolUnavailable { retry_after }
            }
        }
    }
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReserveError::CostExceedsCapacity { cost, capacity } => {
                AcquireError::CostExceedsCapacity { cost, capacity }.fmt(f)
            }
            ReserveError::ClockWentBackwards { by } => {
                AcquireError::ClockWentBackwards { by }.fmt(f)
            }
            ReserveError::PoolUnavailable { retry_after } => {
                AcquireError::PoolUnavailable { retry_after }.fmt(f)
            }
            ReserveError::ExceedsMaxWait { wait, max_wait } => write!(
                f,
                "the reservation would wait {wait:?}, {:?} more than the maximum wait of \
                 {max_wait:?}; nothing was taken",
                wait.saturating_sub(max_wait)
            ),
            ReserveError::ExceedsHorizon { wait, horizon } => write!(
                f,
                "the reservation would wait {wait:?}, {:?} beyond the policy's reservation \
                 horizon of {horizon:?} (PolicyBuilder::max_reservation); nothing was taken",
                wait.saturating_sub(horizon)
            ),
        }
    }
}

impl std::error::Error for ReserveError {}

/// Tokens taken ahead of time: the caller may proceed at [`ready_at`](Reservation::ready_at).
///
/// Made by [`Bucket::reserve`]. The cost is already taken from the bucket; what happens to
/// it depends on how the reservation ends:
///
/// | ends by                     | before `ready_at`                | at or after `ready_at` |
/// |-----------------------------|----------------------------------|------------------------|
/// | [`consume`](Self::consume)  | kept (the caller proceeds early) | kept                   |
/// | [`cancel`](Self::cancel)    | given back exactly (I6)          | kept: it was used      |
/// | drop                        | given back exactly (I6)          | kept: it was used      |
///
/// So a caller that waits and proceeds may simply drop it; a caller that gives up early
/// gets the tokens back by dropping it too. A reservation whose tokens were there at once
/// is ready at once and behaves as an admission: give such tokens back with
/// [`Bucket::refund`] if the work does not run.
///
/// Cancelling is exact only for the last reservation in the queue: it gives the whole
/// charge back, and the bucket is as if it had never reserved. A reservation with later
/// ones behind it gives nothing back: their promised times stand, and tokens credited
/// ahead of them would be refilled again while they wait (their holders and a
/// `try_acquire` could then take `2B` at one instant). Its tokens count as used, as if
/// its holder had proceeded at its ready time. [`Bucket::refund`] likewise gives nothing
/// back while the balance is below zero.
///
/// Ready times are exact: with nothing else happening, every holder and every admission
/// stays under `B + r * (e - s)` for all real times `s <= e`. A holder is ready at the
/// tick edge where refill has paid the debt up to and including it; when its cost plus
/// the refill beyond that debt (less than one tick's) is more than a full bucket, that
/// excess is charged too, so the next holder is at least `ceil(cost * 2^F / R)` ticks
/// later, never closer than the refill rate allows.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{Bucket, ManualClock, Policy};
///
/// let policy = Policy::builder(10, 10.0)
///     .max_reservation(Duration::from_secs(1))
///     .build()?;
/// let clock = ManualClock::new();
/// let bucket = Bucket::with_clock(policy, clock.clone());
/// bucket.try_acquire(10)?; // drained
///
/// let reservation = bucket.reserve(5, Duration::from_secs(1))?;
/// // 5 tokens at 10/s: half a second, rounded up to the bucket's tick grid.
/// assert!(reservation.wait() >= Duration::from_millis(500));
/// assert!(reservation.wait() < Duration::from_millis(500) + policy.tick() * 2);
/// assert!(bucket.available() < 0.0); // the debt queues later requests
///
/// clock.set(reservation.ready_at());
/// assert!(reservation.is_ready());
/// assert!(bucket.available() >= 0.0);
/// reservation.consume();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a reservation before its time gives the tokens back"]
pub struct Reservation<'a, C: Clock = QuantaClock> {
    bucket: &'a Bucket<C>,
    cost: u64,
    /// What the reservation charged and where it stands in the debt: what a cancel
    /// before the ready time may give back.
    reserved: Reserved,
    reserved_at: u64,
    ready_at: u64,
    settled: bool,
}

impl<C: Clock> fmt::Debug for Reservation<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("cost", &self.cost)
            .field("reserved_at", &self.reserved_at())
            .field("ready_at", &self.ready_at())
            .field("settled", &self.settled)
            .finish()
    }
}

impl<C: Clock> Reservation<'_, C> {
    /// The cost reserved, in tokens.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The clock reading (time since the clock's origin) the reservation was decided at.
    pub fn reserved_at(&self) -> Duration {
        Duration::from_nanos(self.reserved_at)
    }

    /// The clock time (since the clock's origin) from which the caller may proceed: a tick
    /// edge of the bucket, or [`reserved_at`](Self::reserved_at) when the tokens were there
    /// at once.
    pub fn ready_at(&self) -> Duration {
        Duration::from_nanos(self.ready_at)
    }

    /// The wait the reservation promised: from [`reserved_at`](Self::reserved_at) to
    /// [`ready_at`](Self::ready_at), exact on the bucket's tick grid. Fixed once reserved.
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.ready_at - self.reserved_at)
    }

    /// The time left from the clock's current reading to [`ready_at`](Self::ready_at)
    /// (zero once ready): what to sleep, with any timer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Bucket, ManualClock, Policy};
    /// let policy = Policy::builder(1, 1.0).max_reservation(Duration::from_secs(2)).build()?;
    /// let clock = ManualClock::new();
    /// let bucket = Bucket::with_clock(policy.start_empty(), clock.clone());
    /// let r = bucket.reserve(1, Duration::from_secs(2))?;
    /// clock.advance(Duration::from_millis(400));
    /// assert_eq!(r.remaining(), r.wait() - Duration::from_millis(400));
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(r.remaining(), Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remaining(&self) -> Duration {
        Duration::from_nanos(
            self.ready_at
                .saturating_sub(self.bucket.clock().now_nanos()),
        )
    }

    /// Whether the clock has reached [`ready_at`](Self::ready_at).
    pub fn is_ready(&self) -> bool {
        self.bucket.clock().now_nanos() >= self.ready_at
    }

    /// Keeps the tokens, whatever the time: the caller proceeds (or has proceeded).
    pub fn consume(mut self) {
        self.settled = true;
    }

    /// Before [`ready_at`](Self::ready_at) (returns `true`): gives the whole charge back,
    /// exactly as if the reservation had never been made (I6), when no reservation was
    /// made after it; with later ones queued behind it, gives nothing back (see the type's
    /// docs). At or after `ready_at` the tokens count as used and nothing changes
    /// (returns `false`). Dropping the reservation does the same.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Bucket, ManualClock, Policy};
    /// let policy = Policy::builder(4, 2.0).max_reservation(Duration::from_secs(5)).build()?;
    /// let bucket = Bucket::with_clock(policy, ManualClock::new());
    /// let r = bucket.reserve(4, Duration::ZERO)?; // there at once: ready, an admission
    /// assert!(!r.cancel());
    /// assert_eq!(bucket.available(), 0.0);
    /// let r = bucket.reserve(3, Duration::from_secs(2))?; // 1.5 s ahead
    /// assert_eq!(bucket.available(), -3.0);
    /// assert!(r.cancel());
    /// assert_eq!(bucket.available(), 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(mut self) -> bool {
        self.settle()
    }

    fn settle(&mut self) -> bool {
        if std::mem::replace(&mut self.settled, true) {
            return false;
        }
        let clock = self.bucket.guarded_clock();
        let now = self.bucket.now();
        if now >= self.ready_at || self.reserved.charged_units == 0 {
            return false;
        }
        let layout = self.bucket.policy().layout();
        let ready_tick = layout.tick_of(self.ready_at);
        self.bucket
            .raw()
            .cancel_units(layout, clock, now, &self.reserved, ready_tick);
        true
    }
}

impl<C: Clock> Drop for Reservation<'_, C> {
    /// Before [`ready_at`](Reservation::ready_at): gives the tokens back (as
    /// [`cancel`](Reservation::cancel)); after: nothing.
    fn drop(&mut self) {
        self.settle();
    }
}

impl<C: Clock> Bucket<C> {
    /// A reservation's cost in units and its limits, shared by [`reserve`](Bucket::reserve)
    /// and [`reserve_owned`](Bucket::reserve_owned): a cost above the capacity is an error
    /// before anything is read or written.
    pub(crate) fn reserve_terms(
        &self,
        cost: u64,
        max_wait: Duration,
    ) -> Result<(u64, Limits), ReserveError> {
        let layout = self.policy().layout();
        let Some(cost_units) = layout.units_of(cost) else {
            return Err(ReserveError::CostExceedsCapacity {
                cost,
                capacity: layout.capacity(),
            });
        };
        let limits = Limits {
            max_wait,
            horizon: self.policy().max_reservation(),
        };
        Ok((cost_units, limits))
    }

    /// Takes `cost` tokens now, into the policy's reservation allowance if needed, and says
    /// when the caller may proceed; or fails at once, changing nothing.
    ///
    /// The wait is the time until refill has paid for this cost after every reservation
    /// already made: reservations are served in the order they are made, at the refill
    /// rate. It is exact on the tick grid (see [`Reservation::ready_at`]). Zero when the
    /// tokens are there now, like an admission of [`try_acquire`](Bucket::try_acquire).
    ///
    /// # Errors
    ///
    /// Nothing is taken and nothing is written on any error:
    ///
    /// - [`ReserveError::CostExceedsCapacity`] for a cost above the capacity (I8);
    /// - [`ReserveError::ExceedsMaxWait`] when the wait would be longer than `max_wait`;
    /// - [`ReserveError::ExceedsHorizon`] when it would be longer than the policy's
    ///   [`max_reservation`](crate::Policy::max_reservation) (when both limits are
    ///   exceeded, the error names the smaller one);
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Bucket, ManualClock, Policy, reservation::ReserveError, Start};
    ///
    /// let policy = Policy::builder(10, 10.0)
    ///     .max_reservation(Duration::from_secs(3))
    ///     .start(Start::Empty)
    ///     .build()?;
    /// let bucket = Bucket::with_clock(policy, ManualClock::new());
    /// let first = bucket.reserve(10, Duration::from_secs(3))?;  // ready after ~1 s
    /// let second = bucket.reserve(10, Duration::from_secs(3))?; // queued: ~2 s
    /// assert!(second.ready_at() > first.ready_at());
    ///
    /// let before = bucket.stored_word();
    /// let err = bucket.reserve(5, Duration::from_secs(2)).unwrap_err();
    /// assert!(matches!(err, ReserveError::ExceedsMaxWait { .. })); // ~2.5 s > 2 s
    /// assert_eq!(bucket.stored_word(), before); // nothing changed
    /// # first.consume(); second.consume();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(
        &self,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'_, C>, ReserveError> {
        let layout = self.policy().layout();
        let (cost_units, limits) = self.reserve_terms(cost, max_wait)?;
        let now = self.now();
        let (reserved_at, ready_at, reserved) =
            self.raw()
                .transition(
                    layout,
                    self.guarded_clock(),
                    now,
                    true,
                    |snapshot, now| match plan(layout, snapshot, now, cost_units, &limits) {
                        Ok((word, ready_at, reserved)) => (word, Ok((now, ready_at, reserved))),
                        Err(e) => (None, Err(e)),
                    },
                )?;
        Ok(Reservation {
            bucket: self,
            cost,
            reserved,
            reserved_at,
            ready_at,
            settled: false,
        })
    }

    /// Reserves `cost` tokens and sleeps the thread until they are the caller's; returns
    /// the wait (zero when they were there at once).
    ///
    /// For real clocks: it sleeps with [`ThreadSleep`]. On a
    /// [`ManualClock`](crate::ManualClock) it would sleep real time while the manual clock
    /// stands still; use [`acquire_with`](Bucket::acquire_with) and the clock itself as
    /// the [`Sleep`] strategy there.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Bucket::reserve), at once, without sleeping or taking anything.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Bucket, Policy};
    /// let bucket = Bucket::new(Policy::new(5, 1000.0)?);
    /// assert_eq!(bucket.acquire(5, Duration::ZERO)?, Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&self, cost: u64, max_wait: Duration) -> Result<Duration, ReserveError> {
        self.acquire_with(cost, max_wait, &ThreadSleep)
    }

    /// [`acquire`](Bucket::acquire) with a [`Sleep`] strategy: reserves, sleeps once for
    /// the reservation's [`remaining`](Reservation::remaining) time, and keeps the tokens.
    /// It never re-reads the clock in a loop, so a strategy that does not move the clock
    /// cannot make it hang.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Bucket::reserve), at once, without sleeping or taking anything.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Bucket, ManualClock, Policy};
    ///
    /// let policy = Policy::builder(2, 4.0).max_reservation(Duration::from_secs(1)).build()?;
    /// let clock = ManualClock::new();
    /// let bucket = Bucket::with_clock(policy, clock.clone());
    /// assert_eq!(bucket.acquire_with(2, Duration::ZERO, &clock)?, Duration::ZERO);
    /// // The next token takes 250 ms (rounded up to the tick grid); the clock sleeps it.
    /// let waited = bucket.acquire_with(1, Duration::from_secs(1), &clock)?;
    /// assert!(waited >= Duration::from_millis(250));
    /// assert_eq!(clock.now(), waited);
    /// assert!(bucket.available() >= 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_with<S: Sleep + ?Sized>(
        &self,
        cost: u64,
        max_wait: Duration,
        sleep: &S,
    ) -> Result<Duration, ReserveError> {
        let reservation = self.reserve(cost, max_wait)?;
        sleep.sleep(reservation.remaining());
        let waited = reservation.wait();
        reservation.consume();
        Ok(waited)
    }
}

/// The two bounds on a reservation's wait.
pub(crate) struct Limits {
    pub(crate) max_wait: Duration,
    pub(crate) horizon: Duration,
}

impl Limits {
    /// The error for a wait beyond the smaller limit, or `None` if it is within both.
    fn check(&self, wait_nanos: u128) -> Option<ReserveError> {
        let (max_wait, horizon) = (self.max_wait.as_nanos(), self.horizon.as_nanos());
        if wait_nanos <= max_wait.min(horizon) {
            return None;
        }
        let wait = duration_from_nanos(wait_nanos);
        Some(if max_wait <= horizon {
            ReserveError::ExceedsMaxWait {
                wait,
                max_wait: self.max_wait,
            }
        } else {
            ReserveError::ExceedsHorizon {
                wait,
                horizon: self.horizon,
            }
        })
    }
}

/// Decides a reservation on one snapshot: the word to write (none for a zero cost), the
/// clock time the caller may proceed at, and what was charged; or why not.
///
/// The snapshot is at tick `now >> S`, or `behind` ticks later when `now` lost a race to
/// a later reading (within the race tolerance; strict transitions refuse larger steps). A
/// reservation that must wait is ready at the edge of tick `snapshot tick + wait_ticks`,
/// where `wait_ticks` counts the whole ticks of refill [`Layout::reserve_charge`] charged
/// it (one more when the write anchors at the next edge): the grid is absolute, so that
/// edge is `(now_tick + behind + wait_ticks) << S`.
pub(crate) fn plan(
    layout: &Layout,
    snapshot: &Snapshot,
    now: u64,
    cost_units: u64,
    limits: &Limits,
) -> Result<(Option<u64>, u64, Reserved), ReserveError> {
    let Some(reserved) = layout.reserve_charge(snapshot, cost_units, u64::MAX) else {
        // The debt does not fit the allowance. Unreachable within the horizon (the
        // allowance is the horizon's whole ticks of refill), kept as a refusal.
        return Err(ReserveError::ExceedsHorizon {
            wait: limits.horizon.saturating_add(layout.tick()),
            horizon: limits.horizon,
        });
    };
    let ready_at = if reserved.wait_ticks == 0 {
        u128::from(now)
    } else {
        let tick = u128::from(layout.tick_of(now)) + u128::from(snapshot.behind());
        (tick + u128::from(reserved.wait_ticks)) << layout.tick_shift()
    };
    let wait = ready_at - u128::from(now);
    if let Some(e) = limits.check(wait) {
        return Err(e);
    }
    let word = (cost_units > 0).then_some(reserved.word);
    // Beyond the clock's range (584 years) the reservation is never ready: saturate.
    Ok((word, u64::try_from(ready_at).unwrap_or(u64::MAX), reserved))
}
