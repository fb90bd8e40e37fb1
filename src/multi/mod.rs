//! All-or-nothing acquisition across several buckets: ordered reservation with rollback.
//!
//! A request often needs credit from several scopes at once (the global bucket, its
//! tenant's, the tenant's route). [`acquire_all`] takes every cost or none:
//!
//! 1. every cost is checked against its bucket's capacity first (I8), and a bucket named
//!    twice is refused, before anything is taken;
//! 2. the clock is read once for the whole set;
//! 3. buckets are taken in one global order, ascending [`Member::member_id`], so two
//!    acquirers with overlapping sets meet on the first bucket they share instead of each
//!    holding a part of what the other needs;
//! 4. a read-only first pass refuses, writing nothing (I5), a set whose balances seen now
//!    cannot pay; only a set that passes is taken, each take planned on the word the
//!    first pass read and landed by one compare-and-swap from it (the take's loop runs
//!    only when another thread wrote the word in between);
//! 5. if a take is refused even so (another thread took the tokens in between), the
//!    buckets already taken are refunded in reverse order, each exactly as if it had never
//!    been taken (I6); the result names the bucket that refused and the time until the
//!    whole set could be paid.
//!
//! Sets of up to [`INLINE_MEMBERS`] buckets allocate nothing.

use std::fmt;
use std::mem::MaybeUninit;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::AcquireError;

/// Sets up to this size are ordered on the stack, without allocating.
pub const INLINE_MEMBERS: usize = 8;

pub(crate) mod member;

pub use member::Member;
/// The members' operations at a given clock reading, for the loom models only (which
/// take at a reading made before another thread's, as a descheduled thread would).
#[cfg(loom)]
#[doc(hidden)]
pub use member::sealed::Sealed as MemberOps;
pub(crate) use member::{BucketRef, Planned, Prepared, WordBacked, sealed, take_inline};

/// Why [`acquire_all`] refused to decide. Nothing was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MultiError {
    /// The same bucket appears twice in the request (positions in the request list).
    DuplicateBucket {
        /// Position of the first occurrence.
        first: usize,
        /// Position of the second occurrence.
        second: usize,
    },
    /// A bucket refused with an error ([`AcquireError`]): its cost is above its capacity
    /// (checked for every bucket before anything is taken), or a leased bucket's
    /// [`Pool`](crate::leased::Pool) outside this crate returned one. The crate's own
    /// buckets and pools never return [`AcquireError::ClockWentBackwards`]: they read
    /// their clock through a [`Monotonic`](crate::clock::Monotonic) guard, so a clock
    /// stepping back is time standing still.
    Bucket {
        /// Position of the bucket in the request list.
        index: usize,
        /// The bucket's error.
        error: AcquireError,
    },
}

impl fmt::Display for MultiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MultiError::DuplicateBucket { first, second } => write!(
                f,
                "the same bucket is named twice in one request (positions {first} and {second}); \
                 combine its costs into one entry"
            ),
            MultiError::Bucket { index, error } => write!(f, "bucket at position {index}: {error}"),
        }
    }
}

impl std::error::Error for MultiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MultiError::Bucket { error, .. } => Some(error),
            MultiError::DuplicateBucket { .. } => None,
        }
    }
}

/// The outcome of [`acquire_all`]: every cost taken, or none.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MultiDecision {
    refused: Option<(usize, Decision)>,
    retry_after: Duration,
}

impl MultiDecision {
    /// Whether every cost was taken.
    #[inline]
    pub fn is_admitted(&self) -> bool {
        self.refused.is_none()
    }

    /// Whether nothing was taken.
    #[inline]
    pub fn is_rejected(&self) -> bool {
        self.refused.is_some()
    }

    /// For a rejection, the position (in the request list) of the bucket that refused.
    pub fn refused_index(&self) -> Option<usize> {
        self.refused.map(|(i, _)| i)
    }

    /// For a rejection, the refusing bucket's own decision (its balance, its wait).
    pub fn refused_decision(&self) -> Option<&Decision> {
        self.refused.as_ref().map(|(_, d)| d)
    }

    /// For a rejection, the time until every bucket of the set holds its cost: the longest
    /// of the buckets' own waits, seen from the decision's time. `None` for an admission.
    pub fn retry_after(&self) -> Option<Duration> {
        self.refused.map(|_| self.retry_after)
    }
}

impl fmt::Debug for MultiDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiDecision")
            .field("admitted", &self.is_admitted())
            .field("refused_index", &self.refused_index())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}

