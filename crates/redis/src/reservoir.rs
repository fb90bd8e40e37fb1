//! A bucket's local reservoir: the tokens Redis granted this instance, in two lease words,
//! so decisions never wait on the network.
//!
//! A word holds one lease, or several merged: the thread adds a later lease's tokens to a
//! word that still holds an earlier one, keeping the earlier (smaller) expiry, so a hot
//! bucket can take several grants per round trip while a decision still looks at two
//! words only.
//!
//! Each word is `[local expiry: 40 bits | tokens: 24 bits]`. The expiry is in the pool's
//! time units of 2^20 ns (about 1.05 ms) since the pool started: 40 bits last 36 years.
//! A lease's tokens are spendable only before its local expiry, which the background
//! thread sets to the exchange's *send* time plus the lease time-to-live: it precedes
//! Redis's reclaim (grant time + time-to-live + grace), so no token is spent after Redis
//! has taken its lease back. Spending is one CAS; nothing else writes a word while it
//! holds tokens except the thread: retiring it (a swap to zero, after which the leftover
//! is settled as unspent) or merging a grant into it (a CAS that adds tokens and keeps the
//! expiry).
//!
//! # Orderings
//!
//! `Relaxed` throughout: a word is self-contained (tokens and expiry in one value), and
//! the lease bookkeeping that pairs with it lives on the background thread alone.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Bits of a word's token count.
pub(crate) const TOKEN_BITS: u32 = 24;
/// The largest lease one word holds, tokens.
pub const MAX_LEASE_TOKENS: u64 = (1 << TOKEN_BITS) - 1;
const TOKEN_MASK: u64 = MAX_LEASE_TOKENS;
/// A pool time unit is 2^TIME_SHIFT ns.
pub(crate) const TIME_SHIFT: u32 = 20;

/// Packs a word.
pub(crate) fn pack(expiry: u64, tokens: u64) -> u64 {
    (expiry << TOKEN_BITS) | (tokens & TOKEN_MASK)
}

/// The tokens of a word.
pub(crate) fn tokens(word: u64) -> u64 {
    word & TOKEN_MASK
}

/// The local expiry of a word, pool time units.
pub(crate) fn expiry(word: u64) -> u64 {
    word >> TOKEN_BITS
}

/// What a spend found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Paid; the tokens left in the word paid from.
    Paid { left: u64 },
    /// Neither live word holds the cost.
    Short,
}

/// The two lease words of one bucket.
#[derive(Debug, Default)]
pub(crate) struct Reservoir {
    words: [CachePadded<AtomicU64>; 2],
}

