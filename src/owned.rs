//! Owned reservations: tokens reserved ahead by a limiter behind an [`Arc`], for async
//! code that waits across `.await` points and tasks.
//!
//! A [`Reservation`](crate::Reservation) borrows its bucket, which keeps it on one stack
//! frame. An [`OwnedReservation`] holds an `Arc` of its limiter instead (as tokio's
//! `OwnedSemaphorePermit` holds its semaphore), so it can move into a spawned task or a
//! response future. [`Bucket`], [`KeyedLimiter`](crate::KeyedLimiter) and
//! [`ScopedLimiter`](crate::ScopedLimiter) all make one (`reserve_owned`).
//!
//! The engine brings no async runtime: [`OwnedReservation::ready`] takes the sleep from the
//! caller (`tokio::time::sleep`, or any timer returning a future).
//!
//! # Cancel safety
//!
//! The reservation gives its tokens back in `Drop` when its time has not come, as a
//! [`refund`](crate::Bucket::refund) of its cost: to each bucket whose balance is zero or
//! above, capped at the capacity; to a bucket still owing reservations (balance below
//! zero), nothing, since holders queued behind it keep their ready times and a credit
//! ahead of them would be refilled again while they wait. A future that owns it (the one
//! `ready` returns, or one that holds it while sleeping) is therefore cancel-safe by
//! construction: aborting the task, dropping the future in a `select!`, or a client
//! hanging up while a server waits never mints tokens, and gives back what can be given
//! without letting a queued holder and a newcomer share the same refill.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::bucket::{Bucket, RawBucket, Seal};
use crate::clock::{Clock, Monotonic};
use crate::reservation::{Limits, ReserveError, plan};
use crate::state::Layout;

/// A limiter that can back an [`OwnedReservation`]: [`Bucket`],
/// [`KeyedLimiter`](crate::KeyedLimiter), [`ScopedLimiter`](crate::ScopedLimiter).
///
/// Sealed: the methods are the reservation's plumbing.
pub trait Reservable: sealed::Sealed {
    /// What the reservation took and must give back if cancelled (the cost, and for keyed
    /// and scoped limiters the keys that paid it). Returned by
    /// [`OwnedReservation::consume`], so that the caller can still refund it later.
    type Charge: fmt::Debug + Send + Sync;

    /// The limiter's clock reading, in nanoseconds since its origin.
    #[doc(hidden)]
    fn now_nanos(&self) -> u64;

    /// Gives `charge` back (exact refund, capped at capacity).
    #[doc(hidden)]
    fn give_back(&self, charge: &Self::Charge);
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Tokens reserved ahead by a limiter behind an [`Arc`]: may proceed at
/// [`ready_at`](Self::ready_at), gives the tokens back when dropped before then.
///
/// The table of [`Reservation`](crate::Reservation) holds: `consume` keeps the tokens,
/// `cancel` or drop before `ready_at` gives them back as a refund (nothing to a bucket
/// still owing reservations: see the module docs), and after `ready_at` keeps them. `Send` and `'static` when the limiter is, so it crosses `tokio::spawn`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tokengate::{Bucket, ManualClock, Policy, Start};
///
/// let policy = Policy::builder(10, 10.0)
///     .max_reservation(Duration::from_secs(2))
///     .start(Start::Empty)
///     .build()?;
/// let clock = ManualClock::new();
/// let bucket = Arc::new(Bucket::with_clock(policy, clock.clone()));
///
/// let r = bucket.reserve_owned(5, Duration::from_secs(1))?;
/// assert_eq!(bucket.available(), -5.0); // the debt queues later callers
/// let moved = std::thread::spawn(move || r).join().unwrap(); // crosses threads
/// drop(moved); // before its time, into the debt: nothing comes back, nothing is minted
/// assert_eq!(bucket.available(), -5.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a reservation before its time gives the tokens back"]
pub struct OwnedReservation<L: Reservable> {
    limiter: Arc<L>,
    charge: Option<L::Charge>,
    reserved_at: u64,
    ready_at: u64,
}

impl<L: Reservable> fmt::Debug for OwnedReservation<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedReservation")
            .field("charge", &self.charge)
            .field("reserved_at", &self.reserved_at())
            .field("ready_at", &self.ready_at())
            .finish()
    }
}

impl<L: Reservable> OwnedReservation<L> {
    pub(crate) fn new(
        limiter: Arc<L>,
        charge: L::Charge,
        reserved_at: u64,
        ready_at: u64,
    ) -> OwnedReservation<L> {
        OwnedReservation {
            limiter,
            charge: Some(charge),
            reserved_at,
            ready_at,
        }
    }

    /// The limiter the tokens were reserved from.
    pub fn limiter(&self) -> &Arc<L> {
        &self.limiter
    }

    /// What was reserved (`None` once consumed or cancelled).
    pub fn charge(&self) -> Option<&L::Charge> {
        self.charge.as_ref()
    }

    /// The clock reading (since the clock's origin) the reservation was decided at.
    pub fn reserved_at(&self) -> Duration {
        Duration::from_nanos(self.reserved_at)
    }

    /// The clock time (since the clock's origin) from which the caller may proceed.
    pub fn ready_at(&self) -> Duration {
        Duration::from_nanos(self.ready_at)
    }

