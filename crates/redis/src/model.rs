//! An exact Rust model of the exchange script, in plain integers: the reference the script
//! is property-tested against on a real Redis (`tests/script_model.rs`). It follows the
//! script's steps, so it checks the script's arithmetic, not its bound: the bound is
//! checked there by an ideal token bucket written from the definition, on the grants and
//! settlements themselves.

use std::collections::{BTreeMap, BTreeSet};

use crate::policy::{Mode, RemotePolicy, Start, UNITS_PER_TOKEN};
use crate::script::{Exchange, Outcome, Reply};

/// How many expired leases one exchange reclaims at most (the script's `LIMIT`).
pub const RECLAIM_LIMIT: usize = 64;

/// One bucket's Redis state, as the script keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelBucket {
    /// The state hash: `None` while the key is missing.
    pub state: Option<ModelState>,
    /// Lease id -> granted tokens.
    pub leases: BTreeMap<String, u64>,
    /// (reclaim time µs, lease id), ordered as the sorted set orders them.
    pub expiry: BTreeSet<(u64, String)>,
    /// Credit id -> the time it was applied, µs.
    pub credits: BTreeMap<String, u64>,
}

/// How long a credit id is remembered, µs, for leases living `lease_us` on Redis: eight
/// lease lifetimes, at least a minute (the script's window).
pub fn credit_window_us(lease_us: u64) -> u64 {
    lease_us.saturating_mul(8).max(60_000_000)
}

/// The state hash's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelState {
    /// Balance, units.
    pub u: u64,
    /// Last refill time, µs.
    pub ts: u64,
    /// Refill remainder, milli-units (below 1000).
    pub rem: u64,
    /// Tokens out on lease.
    pub out: u64,
    /// Epoch (creation time, µs).
    pub ep: u64,
}

impl ModelState {
    /// The state both scripts create for a missing key at `now` (µs): full or empty per
    /// the policy's start, no remainder, nothing out, the epoch `now`.
    fn created(policy: &RemotePolicy, now: u64) -> Self {
        Self {
            u: if policy.start() == Start::Full {
                policy.capacity_units()
            } else {
                0
            },
            ts: now,
            rem: 0,
            out: 0,
            ep: now,
        }
    }
}

impl ModelBucket {
    /// A bucket missing from Redis.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs one exchange at `now` (µs), as the script does with `lease_us` of lease
    /// lifetime on Redis.
    pub fn exchange(
        &mut self,
        policy: &RemotePolicy,
        lease_us: u64,
        ex: &Exchange,
        now: u64,
    ) -> Reply {
        let cap = policy.capacity_units();
        let rate = policy.rate_milli();
        let loose = policy.mode() == Mode::Loose;
        let mut need = ex.need;
        if ex.request_id.is_some() && need < 1 {
            need = 1;
        }
        let mut write = false;
        let mut s = match self.state {
            Some(s) => s,
            None => {
                write = true;
                ModelState::created(policy, now)
            }
        };
        let cap_now = |s: &ModelState| {
            if loose {
                cap
            } else {
                cap.saturating_sub(s.out.saturating_mul(UNITS_PER_TOKEN))
            }
        };
        // The time since `ts` refills under the cap in force over it: each expired lease
        // leaves `out` at its reclaim time, not before.
        let mut gone: BTreeSet<String> = BTreeSet::new();
        for (at, id) in self
            .expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(RECLAIM_LIMIT)
        {
            let limit = cap_now(&s);
            refill(&mut s, limit, rate, *at);
            s.out = s
                .out
                .saturating_sub(self.leases.get(id).copied().unwrap_or(0));
            gone.insert(id.clone());
        }
        let limit = cap_now(&s);
        refill(&mut s, limit, rate, now);
        for (id, back) in &ex.settle {
            if gone.contains(id) {
                continue;
            }
            if let Some(&g) = self.leases.get(id) {
                let back = (*back).min(g);
                s.out = s.out.saturating_sub(g);
                s.u = s.u.saturating_add(back.saturating_mul(UNITS_PER_TOKEN));
                gone.insert(id.clone());
                write = true;
            }
        }
        for (id, g) in &ex.register {
            if *g > 0 && !gone.contains(id) && !self.leases.contains_key(id) {
                self.leases.insert(id.clone(), *g);
                self.expiry.retain(|(_, i)| i != id);
                self.expiry.insert((now + lease_us, id.clone()));
                s.out = s.out.saturating_add(*g);
                match s.u.checked_sub(g.saturating_mul(UNITS_PER_TOKEN)) {
                    Some(u) => s.u = u,
                    None => {
                        s.u = 0;
                        s.rem = 0;
                    }
                }
                write = true;
            }
        }
        let limit = cap_now(&s);
        if s.u > limit {
            s.u = limit;
            s.rem = 0;
        }
        let seen = ex
            .credit_id
            .as_ref()
            .is_some_and(|id| self.credits.contains_key(id));
        if ex.credit_units > 0 && !seen {
            if let Some(id) = &ex.credit_id {
                self.credits.insert(id.clone(), now);
                let oldest = now.saturating_sub(credit_window_us(lease_us));
                self.credits.retain(|_, at| *at > oldest);
            }
            s.u = s.u.saturating_add(ex.credit_units);
            if s.u >= limit {
                s.u = limit;
                s.rem = 0;
            }
            write = true;
        }
        let mut outcome = Outcome::NoGrant;
        if let Some(req) = &ex.request_id {
            let prev = if gone.contains(req) {
                None
            } else {
                self.leases.get(req).copied()
            };
            if gone.contains(req) {
                outcome = Outcome::Replayed {
                    tokens: 0,
                    reclaim_at_us: 0,
                };
            } else if let Some(g) = prev {
                let at = self
                    .expiry
                    .iter()
                    .find(|(_, id)| id == req)
                    .map_or(0, |(at, _)| *at);
                outcome = Outcome::Replayed {
                    tokens: g,
                    reclaim_at_us: at,
                };
            } else if s.u >= need.saturating_mul(UNITS_PER_TOKEN) {
                let g = (s.u / UNITS_PER_TOKEN).min(ex.want).max(need);
                s.u -= g * UNITS_PER_TOKEN;
                s.out += g;
                let at = now + lease_us;
                outcome = Outcome::Granted {
                    tokens: g,
                    reclaim_at_us: at,
                };
                self.leases.insert(req.clone(), g);
                self.expiry.retain(|(_, i)| i != req);
                self.expiry.insert((at, req.clone()));
                write = true;
            } else {
                let retry_after_us = if need.saturating_mul(UNITS_PER_TOKEN) > limit {
                    match self.expiry.iter().next() {
                        Some((at, _)) if need.saturating_mul(UNITS_PER_TOKEN) <= cap => {
                            Some(at.saturating_sub(now).max(1))
                        }
                        _ => None,
                    }
                } else {
                    let short = (need.saturating_mul(UNITS_PER_TOKEN) - s.u) * 1000 - s.rem;
                    Some(short.div_ceil(rate))
                };
                outcome = Outcome::Rejected { retry_after_us };
            }
        }
        let first_paid = matches!(outcome, Outcome::Granted { .. } | Outcome::Replayed { .. });
        let mut more = Vec::with_capacity(ex.more.len());
        for id in &ex.more {
            let mut got = (0, 0);
            if first_paid && !gone.contains(id) {
                if let Some(&g) = self.leases.get(id) {
                    let at = self
                        .expiry
                        .iter()
                        .find(|(_, i)| i == id)
                        .map_or(0, |(at, _)| *at);
                    got = (g, at);
                } else if s.u >= UNITS_PER_TOKEN {
                    let g = (s.u / UNITS_PER_TOKEN).min(ex.want).max(1);
                    s.u -= g * UNITS_PER_TOKEN;
                    s.out += g;
                    let at = now + lease_us;
                    self.leases.insert(id.clone(), g);
                    self.expiry.retain(|(_, i)| i != id);
                    self.expiry.insert((at, id.clone()));
                    got = (g, at);
                    write = true;
                }
            }
            more.push(got);
        }
        if write {
            for id in &gone {
                self.leases.remove(id);
                self.expiry.retain(|(_, i)| i != id);
            }
            self.state = Some(s);
        }
        Reply {
            outcome,
            balance_units: s.u,
            outstanding: s.out,
            epoch: s.ep,
            now_us: now,
            more,
        }
    }
}

