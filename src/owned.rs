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
//! The reservation gives its tokens back in `Drop` when its time has not come, as
//! [`Reservation::cancel`](crate::Reservation::cancel) does, on each bucket word it took
//! from: it knows where it stands in that word's debt (what it charged, and the tick it
//! is ready at there), so its whole charge comes back when no reservation was made on the
//! word after it (the word is then exactly as if it had never reserved), and nothing when
//! one was (the later holders keep their ready times, and a credit ahead of them would be
//! refilled again while they wait: a holder and a newcomer could then take `2B` at one
//! instant; the tokens count as used). A word that had the tokens at once (a scoped
//! reservation waiting for another scope) gives them back as a
//! [`refund`](crate::Bucket::refund) of an admission. A future that owns it (the one
//! `ready` returns, or one that holds it while sleeping) is therefore cancel-safe by
//! construction: aborting the task, dropping the future in a `select!`, or a client
//! hanging up while a server waits never mints tokens, and a lone waiter that gives up
//! leaves the limiter as if it had never asked.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::bucket::{Bucket, RawBucket, Seal};
use crate::clock::{Clock, Monotonic};
use crate::reservation::{Limits, ReserveError, plan};
use crate::state::{Layout, Reserved};

/// A limiter that can back an [`OwnedReservation`]: [`Bucket`],
/// [`KeyedLimiter`](crate::KeyedLimiter), [`ScopedLimiter`](crate::ScopedLimiter).
///
/// Sealed: the methods are the reservation's plumbing.
pub trait Reservable: sealed::Sealed {
    /// What the reservation took and must give back if cancelled (the cost, and for keyed
    /// and scoped limiters the keys that paid it). Returned by
    /// [`OwnedReservation::consume`], so that the caller can still refund it later.
    type Charge: fmt::Debug + Send + Sync;

    /// Where the reservation stands on each bucket word it took from: what a cancel
    /// before the ready time may give back.
    #[doc(hidden)]
    type Places: fmt::Debug + Send + Sync;

    /// The limiter's clock reading, in nanoseconds since its origin.
    #[doc(hidden)]
    fn now_nanos(&self) -> u64;

    /// Cancels the reservation that took `charge` from the words at `places`, before its
    /// ready time: on each word, as [`Reservation::cancel`](crate::Reservation::cancel).
    #[doc(hidden)]
    fn give_back(&self, charge: &Self::Charge, places: &Self::Places);
}

/// Where a reservation stands on one bucket word: what it charged there and the tick
/// (modulo 2^T) it is ready at there, for [`Layout::cancel`].
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub(crate) reserved: Reserved,
    pub(crate) ready_tick: u64,
}

impl Place {
    /// The place of a reservation `reserved` ready at clock time `ready_at` on a word of
    /// `layout`; `None` when it charged nothing (nothing to give back).
    pub(crate) fn new(layout: &Layout, reserved: Reserved, ready_at: u64) -> Option<Place> {
        (reserved.charged_units > 0).then(|| Place {
            reserved,
            ready_tick: layout.tick_of(ready_at),
        })
    }

