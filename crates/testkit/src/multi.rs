//! Several buckets on one manual clock, driven by all-or-nothing acquisitions, single
//! operations and refunds, each bucket checked against its own reference models.
//!
//! [`check_multi`] is shared by the fuzz target `multi` and the corpus replay in
//! `cargo test`.

use std::time::Duration;

use crate::check::{PolicySpec, Violation, scale_cost, violation};
use crate::{Ideal, Model, Outcome};
use tokengate::state::Layout;
use tokengate::{
    AcquireError, Bucket, Clock, Decision, ManualClock, multi::MultiError, multi::acquire_all_with,
};

/// The clock every bucket of a scenario reads: one manual clock behind one shared
/// high-water mark.
type SharedClock = std::sync::Arc<tokengate::clock::Monotonic<ManualClock>>;

/// One operation of a multi-bucket scenario. Bucket indices are taken modulo the number
/// of buckets whose policy is valid; costs as in [`Op::Acquire`](crate::Op).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiOp {
    /// `acquire_all` over `(bucket, cost)` pairs (duplicates and costs above a capacity
    /// included: they must be refused with nothing taken).
    AcquireAll(Vec<(u8, u64)>),
    /// `try_acquire(cost)` on one bucket.
    Acquire {
        /// The bucket.
        bucket: u8,
        /// The cost.
        cost: u64,
    },
    /// `refund(cost)` on one bucket.
    Refund {
        /// The bucket.
        bucket: u8,
        /// The cost.
        cost: u64,
    },
    /// Refunds every cost of an earlier admitted `AcquireAll` still outstanding (index
    /// modulo their number; nothing when none is), as a caller whose work did not run.
    Release(u8),
    /// Moves the shared clock forward (saturating).
    Advance(u64),
    /// Moves the shared clock back (any size, as for [`Op::StepBack`](crate::Op)).
    StepBack(u64),
}

/// Buckets with their policies on one shared clock, and the operations.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiScenario {
    /// The clock's time when the buckets are created, in nanoseconds.
    pub start_nanos: u64,
    /// One policy per bucket; invalid ones are refused and leave their bucket out.
    pub buckets: Vec<PolicySpec>,
    /// The operations, in order.
    pub ops: Vec<MultiOp>,
}

/// What a multi-bucket scenario exercised, for coverage statistics of sweeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MultiReport {
    /// Buckets built.
    pub buckets: u64,
    /// `acquire_all` calls admitted.
    pub admitted: u64,
    /// `acquire_all` calls rejected by a bucket (and rolled back).
    pub rejected: u64,
    /// `acquire_all` calls refused for a duplicate bucket.
    pub duplicates: u64,
    /// `acquire_all` calls refused for a cost above a capacity.
    pub over_capacity: u64,
    /// `acquire_all` calls refused because the clock went backwards.
    pub clock_errors: u64,
    /// Rejections that happened after at least one bucket had been taken and rolled back.
    pub rollbacks: u64,
    /// Bucket operations at a time where a bucket's wrapping tick may read differently
    /// from its model (only bounds are checked there).
    pub ambiguous_steps: u64,
}

/// One bucket of the scenario and its references.
struct Member {
    bucket: Bucket<SharedClock>,
    layout: Layout,
    capacity: u64,
    model: Model,
    ideal: Option<Ideal>,
    /// Whether the model still tracks the bucket exactly (see [`check()`](crate::check())).
    exact: bool,
}

impl Member {
    fn word(&self) -> u64 {
        self.bucket.stored_word()
    }

    /// Marks the model inexact when a bucket operation reads a time its wrapping tick
    /// may read differently.
    fn touch(&mut self, now: u64) {
        self.exact &= !self.model.is_ambiguous(now);
    }

