//! How much a bucket leases: a pure function of its observed local rate, the round-trip
//! time and what it already holds. The pool's thread calls it once per bucket per round.
//!
//! - **A lease** covers the longer of two round trips and a quarter of the lease
//!   time-to-live at the current rate: a slow instance takes small leases (little stranded
//!   if it dies, little refused early in exact mode), a fast one takes whole leases of `L`.
//!   Never more than `L`, nor than the instance's share of the budget.
//! - **What is held** (live tokens plus grants asked and not yet answered) covers four
//!   round trips at the current rate, so a hot thread never waits on the network at
//!   steady state: several grants go out in one round, up to the lease depth `d`. An
//!   instance that ran dry (a decision found the reservoir short) asks for twice what it
//!   holds (two leases at least), until the measured rate takes over.
//! - **The hold cap**: at most `d` leases of at most `L` each (`H = d*L`, the bound's
//!   term), and at most the share `B / (2K)` for the `K` instances last seen (at least one
//!   lease), so the fleet's leases never hold the whole budget.

/// What the thread knows of one bucket when it plans a round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Inputs {
    /// Tokens per second spent locally, `None` before the first measurement.
    pub(crate) rate: Option<f64>,
    /// The round-trip time, ns.
    pub(crate) rtt_ns: u64,
    /// The lease time-to-live, ns.
    pub(crate) ttl_ns: u64,
    /// The largest lease, tokens (`L`, capped at the capacity).
    pub(crate) max_lease: u64,
    /// The instance's share of the budget, tokens (`B / (2K)`, at least 1).
    pub(crate) share: u64,
    /// The lease depth `d`.
    pub(crate) depth: u64,
    /// Leases held or asked for.
    pub(crate) leases: u64,
    /// Tokens held live plus tokens asked for.
    pub(crate) tokens: u64,
    /// A decision found the reservoir short since the last round.
    pub(crate) short: bool,
    /// A decision asked the thread for a lease since the last round.
    pub(crate) demand: bool,
}

/// What to ask for this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    /// Tokens per lease.
    pub(crate) size: u64,
    /// New grants.
    pub(crate) grants: u64,
}

/// The lease size and the number of new grants for one bucket this round.
pub(crate) fn ask(i: &Inputs) -> Ask {
    let cap = i.max_lease.min(i.share).max(1);
    // Tokens spent over `ns` at the current rate (saturating; `as` maps NaN to 0).
    let covers = |rate: f64, ns: u64| (rate * ns as f64 / 1e9).ceil() as u64;
    // Before the rate is known: whole leases.
    let size = covers(
        i.rate.unwrap_or(f64::INFINITY),
        (2 * i.rtt_ns).max(i.ttl_ns / 4),
    )
    .clamp(1, cap);
    let room = i.depth.saturating_sub(i.leases);
    // What is held at most: `d` leases, and the share (at least one lease).
    let most = i.depth.saturating_mul(size).min(i.share.max(size));
    let rate_target = covers(i.rate.unwrap_or(0.0), 4 * i.rtt_ns);
    // A decision found the reservoir short: the rate measured is what was supplied, not
    // what is wanted; hold twice as much (two leases at least), as TCP's slow start does.
    let target = if i.short {
        rate_target
            .max(i.tokens.saturating_mul(2))
            .max(size.saturating_mul(2))
    } else {
        rate_target
    }
    .min(most);
    // A decision asked while less than a lease is held or asked for (the first round's
    // demand included): one grant at least.
    let force = i.demand && i.tokens < size;
    let mut grants = 0;
    let mut tokens = i.tokens;
    while grants < room {
        let wanted = tokens < target && (tokens == 0 || tokens.saturating_add(size) <= most);
        if !(wanted || (force && grants == 0)) {
            break;
        }
        grants += 1;
        tokens = tokens.saturating_add(size);
    }
    Ask { size, grants }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Inputs {
        Inputs {
            rate: Some(0.0),
            rtt_ns: 200_000,
            ttl_ns: 2_000_000_000,
            max_lease: 100,
            share: 4_500_000,
            depth: 8,
            leases: 0,
            tokens: 0,
            short: false,
            demand: false,
        }
    }

    #[test]
    fn an_idle_bucket_asks_nothing() {
        assert_eq!(ask(&base()).grants, 0);
    }

    #[test]
    fn the_first_round_asks_one_whole_lease() {
        let i = Inputs {
            rate: None,
            demand: true,
            ..base()
        };
        assert_eq!(
            ask(&i),
            Ask {
                size: 100,
                grants: 1
            }
        );
    }

    #[test]
    fn a_grant_held_or_in_flight_answers_the_demand() {
        let i = Inputs {
            rate: None,
            demand: true,
            tokens: 100,
            leases: 1,
            ..base()
        };
        assert_eq!(ask(&i).grants, 0);
        let no_demand = Inputs {
            rate: None,
            ..base()
        };
        assert_eq!(ask(&no_demand).grants, 0);
    }

    #[test]
    fn a_slow_bucket_leases_a_quarter_of_the_ttl_at_its_rate() {
        // 25 tokens/s over 500 ms: 12.5, rounded up.
        let i = Inputs {
            rate: Some(25.0),
            demand: true,
            ..base()
        };
        assert_eq!(
            ask(&i),
            Ask {
                size: 13,
                grants: 1
            }
        );
        // Holding a lease's worth already: nothing more.
        let held = Inputs {
            tokens: 13,
            leases: 1,
            ..i
        };
        assert_eq!(ask(&held).grants, 0);
    }

    #[test]
    fn a_hot_bucket_keeps_four_round_trips_in_flight_up_to_the_depth() {
        // 1M tokens/s, 200 µs round trips: 800 tokens over four of them, 8 leases of 100.
        let i = Inputs {
            rate: Some(1e6),
            ..base()
        };
        assert_eq!(
            ask(&i),
            Ask {
                size: 100,
                grants: 8
            }
        );
        let holding = Inputs {
            leases: 5,
            tokens: 500,
            ..i
        };
        assert_eq!(ask(&holding).grants, 3);
        let full = Inputs {
            leases: 8,
            tokens: 150,
            short: true,
            ..i
        };
        assert_eq!(ask(&full).grants, 0, "never past the depth");
    }

    #[test]
    fn a_bucket_that_ran_dry_asks_twice_what_it_holds() {
        let i = Inputs {
            rate: Some(100.0),
            short: true,
            leases: 1,
            tokens: 0,
            ..base()
        };
        // 100/s over 500 ms: leases of 50; nothing left: two of them.
        assert_eq!(
            ask(&i),
            Ask {
                size: 50,
                grants: 2
            }
        );
        let holding = Inputs {
            tokens: 150,
            leases: 3,
            ..i
        };
        // Twice the 150 held: three more.
        assert_eq!(ask(&holding).grants, 3);
    }

    #[test]
    fn the_share_caps_the_lease_and_what_is_held() {
        let i = Inputs {
            rate: Some(1e6),
            share: 12,
            short: true,
            max_lease: 5,
            ..base()
        };
        // Leases of 5, at most 12 held: two grants (a third would hold 15).
        assert_eq!(ask(&i), Ask { size: 5, grants: 2 });
        let share_one = Inputs { share: 1, ..i };
        assert_eq!(ask(&share_one), Ask { size: 1, grants: 1 });
    }
}
