//! Owned reservations on a keyed limiter: delay instead of reject, per key.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use crate::attempt::Attempt;
use crate::clock::Clock;
use crate::keyed::{KeyedLimiter, Slot};
use crate::owned::{OwnedReservation, Place, Reservable, reserve_on, sealed};
use crate::reservation::{Limits, ReserveError};
use crate::state::Layout;

/// Why [`KeyedLimiter::reserve_owned`] refused. Nothing was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedReserveError {
    /// The key's bucket refused the reservation (see [`ReserveError`]).
    Reserve(ReserveError),
    /// The key is new and the map is full with nothing evictable, under
    /// [`Overflow::Reject`](crate::keyed::Overflow::Reject).
    KeyLimit {
        /// The map's maximum number of keys.
        max_keys: usize,
    },
}

impl fmt::Display for KeyedReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedReserveError::Reserve(e) => e.fmt(f),
            KeyedReserveError::KeyLimit { max_keys } => write!(
                f,
                "the key is new and the map holds its maximum of {max_keys} keys; nothing was \
                 taken"
            ),
        }
    }
}

impl std::error::Error for KeyedReserveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyedReserveError::Reserve(e) => Some(e),
            KeyedReserveError::KeyLimit { .. } => None,
        }
    }
}

/// What a keyed reservation took: the key and the cost in tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedCharge<K> {
    /// The key that paid.
    pub key: K,
    /// The cost, in tokens.
    pub cost: u64,
}

impl<K, C: Clock, S> sealed::Sealed for KeyedLimiter<K, C, S> {}

impl<K, C, S> Reservable for KeyedLimiter<K, C, S>
where
    K: Hash + Eq + Send + Sync + fmt::Debug,
    C: Clock,
    S: BuildHasher,
{
    type Charge = KeyedCharge<K>;

    /// The key's word, and the layout it was reserved under.
    type Places = Option<(Place, Layout)>;

    fn now_nanos(&self) -> u64 {
        self.clock().now_nanos()
    }

    fn give_back(&self, charge: &KeyedCharge<K>, places: &Self::Places) {
        let Some((place, reserved_under)) = places else {
            return;
        };
        // A key evicted meanwhile had refilled to full: nothing to give back.
        self.cancel_if(&charge.key, place, reserved_under, || true);
    }
}

impl<K, C, S> KeyedLimiter<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Debug,
    C: Clock,
    S: BuildHasher,
{
    /// Reserves `cost` tokens from `key`'s bucket, into the policy's reservation allowance
    /// ([`PolicyBuilder::max_reservation`](crate::PolicyBuilder::max_reservation)) if
    /// needed, as [`Bucket::reserve`](crate::Bucket::reserve) does for one bucket; the
    /// reservation owns an `Arc` of the map (see [`OwnedReservation`]).
    ///
    /// Cancelling (or dropping) before the ready time gives the key's bucket its charge
    /// back as [`Reservation::cancel`](crate::Reservation::cancel) does: all of it when no
    /// reservation was made on the key after it, else nothing. A key charged to the shared
    /// overflow bucket ([`Overflow::Share`](crate::keyed::Overflow)), evicted since, or a
    /// map reconfigured since, gets nothing back.
    ///
    /// # Errors
    ///
    /// [`KeyedReserveError`]; nothing is taken.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokengate::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy = Policy::builder(4, 2.0).max_reservation(Duration::from_secs(5)).build()?;
    /// let clock = ManualClock::new();
    /// let map = Arc::new(KeyedLimiter::<u64, _>::builder(policy, 100).clock(clock).build()?);
    /// map.try_acquire(&7, 4)?;
    /// let r = map.reserve_owned(7, 2, Duration::from_secs(2))?; // 1 s ahead
    /// assert_eq!(map.available(&7), -2.0);
    /// assert!(r.cancel()); // before its time, nobody behind it: the charge comes back
    /// assert_eq!(map.available(&7), 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_owned(
        self: &Arc<Self>,
        key: K,
        cost: u64,
        max_wait: Duration,
    ) -> Result<OwnedReservation<Self>, KeyedReserveError> {
        let limits = Limits {
            max_wait,
            horizon: self.policy().max_reservation(),
        };
        let now = self.clock().now_nanos();
        let (reserved_at, ready_at, place) = self.with_slot(&key, now, |slot| match slot {
            Slot::Full { max_keys } => Err(KeyedReserveError::KeyLimit { max_keys }),
            // Not made by `with_slot`; were it, nothing was reserved.
            Slot::Stale => Err(KeyedReserveError::KeyLimit {
                max_keys: self.max_keys(),
            }),
            Slot::Bucket(h) => {
                let units = h.layout.units_of(cost).ok_or(KeyedReserveError::Reserve(
                    ReserveError::CostExceedsCapacity {
                        cost,
                        capacity: h.layout.capacity(),
                    },
                ))?;
                let (reserved_at, ready_at, place) =
                    reserve_on(h.raw, h.layout, h.clock, now, units, &limits)
                        .map_err(KeyedReserveError::Reserve)?;
                h.counters.record(true, cost, Attempt::Original);
                Ok((reserved_at, ready_at, place.map(|p| (p, *h.layout))))
            }
        })?;
        Ok(OwnedReservation::new(
            Arc::clone(self),
            KeyedCharge { key, cost },
            place,
            reserved_at,
            ready_at,
        ))
    }
}