/// Takes `cost` from every bucket of `requests`, or from none.
///
/// Buckets may have different policies; they must share one time source, because the
/// clock (of the first bucket in the list) is read once for the whole set.
///
/// 1. Every cost is checked against its bucket's capacity (I8) and a bucket named twice
///    is refused, before anything is taken.
/// 2. A read-only first pass refuses, writing nothing, a set whose balances seen now
///    cannot pay, naming the first bucket in the list that cannot pay its cost (so the
///    bucket named does not depend on where the buckets are in memory).
/// 3. Buckets are taken in one global order, ascending [`Member::member_id`], so two
///    acquirers with overlapping sets meet on the first bucket they share.
/// 4. On a refusal at that stage (a race), the buckets already taken are refunded in
///    reverse order, each exactly as if it had never been taken (I6).
///
/// Sets of up to [`INLINE_MEMBERS`] buckets allocate nothing.
///
/// ```
/// use tokengate::{acquire_all, Bucket, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let global = Bucket::with_clock(Policy::new(1000, 100.0)?, clock.clone());
/// let tenant = Bucket::with_clock(Policy::new(10, 1.0)?, clock.clone());
///
/// assert!(acquire_all(&[(&global, 8), (&tenant, 8)])?.is_admitted());
/// let d = acquire_all(&[(&global, 8), (&tenant, 8)])?;
/// assert_eq!(d.refused_index(), Some(1)); // the tenant bucket refused...
/// assert_eq!(global.available(), 992.0); // ...and the global bucket paid nothing
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`MultiError`] for a cost above its bucket's capacity, a bucket named twice, or an
/// error of a leased bucket's [`Pool`](crate::leased::Pool) outside this crate; nothing
/// is taken. A clock stepping back is never an error (time standing still).
pub fn acquire_all<M: Member + ?Sized>(
    requests: &[(&M, u64)],
) -> Result<MultiDecision, MultiError> {
    acquire_all_with(requests, |_, _| {})
}

/// [`acquire_all`], calling `observe(index, &decision)` for each bucket's own decision
/// in the order the buckets are taken (for per-scope telemetry). A bucket refunded after
/// a later refusal was observed as admitted first.
///
/// # Errors
///
/// As [`acquire_all`].
pub fn acquire_all_with<M: Member + ?Sized>(
    requests: &[(&M, u64)],
    observe: impl FnMut(usize, &Decision),
) -> Result<MultiDecision, MultiError> {
    acquire_all_at(requests, None, observe)
}

/// [`acquire_all_with`] at `now` when given (a reading of the members' clock that the
/// caller has just taken), else at a reading of the first member's clock.
pub(crate) fn acquire_all_at<M: Member + ?Sized>(
    requests: &[(&M, u64)],
    now: Option<u64>,
    observe: impl FnMut(usize, &Decision),
) -> Result<MultiDecision, MultiError> {
    for (index, &(member, cost)) in requests.iter().enumerate() {
        let capacity = member.capacity();
        if cost > capacity {
            return Err(MultiError::Bucket {
                index,
                error: AcquireError::CostExceedsCapacity { cost, capacity },
            });
        }
    }
    let Some(&(first, _)) = requests.first() else {
        return Ok(MultiDecision {
            refused: None,
            retry_after: Duration::ZERO,
        });
    };
    let mut inline = [0usize; INLINE_MEMBERS];
    let mut heap;
    let order: &mut [usize] = if requests.len() <= INLINE_MEMBERS {
        &mut inline[..requests.len()]
    } else {
        heap = vec![0usize; requests.len()];
        &mut heap
    };
    for (slot, i) in order.iter_mut().zip(0..) {
        *slot = i;
    }
    if !mutant!(TAKE_IN_LISTED_ORDER) {
        sort_by_id(order, requests)?;
    }
    let now = now.unwrap_or_else(|| first.now_nanos());
    take_in(requests, Some(order), now, observe)
}

/// [`acquire_all_at`] at `now`, for members listed in the order they are to be taken
/// in: an order every acquirer of these members keeps (a scoped limiter's, by scope
/// kind then limit), with no member named twice and every cost within its member's
/// capacity, which the caller's configuration guarantees. The same passes, without the
/// capacity check and the sort: the order does not depend on where the members are in
/// memory.
#[inline]
pub(crate) fn acquire_listed_at<M: Member + ?Sized>(
    requests: &[(&M, u64)],
    now: u64,
    observe: impl FnMut(usize, &Decision),
) -> Result<MultiDecision, MultiError> {
    debug_assert!(
        requests.iter().all(|&(m, c)| c <= m.capacity()),
        "every cost within its member's capacity"
    );
    take_in(requests, None, now, observe)
}