    /// Cancels on `raw` (a word of `layout`, possibly sealed: `S`) at `now`: the charge
    /// back when no reservation was made after this one, else nothing. A word that had
    /// the tokens at once (a scoped reservation waiting for another scope) took them as
    /// an admission: they come back as a [`refund`](Layout::refund) does (nothing while
    /// the balance is below zero).
    pub(crate) fn cancel<S: Seal, C: Clock + ?Sized>(
        &self,
        raw: &RawBucket<S>,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
    ) -> S::Out<()> {
        raw.transition(layout, clock, now, false, |snapshot, _| {
            let word = if self.reserved.wait_ticks == 0 {
                layout.refund(snapshot, self.reserved.charged_units)
            } else {
                layout.cancel(snapshot, &self.reserved, self.ready_tick)
            };
            (Some(word), ())
        })
    }
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Tokens reserved ahead by a limiter behind an [`Arc`]: may proceed at
/// [`ready_at`](Self::ready_at), gives the tokens back when dropped before then.
///
/// The table of [`Reservation`](crate::Reservation) holds: `consume` keeps the tokens,
/// `cancel` or drop before `ready_at` gives them back exactly on each bucket where no
/// reservation was made after it, and nothing where one was (see the module docs), and
/// after `ready_at` keeps them. `Send` and `'static` when the limiter is, so it crosses
/// `tokio::spawn`.
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
/// drop(moved); // before its time, nobody behind it: as if it had never reserved
/// assert_eq!(bucket.available(), 0.0);
///
/// let first = bucket.reserve_owned(5, Duration::from_secs(2))?;
/// let second = bucket.reserve_owned(5, Duration::from_secs(2))?;
/// assert!(first.cancel()); // a holder queued behind it: nothing comes back
/// assert_eq!(bucket.available(), -10.0);
/// clock.set(second.ready_at()); // the later holder's time stands
/// assert!(second.is_ready());
/// # second.consume();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a reservation before its time gives the tokens back"]
pub struct OwnedReservation<L: Reservable> {
    limiter: Arc<L>,
    charge: Option<L::Charge>,
    places: L::Places,
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
        places: L::Places,
        reserved_at: u64,
        ready_at: u64,
    ) -> OwnedReservation<L> {
        OwnedReservation {
            limiter,
            charge: Some(charge),
            places,
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

    /// Before [`ready_at`](Self::ready_at) (returns `true`): gives the tokens back on each
    /// bucket where no reservation was made after this one, exactly, and nothing where
    /// one was (see the module's [cancel safety](crate::owned#cancel-safety)). At or after
    /// `ready_at` they count as used (`false`). Dropping does the same.
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
        self.limiter.give_back(&charge, &self.places);
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

/// A reservation made on one word: `(reserved_at, ready_at, place)`.
pub(crate) type OnWord = (u64, u64, Option<Place>);

/// Reserves `cost_units` on one word at `now`: `(reserved_at, ready_at, place)` or why
/// not. Nothing is written on an error, and nothing decided on a sealed word (see
/// [`Seal`]).
pub(crate) fn reserve_on<S: Seal, C: Clock + ?Sized>(
    raw: &RawBucket<S>,
    layout: &Layout,
    clock: &Monotonic<C>,
    now: u64,
    cost_units: u64,
    limits: &Limits,
) -> S::Out<Result<OnWord, ReserveError>> {
    raw.transition(layout, clock, now, true, |snapshot, now| {
        match plan(layout, snapshot, now, cost_units, limits) {
            Ok((word, ready_at, reserved)) => (
                word,
                Ok((now, ready_at, Place::new(layout, reserved, ready_at))),
            ),
            Err(e) => (None, Err(e)),
        }
    })
}

impl<C: Clock> sealed::Sealed for Bucket<C> {}

impl<C: Clock> Reservable for Bucket<C> {
    /// The cost, in tokens.
    type Charge = u64;

    type Places = Option<Place>;

    fn now_nanos(&self) -> u64 {
        self.now()
    }

    fn give_back(&self, _cost: &u64, place: &Option<Place>) {
        if let Some(place) = place {
            place.cancel(
                self.raw(),
                self.policy().layout(),
                self.guarded_clock(),
                self.now(),
            );
        }
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
        let layout = self.policy().layout();
        let (cost_units, limits) = self.reserve_terms(cost, max_wait)?;
        let (reserved_at, ready_at, place) = reserve_on(
            self.raw(),
            layout,
            self.guarded_clock(),
            self.now(),
            cost_units,
            &limits,
        )?;
        Ok(OwnedReservation::new(
            Arc::clone(self),
            cost,
            place,
            reserved_at,
            ready_at,
        ))
    }
}
