//! Whether a word may be sealed by a reconfiguration, as part of its type.

use std::convert::Infallible;

use crate::error::AcquireError;
use crate::state::SEALED;

/// Whether a word may be [`SEALED`], as part of its type ([`RawBucket<S>`], [`Core<S>`]),
/// and what an operation on it returns.
///
/// A word of a policy that is never replaced ([`Fixed`]: [`Bucket`], keyed maps) is
/// never sealed: its check compiles away, and its operations return their result as it
/// is. A word of a policy a reconfiguration replaces ([`Sealable`]) is sealed by the
/// switch: every operation on it checks, and one that finds it sealed decides and writes
/// nothing and returns [`Sealed`] (wrapped in [`Seal::Out`]) so that its caller starts
/// again on the new policy.
pub(crate) trait Seal {
    /// What an operation stops with on a sealed word.
    type Stop;
    /// What an operation returns that may stop: `T` itself where no word is ever sealed,
    /// `Result<T, Sealed>` where it may be.
    type Out<T>;
    /// `Err` when `word` is sealed.
    fn check(word: u64) -> Result<(), Self::Stop>;
    /// An operation's result as [`Out`](Seal::Out).
    fn out<T>(result: Result<T, Self::Stop>) -> Self::Out<T>;
    /// An [`Out`](Seal::Out) as a `Result`, for an operation built on another.
    fn result<T>(out: Self::Out<T>) -> Result<T, Self::Stop>;
}

/// The words of a bucket that is never reconfigured ([`Bucket`], keyed maps): never
/// sealed, and the check compiles away.
pub(crate) enum Fixed {}

impl Seal for Fixed {
    type Stop = Infallible;
    type Out<T> = T;
    #[inline(always)]
    fn check(_: u64) -> Result<(), Infallible> {
        Ok(())
    }
    #[inline(always)]
    fn out<T>(result: Result<T, Infallible>) -> T {
        let Ok(out) = result;
        out
    }
    #[inline(always)]
    fn result<T>(out: T) -> Result<T, Infallible> {
        Ok(out)
    }
}

/// The words of a [`LiveBucket`](crate::LiveBucket)'s policies: sealed when a
/// reconfiguration replaces the policy, after which every operation on it stops and
/// starts again on the new one.
pub(crate) enum Sealable {}

/// An operation found its word sealed: nothing was decided or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sealed;

/// What [`RawBucket::try_acquire`] returns on a sealed word, in place of a decision
/// (the hot path builds its result in place: no wrapper to unwrap). A live bucket has no
/// pool, so no decision of its own is ever this error; it retries on the new policy.
pub(crate) const SEALED_ERROR: AcquireError = AcquireError::PoolUnavailable {
    retry_after: std::time::Duration::MAX,
};

impl Seal for Sealable {
    type Stop = Sealed;
    type Out<T> = Result<T, Sealed>;
    #[inline(always)]
    fn check(word: u64) -> Result<(), Sealed> {
        if word == SEALED { Err(Sealed) } else { Ok(()) }
    }
    #[inline(always)]
    fn out<T>(result: Result<T, Sealed>) -> Result<T, Sealed> {
        result
    }
    #[inline(always)]
    fn result<T>(out: Result<T, Sealed>) -> Result<T, Sealed> {
        out
    }
}