/// The read-only first pass, then the takes in `order` (the position in `requests` of
/// each member to take, in turn; the listed order for `None`), rolled back on a
/// refusal.
#[inline(always)]
fn take_in<M: Member + ?Sized>(
    requests: &[(&M, u64)],
    order: Option<&[usize]>,
    now: u64,
    mut observe: impl FnMut(usize, &Decision),
) -> Result<MultiDecision, MultiError> {
    let retry_after = || {
        requests
            .iter()
            .map(|&(m, c)| m.wait_at(c, now))
            .max()
            .unwrap_or(Duration::ZERO)
    };
    // First pass, read-only: a set that cannot be paid now is refused without a write
    // (I5), so refused requests neither write the shared buckets' lines nor hold their
    // tokens for a moment. Only a set that passes is taken, and a refusal then (another
    // thread got there first) rolls back. Read in the listed order: the refusal names the
    // first listed bucket that cannot pay, whatever the buckets' addresses. Each member
    // plans its take on what it read, so that a take is one compare-and-swap when no
    // other thread wrote the word in between.
    let mut inline = [const { MaybeUninit::<Prepared>::uninit() }; INLINE_MEMBERS];
    let mut heap;
    let plans: &mut [MaybeUninit<Prepared>] = if requests.len() <= INLINE_MEMBERS {
        &mut inline[..requests.len()]
    } else {
        heap = vec![MaybeUninit::uninit(); requests.len()];
        &mut heap
    };
    for ((i, &(m, cost)), plan) in requests.iter().enumerate().zip(plans.iter_mut()) {
        m.prepare(cost, now, plan);
        // SAFETY: `prepare` wrote the plan.
        if let Prepared::Refused(decision) = unsafe { plan.assume_init_ref() } {
            observe(i, decision);
            return Ok(MultiDecision {
                refused: Some((i, *decision)),
                retry_after: retry_after(),
            });
        }
    }
    let at = |n: usize| order.map_or(n, |o| o[n]);
    for taken in 0..requests.len() {
        let i = at(taken);
        let (m, cost) = requests[i];
        // SAFETY: the first pass wrote a plan for every position (`plans` has one per
        // request, and a refusal returned before any take). By reference: the plan's
        // words are read back one by one, as they were stored.
        let plan = unsafe { plans[i].assume_init_ref() };
        let outcome = match plan {
            Prepared::Take(p) => m.commit(p, cost, now),
            _ => m.take_at(cost, now),
        };
        if let Ok(d) = &outcome {
            observe(i, d);
            if d.is_admitted() {
                continue;
            }
        }
        // Roll back what was taken, newest first.
        let taken = if mutant!(ROLLBACK_SKIPS_REFUND) {
            0
        } else {
            taken
        };
        for n in (0..taken).rev() {
            let (m, c) = requests[at(n)];
            m.refund_at(c, now);
        }
        return match outcome {
            Ok(decision) => Ok(MultiDecision {
                refused: Some((i, decision)),
                retry_after: retry_after(),
            }),
            Err(error) => Err(MultiError::Bucket { index: i, error }),
        };
    }
    Ok(MultiDecision {
        refused: None,
        retry_after: Duration::ZERO,
    })
}

/// Sorts request positions by member identity (insertion sort for the small inline sets,
/// the library sort beyond), refusing duplicates.
fn sort_by_id<M: Member + ?Sized>(
    order: &mut [usize],
    requests: &[(&M, u64)],
) -> Result<(), MultiError> {
    if order.len() <= INLINE_MEMBERS {
        // Each member's identity read once (a member may have to look it up).
        let mut ids = [0usize; INLINE_MEMBERS];
        for (slot, &(member, _)) in ids.iter_mut().zip(requests) {
            *slot = member.member_id();
        }
        let id = |i: usize| ids[i];
        for k in 1..order.len() {
            let mut j = k;
            while j > 0 && id(order[j - 1]) > id(order[j]) {
                order.swap(j - 1, j);
                j -= 1;
            }
        }
        return refuse_duplicates(order, id);
    }
    let id = |i: usize| requests[i].0.member_id();
    order.sort_unstable_by_key(|&i| id(i));
    refuse_duplicates(order, id)
}

/// Refuses positions sorted by `id` that name one member twice.
#[inline(always)]
fn refuse_duplicates(order: &[usize], id: impl Fn(usize) -> usize) -> Result<(), MultiError> {
    for pair in order.windows(2) {
        if id(pair[0]) == id(pair[1]) {
            let (first, second) = (pair[0].min(pair[1]), pair[0].max(pair[1]));
            return Err(MultiError::DuplicateBucket { first, second });
        }
    }
    Ok(())
}