    fn take_ideal(&mut self, cost: u64, now: u64, step: usize, i: usize) -> Result<(), Violation> {
        if let Some(ideal) = self.ideal.as_mut().filter(|_| cost > 0) {
            // The engine re-anchors a full bucket whose time reads behind a clock that
            // stepped back; its ideal restarts there too.
            if self.exact && self.model.reanchors(now) {
                ideal.reanchor_full(now);
            }
            if !ideal.take(cost, now) {
                return Err(violation(
                    step,
                    format!(
                        "bucket {i}: admitted cost {cost} beyond the ideal bucket at the \
                         configured rate"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn refund_refs(&mut self, cost: u64, now: u64) {
        if self.exact {
            self.model.refund(cost, now);
        }
        if let Some(ideal) = self.ideal.as_mut().filter(|_| cost > 0) {
            ideal.refund(cost, now);
        }
    }
}

fn outcome(got: &Result<Decision, AcquireError>) -> Outcome {
    match got {
        Ok(d) if d.is_admitted() => Outcome::Admitted {
            balance: i128::from(d.balance_units()),
        },
        Ok(d) => Outcome::Rejected {
            balance: i128::from(d.balance_units()),
            retry_after: d.retry_after().unwrap_or(Duration::MAX),
        },
        Err(AcquireError::CostExceedsCapacity { .. }) => Outcome::CostExceedsCapacity,
        Err(AcquireError::ClockWentBackwards { .. }) => Outcome::ClockWentBackwards,
        Err(_) => Outcome::OtherError,
    }
}

/// Runs `scenario` and checks, after every operation:
///
/// - `acquire_all` with a cost above its bucket's capacity, or a bucket named twice, is
///   refused with the right error naming the right positions, and writes nothing;
/// - otherwise every member's word after the call is exactly its refilled word less its
///   cost (admitted), or holds exactly its refilled balance (rejected or clock error:
///   rolled back); members not asked for are untouched; `observe` saw the members in
///   ascending identity order, all admitted but a refusing last one (or, for a refusal
///   of the read-only first pass, the refusing member alone: the first in the list that
///   cannot pay);
/// - while the members' models are exact (no wrap ambiguity): the decision, the refusing
///   position, its balance and wait, and the set's `retry_after` equal the models' (each
///   model driven by the costs admitted for its bucket alone);
/// - for every bucket, every admitted cost is covered by its [`Ideal`] bucket at the
///   configured rate, the balance never exceeds the capacity (I1) nor the ideal's, and
///   while exact equals its model's;
/// - single `try_acquire`/`refund` and releases of earlier admissions behave as on one
///   bucket.
///
/// # Errors
///
/// The first [`Violation`] found. A panic inside the engine propagates.
pub fn check_multi(scenario: &MultiScenario) -> Result<MultiReport, Violation> {
    let mut report = MultiReport::default();
    let manual = ManualClock::new();
    manual.set(Duration::from_nanos(scenario.start_nanos));
    // One high-water mark shared by every bucket and the harness, so all read one time.
    let clock = std::sync::Arc::new(tokengate::clock::Monotonic::new(manual.clone()));
    let mut members = Vec::new();
    for spec in &scenario.buckets {
        match spec.build() {
            Ok(policy) => members.push(Member {
                bucket: Bucket::with_clock(policy, clock.clone()),
                layout: *policy.layout(),
                capacity: policy.capacity(),
                model: Model::new(&policy, scenario.start_nanos),
                ideal: Ideal::new(&policy, scenario.start_nanos),
                exact: true,
            }),
            Err(e) if e.to_string().is_empty() => {
                return Err(violation(0, "policy error with an empty message"));
            }
            Err(_) => {}
        }
    }
    if members.is_empty() {
        return Ok(report);
    }
    report.buckets = members.len() as u64;
    let n = members.len();
    let mut outstanding: Vec<Vec<(usize, u64)>> = Vec::new();

    for (step, op) in scenario.ops.iter().enumerate() {
        let now = clock.now_nanos();
        let before: Vec<u64> = members.iter().map(Member::word).collect();
        match op {
            MultiOp::Advance(d) => manual.advance(Duration::from_nanos(*d)),
            MultiOp::StepBack(d) => {
                if members.iter().all(|m| m.exact) {
                    let raw = manual.now_nanos();
                    manual.set(Duration::from_nanos(raw.saturating_sub(*d)));
                }
            }
            MultiOp::AcquireAll(request) => {
                let request: Vec<(usize, u64)> = request
                    .iter()
                    .map(|&(b, c)| {
                        let i = usize::from(b) % n;
                        (i, scale_cost(c, members[i].capacity))
                    })
                    .collect();
                if acquire_all_step(&mut members, &request, now, &before, step, &mut report)? {
                    outstanding.push(request);
                }
            }
            MultiOp::Acquire { bucket, cost } => {
                let i = usize::from(*bucket) % n;
                let m = &mut members[i];
                let cost = scale_cost(*cost, m.capacity);
                m.touch(now);
                let got = m.bucket.try_acquire(cost);
                let admitted = got.is_ok_and(|d| d.is_admitted());
                if admitted {
                    m.take_ideal(cost, now, step, i)?;
                }
                if !(admitted && cost > 0) && m.word() != before[i] {
                    return Err(violation(
                        step,
                        format!("bucket {i}: a rejection or error wrote the word (I5)"),
                    ));
                }
                if m.exact {
                    let expected = m.model.try_acquire(cost, now);
                    let actual = outcome(&got);
                    if actual != expected {
                        return Err(violation(
                            step,
                            format!(
                                "bucket {i}: acquire({cost}): engine {actual:?}, model {expected:?}"
                            ),
                        ));
                    }
                }
            }
            MultiOp::Refund { bucket, cost } => {
                let i = usize::from(*bucket) % n;
                let m = &mut members[i];
                let cost = scale_cost(*cost, m.capacity);
                m.touch(now);
                let got = m.bucket.refund(cost);
                if cost > m.capacity {
                    if got.is_ok() || m.word() != before[i] {
                        return Err(violation(
                            step,
                            format!("bucket {i}: refund above capacity not refused cleanly"),
                        ));
                    }
                } else if got.is_err() {
                    return Err(violation(
                        step,
                        format!("bucket {i}: refund({cost}) failed: {got:?}"),
                    ));
                } else {
                    m.refund_refs(cost, now);
                }
            }
            MultiOp::Release(k) => {
                if !outstanding.is_empty() {
                    let request = outstanding.remove(usize::from(*k) % outstanding.len());
                    for (i, cost) in request {
                        let m = &mut members[i];
                        m.touch(now);
                        if let Err(e) = m.bucket.refund(cost) {
                            return Err(violation(
                                step,
                                format!("bucket {i}: refund({cost}) of an admission failed: {e}"),
                            ));
                        }
                        m.refund_refs(cost, now);
                    }
                }
            }
        }

        // Bounds for every bucket, whatever happened before.
        let now = clock.now_nanos();
        for (i, m) in members.iter().enumerate() {
            let l = &m.layout;
            let Some((_, units)) = l.decode(m.word()) else {
                return Err(violation(
                    step,
                    format!("bucket {i}: the word decodes to more than max_units"),
                ));
            };
            let balance = i128::from(units) - i128::from(l.base_units());
            if balance > i128::from(l.max_units() - l.base_units()) {
                return Err(violation(
                    step,
                    format!("bucket {i}: balance above capacity (I1)"),
                ));
            }
            if let Some(ideal) = &m.ideal {
                if !ideal.covers_units(balance, l.frac_bits(), now) {
                    return Err(violation(
                        step,
                        format!(
                            "bucket {i}: stored balance {balance} units above the ideal bucket's"
                        ),
                    ));
                }
            }
            if m.exact && !m.model.is_ambiguous(now) {
                let snapshot = l.refill(m.word(), l.tick_of(now));
                let engine = i128::from(l.balance_units(&snapshot));
                let model = m.model.balance_units(now);
                if engine != model {
                    return Err(violation(
                        step,
                        format!("bucket {i}: balance {engine} units, model {model}"),
                    ));
                }
            }
        }
        report.ambiguous_steps += members.iter().filter(|m| !m.exact).count() as u64;
    }
    Ok(report)
}

/// One `acquire_all` and its checks; `true` when it admitted.
fn acquire_all_step(
    members: &mut [Member],
    request: &[(usize, u64)],
    now: u64,
    before: &[u64],
    step: usize,
    report: &mut MultiReport,
) -> Result<bool, Violation> {
    let mut observed: Vec<(usize, Decision)> = Vec::new();
    let got = {
        let refs: Vec<(&Bucket<SharedClock>, u64)> = request
            .iter()
            .map(|&(i, c)| (&members[i].bucket, c))
            .collect();
        acquire_all_with(&refs, |i, d| observed.push((i, *d)))
    };
    let unchanged = |members: &[Member]| members.iter().zip(before).all(|(m, &w)| m.word() == w);

    // Refusals before anything is taken.
    if let Some(index) = request.iter().position(|&(i, c)| c > members[i].capacity) {
        let (i, cost) = request[index];
        let want = MultiError::Bucket {
            index,
            error: AcquireError::CostExceedsCapacity {
                cost,
                capacity: members[i].capacity,
            },
        };
        if got != Err(want) || !observed.is_empty() || !unchanged(members) {
            return Err(violation(
                step,
                format!("acquire_all {request:?}: {got:?}, expected {want:?} with nothing taken"),
            ));
        }
        report.over_capacity += 1;
        return Ok(false);
    }
    let mut seen = vec![false; members.len()];
    let duplicated = request
        .iter()
        .any(|&(i, _)| std::mem::replace(&mut seen[i], true));
    if duplicated {
        let named_twice = |first: usize, second: usize| {
            first < second && second < request.len() && request[first].0 == request[second].0
        };
        match got {
            Err(MultiError::DuplicateBucket { first, second })
                if named_twice(first, second) && observed.is_empty() && unchanged(members) => {}
            _ => {
                return Err(violation(
                    step,
                    format!(
                        "acquire_all {request:?}: {got:?}, expected DuplicateBucket with nothing taken"
                    ),
                ));
            }
        }
        report.duplicates += 1;
        return Ok(false);
    }

    // Every member is read at `now`.
    for &(i, _) in request {
        members[i].touch(now);
    }
    let mut order: Vec<usize> = (0..request.len()).collect();
    order.sort_by_key(|&k| members[request[k].0].bucket.id());
    let seen_order: Vec<usize> = observed.iter().map(|&(k, _)| k).collect();
    // A set that cannot be paid is refused by the read-only first pass: only the refusing
    // member is observed, nothing is written. Otherwise members are observed as they are
    // taken, a prefix of the identity order.
    let first_pass_refusal = matches!(&got, Ok(d) if d.is_rejected());
    if !first_pass_refusal && seen_order[..] != order[..seen_order.len().min(order.len())] {
        return Err(violation(
            step,
            format!(
                "observed positions {seen_order:?}, not a prefix of the identity order {order:?}"
            ),
        ));
    }
    if first_pass_refusal && !unchanged(members) {
        return Err(violation(
            step,
            format!("acquire_all {request:?} refused with {got:?} but wrote a word (I5)"),
        ));
    }
    let refused = match &got {
        Ok(d) if d.is_admitted() => None,
        Ok(d) => d.refused_index(),
        Err(MultiError::Bucket {
            index,
            error: AcquireError::ClockWentBackwards { .. },
        }) => Some(*index),
        Err(e) => {
            return Err(violation(
                step,
                format!("acquire_all {request:?}: unexpected {e:?}"),
            ));
        }
    };
    // Observed: the refusing member alone (first pass), or every member up to the erring
    // one, excluded, all admitted.
    let expected_seen = match (refused, &got) {
        (None, _) => order.len(),
        (Some(_), Ok(_)) => 1,
        (Some(k), Err(_)) => order.iter().position(|&o| o == k).unwrap_or(usize::MAX),
    };
    if seen_order.len() != expected_seen {
        return Err(violation(
            step,
            format!("observed {seen_order:?} for refusal at {refused:?} in order {order:?}"),
        ));
    }
    for (n, (k, d)) in observed.iter().enumerate() {
        let last_rejection = refused == Some(*k) && got.is_ok();
        if d.is_admitted() == last_rejection || (n + 1 < observed.len() && !d.is_admitted()) {
            return Err(violation(
                step,
                format!("observed decision {n} at position {k}: {d:?}"),
            ));
        }
    }
    if let (Some(k), Ok(d)) = (refused, &got) {
        if d.refused_decision() != observed.last().map(|(_, d)| d)
            || observed.last().map(|o| o.0) != Some(k)
        {
            return Err(violation(
                step,
                "refused_decision is not the refusing member's decision",
            ));
        }
    }

    // Conservation, word by word.
    let mut asked = vec![None; members.len()];
    for &(i, c) in request {
        asked[i] = Some(c);
    }
    for (i, m) in members.iter().enumerate() {
        let l = &m.layout;
        let after = m.word();
        let Some(cost) = asked[i] else {
            if after != before[i] {
                return Err(violation(
                    step,
                    format!("bucket {i} was not asked for but its word changed"),
                ));
            }
            continue;
        };
        // The word the operation started from: as it was, or as the member's re-anchoring
        // pass left it when one came due (refilled to `now` at its own tick, or full after
        // an idle longer than the fill time). Both hold the balance the word reads; the
        // ideal bound and the model below judge the decisions.
        let tick = l.tick_of(now);
        let read = l.refill(before[i], tick);
        let mut starts = vec![before[i], l.start_word(tick, true)];
        if read.behind() == 0 {
            starts.extend(l.encode(read.tick(l), read.units()));
        }
        let snapshot_of = |w: u64| {
            let s = l.refill(w, tick);
            if s.behind() > l.tolerance_ticks() {
                // Far behind a monotonic reading: idle past the wrap, full.
                l.reanchor_full(tick)
            } else {
                s
            }
        };
        let expected: Vec<u64> = if refused.is_some() || cost == 0 {
            Vec::new()
        } else {
            starts
                .iter()
                .filter_map(|&w| l.take(&snapshot_of(w), cost << l.frac_bits()))
                .collect()
        };
        match expected.first() {
            Some(_) if expected.contains(&after) => {}
            Some(w) => {
                return Err(violation(
                    step,
                    format!("bucket {i}: admitted word {after:#x}, expected {w:#x} (cost {cost})"),
                ));
            }
            None => {
                // Untouched, or written back with exactly its balance at `now`.
                // A take and its refund: the word holds the balance at `now`, anchored
                // as any write near full is.
                let rolled_back: Vec<u64> = starts
                    .iter()
                    .filter_map(|&w| {
                        let taken = l.take(&snapshot_of(w), cost << l.frac_bits())?;
                        let s = l.refill(taken, tick);
                        Some(l.refund(&s, cost << l.frac_bits()))
                    })
                    .collect();
                if after != before[i] && !rolled_back.contains(&after) {
                    return Err(violation(
                        step,
                        format!(
                            "bucket {i}: word {after:#x} after {}, expected its balance at now unchanged",
                            if refused.is_some() {
                                "a refusal"
                            } else {
                                "a zero cost"
                            }
                        ),
                    ));
                }
            }
        }
    }
    if refused.is_some() && observed.len() > 1 {
        report.rollbacks += 1;
    }
    if refused.is_some() {
        // Rolled back members were written at `now`: their references move there too.
        for &(i, _) in request {
            let m = &mut members[i];
            if m.word() == before[i] {
                continue;
            }
            if let Some(ideal) = m.ideal.as_mut() {
                if m.exact && m.model.reanchors(now) {
                    ideal.reanchor_full(now);
                }
                ideal.advance(now);
            }
            if m.exact {
                m.model.advance(now);
            }
        }
    }

    // Each bucket's references: the ideal bound always, the exact model while unambiguous.
    if refused.is_none() {
        for (k, d) in &observed {
            let (i, cost) = request[*k];
            let m = &mut members[i];
            m.take_ideal(cost, now, step, i)?;
            if m.exact {
                let expected = m.model.try_acquire(cost, now);
                let actual = outcome(&Ok(*d));
                if actual != expected {
                    return Err(violation(
                        step,
                        format!("bucket {i} in acquire_all: engine {actual:?}, model {expected:?}"),
                    ));
                }
            }
        }
    } else if request.iter().all(|&(i, _)| members[i].exact) {
        // The models predict the refusal: the read-only first pass refuses at the first
        // member in listed order that would reject (it leaves members whose time reads
        // behind to the takes); failing that, the takes stop at the first member, in
        // identity order, that errs.
        let outcome_of = |k: usize| {
            let (i, cost) = request[k];
            (k, members[i].model.clone().try_acquire(cost, now))
        };
        let expected = (0..request.len())
            .map(outcome_of)
            .find(|(_, o)| matches!(o, Outcome::Rejected { .. }))
            .or_else(|| {
                order
                    .iter()
                    .map(|&k| outcome_of(k))
                    .find(|(_, o)| !matches!(o, Outcome::Admitted { .. }))
            });
        match (expected, &got) {
            (
                Some((
                    k,
                    Outcome::Rejected {
                        balance,
                        retry_after,
                    },
                )),
                Ok(d),
            ) if d.refused_index() == Some(k) => {
                let refusing = d
                    .refused_decision()
                    .map(|d| (i128::from(d.balance_units()), d.retry_after()));
                if refusing != Some((balance, Some(retry_after))) {
                    return Err(violation(
                        step,
                        format!(
                            "refusing member: engine {refusing:?}, model {:?}",
                            (balance, retry_after)
                        ),
                    ));
                }
                let wait = request
                    .iter()
                    .map(|&(i, c)| members[i].model.wait_for(c, now))
                    .max();
                if d.retry_after() != wait {
                    return Err(violation(
                        step,
                        format!("set retry_after {:?}, models {wait:?}", d.retry_after()),
                    ));
                }
            }
            (Some((k, Outcome::ClockWentBackwards)), Err(MultiError::Bucket { index, .. }))
                if *index == k => {}
            (expected, got) => {
                return Err(violation(
                    step,
                    format!(
                        "acquire_all {request:?}: engine {got:?}, models expected refusal {expected:?}"
                    ),
                ));
            }
        }
    }
    match got {
        Ok(_) if refused.is_none() => report.admitted += 1,
        Ok(_) => report.rejected += 1,
        Err(_) => report.clock_errors += 1,
    }
    Ok(refused.is_none())
}