impl Reservoir {
    /// Pays `cost` tokens at pool time `now` from the first live word that holds them.
    #[inline]
    pub(crate) fn spend(&self, cost: u64, now: u64) -> Spend {
        for word in &self.words {
            let mut cur = word.load(Ordering::Relaxed);
            while tokens(cur) >= cost && now < expiry(cur) {
                match word.compare_exchange_weak(
                    cur,
                    cur - cost,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return Spend::Paid {
                            left: tokens(cur) - cost,
                        };
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
        Spend::Short
    }

    /// Pays `cost` tokens and takes a batch of `batch(spare)` more (at most the spare)
    /// from the first word that holds the cost and whose expiry is after `must_outlive`.
    /// Returns the batch and the tokens left in that word.
    pub(crate) fn spend_batch(
        &self,
        cost: u64,
        must_outlive: u64,
        mut batch: impl FnMut(u64) -> u64,
    ) -> Option<(u64, u64)> {
        for word in &self.words {
            let mut cur = word.load(Ordering::Relaxed);
            while tokens(cur) >= cost && must_outlive < expiry(cur) {
                let spare = tokens(cur) - cost;
                let take = batch(spare).min(spare);
                match word.compare_exchange_weak(
                    cur,
                    cur - cost - take,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some((take, spare - take)),
                    Err(actual) => cur = actual,
                }
            }
        }
        None
    }

    /// The word at `i`.
    pub(crate) fn load(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }

    /// Installs a grant into the empty word `i` (the thread's; spenders never raise a
    /// word). Returns the tokens the word held (zero when the thread's bookkeeping holds).
    pub(crate) fn install(&self, i: usize, expiry: u64, tokens_granted: u64) -> u64 {
        tokens(self.words[i].swap(pack(expiry, tokens_granted), Ordering::Relaxed))
    }

    /// Adds a later grant's `tokens_granted` to word `i`; the word keeps the earlier of its
    /// expiry and `expiry`. Returns `false`, changing nothing, when the sum would not fit
    /// a word.
    pub(crate) fn merge(&self, i: usize, expiry_at: u64, tokens_granted: u64) -> bool {
        let word = &self.words[i];
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let sum = tokens(cur) + tokens_granted;
            if sum > MAX_LEASE_TOKENS {
                return false;
            }
            match word.compare_exchange_weak(
                cur,
                pack(expiry(cur).min(expiry_at), sum),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Empties word `i`; returns the tokens it held (unspent).
    pub(crate) fn retire(&self, i: usize) -> u64 {
        tokens(self.words[i].swap(0, Ordering::Relaxed))
    }

    /// Live tokens at `now`.
    pub(crate) fn live(&self, now: u64) -> u64 {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .filter(|&w| now < expiry(w))
            .map(tokens)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spends_from_the_first_live_word_that_holds_the_cost() {
        let r = Reservoir::default();
        r.install(0, 10, 3);
        r.install(1, 20, 8);
        assert_eq!(r.spend(2, 5), Spend::Paid { left: 1 });
        assert_eq!(r.spend(2, 5), Spend::Paid { left: 6 });
        assert_eq!(r.live(5), 7);
    }

    #[test]
    fn an_expired_word_pays_nothing() {
        let r = Reservoir::default();
        r.install(0, 10, 5);
        assert_eq!(r.spend(1, 10), Spend::Short);
        assert_eq!(r.live(10), 0);
        assert_eq!(r.retire(0), 5);
    }

    #[test]
    fn retiring_takes_the_leftover_and_stops_spending() {
        let r = Reservoir::default();
        r.install(1, 1 << 39, MAX_LEASE_TOKENS);
        assert_eq!(r.spend(MAX_LEASE_TOKENS, 0), Spend::Paid { left: 0 });
        r.install(1, 1 << 39, 4);
        assert_eq!(r.retire(1), 4);
        assert_eq!(r.spend(1, 0), Spend::Short);
    }

    #[test]
    fn a_merged_grant_keeps_the_earlier_expiry_and_never_overflows() {
        let r = Reservoir::default();
        r.install(0, 10, 3);
        assert!(r.merge(0, 12, 4));
        assert_eq!(expiry(r.load(0)), 10);
        assert_eq!(r.live(9), 7);
        assert_eq!(r.live(10), 0);
        assert!(r.merge(0, 8, 1));
        assert_eq!(expiry(r.load(0)), 8, "an earlier expiry wins");
        assert!(!r.merge(0, 20, MAX_LEASE_TOKENS));
        assert_eq!(tokens(r.load(0)), 8);
    }

    #[test]
    fn merges_racing_spends_pay_each_token_once() {
        let r = std::sync::Arc::new(Reservoir::default());
        r.install(0, 100, 1);
        let spender = {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut paid = 0u64;
                while paid < 1 + 1_000 * 5 {
                    if matches!(r.spend(1, 0), Spend::Paid { .. }) {
                        paid += 1;
                    }
                }
                paid
            })
        };
        for _ in 0..1_000 {
            while !r.merge(0, 100, 5) {}
        }
        assert_eq!(spender.join().unwrap(), 5_001);
        assert_eq!(r.live(0), 0);
    }

    #[test]
    fn concurrent_spends_pay_each_token_once() {
        let r = std::sync::Arc::new(Reservoir::default());
        r.install(0, 100, 10_000);
        let paid: u64 = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    (0..5_000)
                        .filter(|_| matches!(r.spend(1, 0), Spend::Paid { .. }))
                        .count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(paid, 10_000);
        assert_eq!(r.live(0), 0);
    }
}