/// The strict take script on the model: takes `cost` tokens from every bucket at `now`,
/// all or nothing, as `lua/take.lua` does.
pub fn take_all(
    buckets: &mut [(&mut ModelBucket, &RemotePolicy, u64)],
    now: u64,
) -> crate::script::Take {
    let mut next = Vec::with_capacity(buckets.len());
    for (i, (bucket, policy, cost)) in buckets.iter().enumerate() {
        let cap = policy.capacity_units();
        let rate = policy.rate_milli();
        let cost = cost.saturating_mul(UNITS_PER_TOKEN);
        let created = bucket.state.is_none();
        let mut s = bucket
            .state
            .unwrap_or_else(|| ModelState::created(policy, now));
        let start = s;
        let limit = cap.saturating_sub(s.out.saturating_mul(UNITS_PER_TOKEN));
        refill(&mut s, limit, rate, now);
        if s.u < cost {
            for (j, (b, _, _)) in buckets.iter_mut().enumerate().take(i + 1) {
                if j < next.len() {
                    if let Some((true, first)) = next
                        .get(j)
                        .map(|(c, _, f): &(bool, ModelState, ModelState)| (*c, *f))
                    {
                        b.state = Some(first);
                    }
                } else if created {
                    b.state = Some(start);
                }
            }
            let retry_after_us =
                (cost <= limit).then(|| ((cost - s.u) * 1000 - s.rem).div_ceil(rate));
            return crate::script::Take::Refused {
                index: i,
                retry_after_us,
            };
        }
        s.u -= cost;
        next.push((created, s, start));
    }
    let mut balances = Vec::with_capacity(next.len());
    for ((bucket, _, _), (_, s, _)) in buckets.iter_mut().zip(next) {
        bucket.state = Some(s);
        balances.push(s.u);
    }
    crate::script::Take::Taken(balances)
}

/// The scripts' refill, shared by the exchange and the strict take: caps the balance at
/// `limit`, then adds `elapsed * rate / 1000` units since `s.ts` with the remainder
/// carried, never above `limit` (a full bucket drops its remainder); time never moves back.
fn refill(s: &mut ModelState, limit: u64, rate: u64, now: u64) {
    s.u = s.u.min(limit);
    if now > s.ts {
        if s.u >= limit {
            s.rem = 0;
        } else {
            let short = (limit - s.u) * 1000 - s.rem;
            let elapsed = now - s.ts;
            if elapsed > short / rate {
                s.u = limit;
                s.rem = 0;
            } else {
                let total = elapsed * rate + s.rem;
                s.u += total / 1000;
                s.rem = total % 1000;
                if s.u >= limit {
                    s.u = limit;
                    s.rem = 0;
                }
            }
        }
        s.ts = now;
    }
}