    /// The wait promised when reserved, exact on the tick grid.
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.ready_at - self.reserved_at)
    }

    /// The time left until [`ready_at`](Self::ready_at) (zero once ready): what to sleep.
    pub fn remaining(&self) -> Duration {
        Duration::from_nanos(self.ready_at.saturating_sub(self.limiter.now_nanos()))
    }

    /// Whether the clock has reached [`ready_at`](Self::ready_at).
    pub fn is_ready(&self) -> bool {
        self.limiter.now_nanos() >= self.ready_at
    }

    /// Keeps the tokens whatever the time, and returns what was taken (to refund later,
    /// for example when the work fails).
    pub fn consume(mut self) -> L::Charge {
        self.charge
            .take()
            .expect("a reservation holds its charge until settled")
    }

    /// Gives the tokens back if the reservation's time has not come (`true`); at or after
    /// [`ready_at`](Self::ready_at) they count as used (`false`). Dropping does the same.
    pub fn cancel(mut self) -> bool {
        self.settle()
    }

    /// Sleeps with `sleep` for the [`remaining`](Self::remaining) time, then keeps the
    /// tokens and returns the charge.
    ///
    /// `sleep` is the runtime's timer, for example `tokio::time::sleep`. The returned
    /// future owns the reservation: dropping it before it completes gives the tokens back
    /// (see the module's [cancel safety](crate::owned#cancel-safety)).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokengate::reservation::Sleep;
    /// use tokengate::{Bucket, ManualClock, Policy};
    ///
    /// let policy = Policy::builder(2, 4.0).max_reservation(Duration::from_secs(1)).build()?;
    /// let clock = ManualClock::new();
    /// let bucket = Arc::new(Bucket::with_clock(policy, clock.clone()));
    /// bucket.try_acquire(2)?;
    /// let r = bucket.reserve_owned(1, Duration::from_secs(1))?;
    /// // A sleep that advances the manual clock, polled to completion by hand.
    /// let fut = r.ready(|d| { clock.sleep(d); std::future::ready(()) });
    /// let mut fut = std::pin::pin!(fut);
    /// let waker = std::task::Waker::noop();
    /// let poll = fut.as_mut().poll(&mut std::task::Context::from_waker(&waker));
    /// assert!(matches!(poll, std::task::Poll::Ready(1)));
    /// assert!(bucket.available() >= 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn ready<F, S>(self, sleep: S) -> L::Charge
    where
        S: FnOnce(Duration) -> F,
        F: Future<Output = ()>,
    {
        let remaining = self.remaining();
        if !remaining.is_zero() {
            sleep(remaining).await;
        }
        self.consume()
    }

    fn settle(&mut self) -> bool {
        let Some(charge) = self.charge.take() else {
            return false;
        };
        if self.limiter.now_nanos() >= self.ready_at {
            return false;
        }
        self.limiter.give_back(&charge);
        true
    }
}

impl<L: Reservable> Drop for OwnedReservation<L> {
    /// Before [`ready_at`](OwnedReservation::ready_at): gives the tokens back; after:
    /// nothing.
    fn drop(&mut self) {
        self.settle();
    }
}

/// Reserves `cost_units` on one word at `now`: `(reserved_at, ready_at)` or why not.
/// Nothing is written on an error.
pub(crate) fn reserve_on<C: Clock + ?Sized>(
    raw: &RawBucket,
    layout: &Layout,
    clock: &Monotonic<C>,
    now: u64,
    cost_units: u64,
    limits: &Limits,
) -> Result<(u64, u64), ReserveError> {
    raw.transition(layout, clock, now, true, |snapshot, now| {
        match plan(layout, snapshot, now, cost_units, limits) {
            Ok((word, ready_at, _)) => (word, Ok((now, ready_at))),
            Err(e) => (None, Err(e)),
        }
    })?
}

/// [`reserve_on`] on a word that may be sealed (`S`): stops with `S::Stop`, deciding and
/// writing nothing, when it finds the word sealed.
pub(crate) fn reserve_on_in<S: Seal, C: Clock + ?Sized>(
    raw: &RawBucket,
    layout: &Layout,
    clock: &Monotonic<C>,
    now: u64,
    cost_units: u64,
    limits: &Limits,
) -> Result<Result<(u64, u64), ReserveError>, S::Stop> {
    raw.transition_in::<S, C, _>(layout, clock, now, true, |snapshot, now| {
        match plan(layout, snapshot, now, cost_units, limits) {
            Ok((word, ready_at, _)) => (word, Ok((now, ready_at))),
            Err(e) => (None, Err(e)),
        }
    })
}

impl<C: Clock> sealed::Sealed for Bucket<C> {}

impl<C: Clock> Reservable for Bucket<C> {
    /// The cost, in tokens.
    type Charge = u64;

    fn now_nanos(&self) -> u64 {
        self.now()
    }

    fn give_back(&self, cost: &u64) {
        // The cost was checked against the capacity when reserved.
        let _ = self.refund(*cost);
    }
}

impl<C: Clock> Bucket<C> {
    /// [`reserve`](Bucket::reserve), owning an `Arc` of the bucket: the reservation can
    /// move into a task or a future (see [`OwnedReservation`]).
    ///
    /// # Errors
    ///
    /// As [`reserve`](Bucket::reserve): nothing is taken.
    pub fn reserve_owned(
        self: &Arc<Self>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<OwnedReservation<Bucket<C>>, ReserveError> {
        let r = self.reserve(cost, max_wait)?;
        let (reserved_at, ready_at) = (r.reserved_at(), r.ready_at());
        r.consume();
        Ok(OwnedReservation::new(
            Arc::clone(self),
            cost,
            nanos(reserved_at),
            nanos(ready_at),
        ))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
