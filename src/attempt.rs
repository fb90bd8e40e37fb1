//! Whether a request is an original attempt or a retry.

/// Whether a request is an original attempt or a retry of one that was refused.
///
/// Telemetry keeps the two apart: without the split, a wave of retries looks like organic
/// growth.
///
/// ```
/// use tokengate::telemetry::Attempt;
/// assert!(Attempt::Original.is_original());
/// assert!(Attempt::Retry(1).is_retry());
/// assert_eq!(Attempt::Original.next(), Attempt::Retry(1));
/// assert_eq!(Attempt::Retry(1).next(), Attempt::Retry(2));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attempt {
    /// The first attempt of an operation.
    #[default]
    Original,
    /// The n-th retry (1 for the first retry).
    Retry(u32),
}

impl Attempt {
    /// Whether this is the first attempt.
    pub fn is_original(self) -> bool {
        self == Attempt::Original
    }

    /// Whether this is a retry.
    pub fn is_retry(self) -> bool {
        !self.is_original()
    }

    /// The attempt after this one.
    pub fn next(self) -> Attempt {
        match self {
            Attempt::Original => Attempt::Retry(1),
            Attempt::Retry(n) => Attempt::Retry(n.saturating_add(1)),
        }
    }
}
