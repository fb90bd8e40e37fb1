//! The rate-lease script on a real Redis, on exact time (the test clock prologue): random
//! schedules of refreshes, lost and delayed replies and clock steps, each checked against
//! the cap by a model of the clients (what each may spend at every instant: the last
//! share it received, until `ttl` after it sent that request); and the fair division, the
//! minimum share, acknowledgement and learning after a loss. The cap counts the pool of
//! dropped tokens Redis hands on: the bursts clients may spend plus the pool never exceed
//! `B` (a client's bucket holds at most its burst), with drops reported again after lost
//! replies.

mod common;

use tokengate_redis::RemotePolicy;
use tokengate_redis::Start;
use tokengate_redis::rate::script::{RateAsk, RateKeys, RateReply, RateScript, RateTarget};
use tokengate_redis::script::TimeSource;

const B: u64 = 200;
const R_MILLI: u64 = 100_000;
const TTL_US: u64 = 400_000;
const GRACE_US: u64 = 50_000;

struct Fleet {
    con: redis::Connection,
    script: RateScript,
    keys: RateKeys,
    policy: RemotePolicy,
    min_milli: u64,
}

impl Fleet {
    fn new(test: &str, start: Start) -> Self {
        let mut con = common::connect();
        let script = RateScript::new(TimeSource::Argument);
        script.load(&mut con).unwrap();
        Self {
            con,
            script,
            keys: RateKeys::new(&common::namespace(test), "global").unwrap(),
            policy: RemotePolicy::new(B, R_MILLI as f64 / 1000.0)
                .unwrap()
                .with_start(start),
            min_milli: R_MILLI / 64,
        }
    }

    fn ask(&mut self, ask: &RateAsk, now_us: u64) -> RateReply {
        let target = RateTarget {
            keys: &self.keys,
            policy: &self.policy,
            lease_us: TTL_US + GRACE_US,
            min_share_milli: self.min_milli,
            keep_ms: 1000,
        };
        self.script
            .refresh(&mut self.con, &target, ask, now_us)
            .unwrap()
    }

    /// `c`'s refresh wanting `want` at `at` and Redis's reply, which has not reached `c`
    /// (or never will: a lost reply).
    fn request(&mut self, c: &mut Client, want: u64, at: u64) -> RateReply {
        let ask = c.ask(want, at);
        self.ask(&ask, at)
    }

    /// [`request`](Self::request), its reply on its way to `c` (delivered by
    /// [`Client::deliver`], or lost).
    fn send(&mut self, c: &mut Client, want: u64, at: u64) -> RateReply {
        let reply = self.request(c, want, at);
        c.pending = Some((reply, c.seq, at));
        reply
    }

    /// [`send`](Self::send), the reply delivered at once.
    fn round(&mut self, c: &mut Client, want: u64, at: u64) -> RateReply {
        let reply = self.send(c, want, at);
        c.deliver();
        reply
    }

    /// `c` leaves at `at`, reporting that it spends nothing (it takes nothing, and the call
    /// only brings the pool up to date): the pool's tokens then.
    fn leave(&mut self, c: &mut Client, at: u64) -> u64 {
        let mut ask = c.ask(0, at);
        ask.has = None;
        ask.leave = true;
        let reply = self.ask(&ask, at);
        assert!(reply.granted && reply.rate_milli == 0, "{reply:?}");
        self.pool(at)
    }

    /// The tokens in the pool of dropped tokens at `now_us` (none past its expiry).
    fn pool(&mut self, now_us: u64) -> u64 {
        let (pool, pexp): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&self.keys.state)
            .arg("pool")
            .arg("pexp")
            .query(&mut self.con)
            .unwrap();
        match (pool, pexp) {
            (Some(p), Some(e)) if e > now_us => p,
            _ => 0,
        }
    }

    fn delete(&mut self) {
        let _: () = redis::cmd("DEL")
            .arg(&self.keys.state)
            .arg(&self.keys.instances)
            .query(&mut self.con)
            .unwrap();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.delete();
    }
}

/// A client as the library runs one: it spends the last share it received until `ttl`
/// after it sent that request, and reports it while it may.
#[derive(Clone, Default)]
struct Client {
    id: String,
    seq: u64,
    /// (seq, rate, burst, local end µs)
    has: Option<(u64, u64, u64, u64)>,
    /// A reply on its way: (reply, sent at).
    pending: Option<(RateReply, u64, u64)>,
    /// Tokens dropped by a shrink, not yet acknowledged: (id, tokens); and what the last
    /// request reported.
    dropped: Option<(u64, u64)>,
    sent_drop: Option<(u64, u64)>,
    drop_ids: u64,
    /// The tokens it reports holding (how many a grant may add).
    tokens: u64,
}

impl Client {
    fn named(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ..Client::default()
        }
    }

    fn spending(&self, now: u64) -> Option<(u64, u64, u64, u64)> {
        self.has.filter(|h| h.3 > now)
    }

    fn ask(&mut self, want: u64, now: u64) -> RateAsk {
        self.seq += 1;
        self.sent_drop = self.dropped;
        RateAsk {
            instance: self.id.clone(),
            seq: self.seq,
            has: self.spending(now).map(|(s, r, b, _)| (s, r, b)),
            want_milli: want,
            leave: false,
            dropped: self.dropped,
            tokens: self.tokens,
        }
    }

    /// The share shrinks to `burst` with a full bucket: every token above it is dropped.
    /// Returns how many.
    fn drop_to(&mut self, old: u64, burst: u64) -> u64 {
        if old > burst {
            self.drop_ids += 1;
            self.dropped = Some((self.drop_ids, old - burst));
        }
        old.saturating_sub(burst)
    }

    /// Delivers the reply on its way; returns the tokens the client dropped.
    fn deliver(&mut self) -> u64 {
        let mut lost = 0;
        if let Some((reply, seq, sent)) = self.pending.take() {
            if reply.granted {
                assert!(reply.handed <= reply.burst, "{reply:?}");
                if self.dropped == self.sent_drop {
                    self.dropped = None;
                }
                if let Some((_, _, old, _)) = self.has.filter(|_| reply.continuous) {
                    lost = self.drop_to(old, reply.burst);
                }
                self.has = (reply.rate_milli > 0).then_some((
                    seq,
                    reply.rate_milli,
                    reply.burst,
                    sent + TTL_US,
                ));
            }
        }
        lost
    }
}

/// xorshift64*: a fixed, seeded schedule.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The sum of what every client may spend at `now`, against `(r, B)`; the bursts with the
/// pool's tokens against `B`.
fn check_cap(clients: &[Client], pool: u64, now: u64, step: usize, seed: u64) {
    let (mut r, mut b) = (0, 0);
    for c in clients {
        if let Some((_, cr, cb, _)) = c.spending(now) {
            r += cr;
            b += cb;
        }
    }
    assert!(
        r <= R_MILLI && b <= B,
        "seed {seed}, step {step}: the clients may spend {r} milli-tokens/s and {b} tokens of burst, above r = {R_MILLI} and B = {B}"
    );
    assert!(
        b + pool <= B,
        "seed {seed}, step {step}: the clients' bursts ({b}) and the pool of dropped tokens ({pool}) hold more than B = {B}"
    );
}

/// The integral over `[t0, t1]` of the rate no client may spend (`r` less the rates of
/// the shares the clients spend, each until its local end), in 10^-9 tokens.
fn idle_between(clients: &[Client], t0: u64, t1: u64) -> u128 {
    let mut idle = u128::from(R_MILLI) * u128::from(t1 - t0);
    for c in clients {
        if let Some((_, r, _, end)) = c.has {
            let spent = u128::from(r) * u128::from(end.min(t1).saturating_sub(t0));
            idle = idle.saturating_sub(spent);
        }
    }
    idle
}

/// Between any two requests (each mark taken right after one, when Redis has brought the
/// pool up to date), what entered the pool (its growth plus what it handed on) is at most
/// the drops first reported in between plus the idle rate over that time, and one token
/// (the fraction Redis carried in). So with the clients' buckets, the tokens of the fleet
/// grow by at most `r` per second over every window.
fn check_inflow(marks: &[(usize, u64, u64, u64, u128)], seed: u64) {
    let &(step, pool, handed, allowed, idle) = marks.last().unwrap();
    for &(s0, p0, h0, a0, i0) in &marks[..marks.len() - 1] {
        let entered = (pool + handed) as i128 - (p0 + h0) as i128;
        let may = (allowed - a0) as i128 + ((idle - i0) / 1_000_000_000) as i128 + 1;
        assert!(
            entered <= may,
            "seed {seed}, steps {s0} to {step}: {entered} tokens entered the pool (it holds {pool}, handed on {}), more than the {} dropped and reported first in between and the {} the idle rate refilled (+1)",
            handed - h0,
            allowed - a0,
            (idle - i0) / 1_000_000_000
        );
    }
}

/// Random refreshes (demands from nothing to everything), replies delivered late or lost,
/// time advancing by up to half a lease lifetime: the shares any client may spend never
/// sum above `(r, B)`, and the pool gains no more than the drops and the idle rate.
#[test]
fn shares_any_client_may_spend_never_exceed_the_cap() {
    for seed in 1..=6u64 {
        let mut f = Fleet::new("rate-cap", Start::Full);
        let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
        let k = 2 + (seed as usize % 5);
        let mut clients: Vec<Client> = (0..k).map(|i| Client::named(&format!("c{i}"))).collect();
        let mut now = 1_000_000_000u64;
        let mut granted = 0u64;
        let mut handed = 0u64;
        // Tokens the clients dropped, each drop once (counted as they drop).
        let mut dropped = 0u64;
        // What may enter the pool: each drop at the first request that reports it, and
        // the rate no client may spend, integrated over time (10^-9 tokens).
        let mut allowed = 0u64;
        let mut idle_nano = 0u128;
        let mut reported: Vec<u64> = vec![0; k];
        // After each request (and at the start): (step, pool, handed so far, drops
        // allowed so far, idle integral so far).
        let mut marks: Vec<(usize, u64, u64, u64, u128)> = vec![(0, 0, 0, 0, 0)];
        for step in 0..1500 {
            let mut asked = false;
            let i = rng.below(k as u64) as usize;
            match rng.below(10) {
                0..=4 => {
                    // A refresh; its reply arrives later (or is lost).
                    if clients[i].pending.is_none() {
                        // Now and then the client first shrinks its share locally (its
                        // demand fell) and reports the smaller one.
                        if rng.below(3) == 0 {
                            if let Some(h) = clients[i].has.as_mut() {
                                h.1 /= 2;
                                let old = h.2;
                                h.2 /= 2;
                                let new = h.2;
                                dropped += clients[i].drop_to(old, new);
                            }
                        }
                        let want = match rng.below(4) {
                            0 => 0,
                            1 => R_MILLI,
                            _ => rng.below(R_MILLI),
                        };
                        let ask = clients[i].ask(want, now);
                        if let Some((id, n)) = ask.dropped {
                            if id > reported[i] {
                                reported[i] = id;
                                allowed += n;
                            }
                        }
                        let reply = f.ask(&ask, now);
                        granted += reply.rate_milli;
                        handed += reply.handed;
                        clients[i].pending = Some((reply, ask.seq, now));
                        asked = true;
                    }
                }
                5..=7 => dropped += clients[i].deliver(),
                8 => clients[i].pending = None,
                _ => {
                    let dt = rng.below(TTL_US / 2);
                    idle_nano += idle_between(&clients, now, now + dt);
                    now += dt;
                }
            }
            let pool = f.pool(now);
            check_cap(&clients, pool, now, step, seed);
            if asked {
                marks.push((step, pool, handed, allowed, idle_nano));
                check_inflow(&marks, seed);
            }
        }
        assert!(allowed <= dropped);
        assert!(granted > 0, "seed {seed}: nothing was ever granted");
        assert!(
            handed > 0,
            "seed {seed}: no dropped token was ever handed on"
        );
    }
}

/// Four instances wanting everything get equal shares, less one minimum share kept free,
/// once their first grants are acknowledged; a fifth gets a share at once.
#[test]
fn equal_demands_get_equal_shares_and_a_newcomer_starts_at_once() {
    let mut f = Fleet::new("rate-fair", Start::Full);
    let mut clients: Vec<Client> = (0..4).map(|i| Client::named(&format!("c{i}"))).collect();
    let mut now = 1_000_000_000u64;
    for _ in 0..4 {
        for c in &mut clients {
            f.round(c, R_MILLI, now);
        }
        now += 10_000;
    }
    let fair = (R_MILLI - f.min_milli) / 4;
    for c in &clients {
        let (_, r, b, _) = c.has.unwrap();
        assert_eq!(r, fair, "rate share");
        // Two tokens for each of the four and for a newcomer, the rest in proportion.
        assert_eq!(b, 2 + (B - 2 * 5) * fair / R_MILLI, "burst share");
    }
    let mut newcomer = Client::named("new");
    let reply = f.request(&mut newcomer, R_MILLI, now);
    assert!(
        reply.rate_milli >= f.min_milli && reply.burst >= 1,
        "{reply:?}"
    );
    assert!(!reply.continuous, "a newcomer's bucket starts empty");
}

/// A share taken from an instance goes to another only once that instance acknowledged
/// its smaller share or its grant expired: never while it may still spend it.
#[test]
fn a_shrunk_share_moves_only_after_acknowledgement_or_expiry() {
    let mut f = Fleet::new("rate-ack", Start::Full);
    let mut a = Client::named("a");
    let mut b = Client::named("b");
    let mut now = 1_000_000_000u64;
    // a alone wants everything: it gets all but the reserve.
    for _ in 0..2 {
        f.round(&mut a, R_MILLI, now);
        now += 1000;
    }
    let big = a.has.unwrap().1;
    assert_eq!(big, R_MILLI - f.min_milli);
    // b arrives wanting everything: only the reserve is free.
    let first = f.send(&mut b, R_MILLI, now);
    assert_eq!(first.rate_milli, f.min_milli);
    // a refreshes: its target halves, but a may spend the big share until it hears.
    let shrink = f.send(&mut a, R_MILLI, now);
    assert!(shrink.rate_milli < big);
    b.deliver();
    let before_ack = f.round(&mut b, R_MILLI, now + 1000);
    assert_eq!(
        before_ack.rate_milli, f.min_milli,
        "a's share moved before a acknowledged it"
    );
    // a hears and acknowledges: the difference is free at once.
    a.deliver();
    f.request(&mut a, R_MILLI, now + 2000);
    let after_ack = f.request(&mut b, R_MILLI, now + 3000);
    assert!(
        after_ack.rate_milli > before_ack.rate_milli,
        "{after_ack:?}"
    );
    // Had a never heard, its big share would move only after its expiry.
    let mut f2 = Fleet::new("rate-expiry", Start::Full);
    let mut a2 = Client::named("a");
    let mut b2 = Client::named("b");
    let t0 = 1_000_000_000u64;
    f2.round(&mut a2, R_MILLI, t0);
    f2.request(&mut a2, 0, t0 + 1000); // a2 goes idle; the reply is lost
    assert_eq!(
        f2.request(&mut b2, R_MILLI, t0 + 2000).rate_milli,
        f2.min_milli
    );
    let late = t0 + 1000 + TTL_US + GRACE_US; // a2's grants expired
    let reply = f2.request(&mut b2, R_MILLI, late);
    assert_eq!(reply.rate_milli, R_MILLI - f2.min_milli, "{reply:?}");
}

/// A stale or repeated sequence number writes nothing.
#[test]
fn a_stale_request_changes_nothing() {
    let mut f = Fleet::new("rate-stale", Start::Full);
    let mut a = Client::named("a");
    let now = 1_000_000_000u64;
    let ask = a.ask(R_MILLI, now);
    assert!(f.ask(&ask, now).granted);
    let again = f.ask(&ask, now + 10);
    assert!(!again.granted && again.rate_milli == 0, "{again:?}");
}

/// After the state is lost, a policy starting empty learns for one lease lifetime: an
/// instance reporting a share keeps at most it, a newcomer gets nothing; afterwards
/// shares are divided again.
#[test]
fn after_a_loss_nobody_gets_more_than_it_spends_for_one_lifetime() {
    let mut f = Fleet::new("rate-learn", Start::Empty);
    let now = 1_000_000_000u64;
    f.delete();
    let a = RateAsk {
        instance: "a".into(),
        seq: 7,
        has: Some((6, 30_000, 60)),
        want_milli: R_MILLI,
        leave: false,
        ..RateAsk::default()
    };
    let reply = f.ask(&a, now);
    assert!(reply.rate_milli <= 30_000 && reply.burst <= 60, "{reply:?}");
    assert!(reply.continuous);
    let newcomer = RateAsk {
        instance: "n".into(),
        seq: 1,
        has: None,
        want_milli: R_MILLI,
        leave: false,
        ..RateAsk::default()
    };
    assert_eq!(f.ask(&newcomer, now + 1000).rate_milli, 0);
    let later = RateAsk { seq: 2, ..newcomer };
    let after = f.ask(&later, now + TTL_US + GRACE_US + 1);
    assert!(after.rate_milli > 0, "{after:?}");
}

/// Tokens a shrinking client dropped are credited to the pool once per drop id (a retry
/// after a lost reply credits nothing more), at most by what its burst shrank, handed on
/// to the next grant as far as its bucket has room (taken from the pool before the reply),
/// and gone at the pool's expiry.
#[test]
fn dropped_tokens_are_credited_once_and_handed_on() {
    let mut f = Fleet::new("rate-pool", Start::Full);
    let mut a = Client::named("a");
    let mut b = Client::named("b");
    let now = 1_000_000_000u64;
    f.round(&mut a, R_MILLI, now);
    f.round(&mut a, R_MILLI, now + 1);
    f.round(&mut b, R_MILLI, now + 2);
    let (_, big_r, big, _) = a.has.unwrap();
    assert!(big > 100, "{big}");
    // a's demand falls: it shrinks its bucket to 20 (dropping what is above) and reports;
    // the reply is lost.
    let h = a.has.as_mut().unwrap();
    h.1 = big_r / 10;
    h.2 = 20;
    a.drop_to(big, 20);
    a.tokens = 20;
    // (It asks for less than it spends: the grants' bursts stay under 20, so what Redis
    // counts it holding is the 20 it reports.)
    f.send(&mut a, big_r / 20, now + 10);
    assert_eq!(f.pool(now + 10), big - 20);
    // The retry carries the same drop and credits nothing more; a larger claim under a
    // new id is capped at what its counted burst shrank since (nothing).
    f.send(&mut a, big_r / 20, now + 20);
    assert_eq!(f.pool(now + 20), big - 20, "a drop was credited twice");
    a.drop_ids += 1;
    a.dropped = Some((a.drop_ids, big));
    f.send(&mut a, big_r / 20, now + 30);
    assert_eq!(
        f.pool(now + 30),
        big - 20,
        "more was credited than the burst shrank"
    );
    // b, its bucket full of its small share, asks for everything: its grant adds what its
    // bucket has room for from the pool.
    b.tokens = b.has.unwrap().2;
    let reply = f.round(&mut b, R_MILLI, now + 40);
    assert!(
        reply.handed > 100 && reply.handed + b.tokens <= reply.burst,
        "{reply:?}"
    );
    assert_eq!(f.pool(now + 40), big - 20 - reply.handed);
    // What is left expires with the pool, one lease lifetime after the last credit.
    assert!(f.pool(now + 10 + TTL_US + GRACE_US - 1) > 0);
    assert_eq!(f.pool(now + 10 + TTL_US + GRACE_US), 0);
}

/// The rate no client holds accrues to the pool at that rate (up to the burst no client
/// holds) and is handed to a grant that wants more than it gets: a share given back is
/// not lost while no other instance's share has grown into it.
#[test]
fn idle_rate_accrues_to_the_pool_and_is_handed_on() {
    let mut f = Fleet::new("rate-accrue", Start::Full);
    let mut a = Client::named("a");
    let mut b = Client::named("b");
    let now = 1_000_000_000u64;
    // a and b both want everything: each half of r less the reserve; only the reserve
    // (r/64) is idle.
    for t in 0..3 {
        f.round(&mut a, R_MILLI, now + t);
        f.round(&mut b, R_MILLI, now + t);
    }
    let (_, ra, ba, _) = a.has.unwrap();
    let (_, rb, bb, _) = b.has.unwrap();
    let idle = R_MILLI - ra - rb;
    assert!(idle <= f.min_milli + 2, "{ra} {rb}");
    // a gives back all but a tenth of its share (it shrinks locally first, dropping
    // nothing: its bucket is empty); its acknowledgement frees the rest at once.
    let h = a.has.as_mut().unwrap();
    h.1 = ra / 10;
    h.2 = ba / 10;
    f.round(&mut a, ra / 10, now + 10);
    let free = R_MILLI - a.has.unwrap().1 - rb;
    // 100 ms later: the pool holds what the idle rate refilled (at most: a's own next
    // grant may have been clamped), capped by the burst nobody holds.
    let t = now + 10 + 100_000;
    f.round(&mut a, ra / 10, t);
    let pool = f.pool(t);
    let refilled = free * 100_000 / 1_000_000_000;
    let unheld = B - a.has.unwrap().2 - bb;
    assert!(
        pool <= refilled.min(unheld) + 1,
        "pool {pool}, refilled {refilled}, unheld {unheld}"
    );
    assert!(
        pool + 2 >= refilled.min(unheld),
        "pool {pool}, refilled {refilled}, unheld {unheld}"
    );
    assert!(pool > 0);
    // b, its bucket empty and wanting more than it gets, starts its next grant with them.
    b.tokens = 0;
    let reply = f.round(&mut b, R_MILLI, t + 1);
    assert_eq!(reply.handed, pool.min(reply.burst), "{reply:?}");
}

/// One instance of an idle fleet holds all but the reserve and wants little; its
/// refreshes let the idle reserve fill the pool up to the burst nobody holds. A newcomer
/// still starts at once, wanting nothing as well as wanting everything: the pool never
/// takes the burst kept for it.
#[test]
fn a_newcomer_starts_at_once_beside_a_full_pool() {
    for (name, want) in [("rate-newcomer-0", 0), ("rate-newcomer-all", R_MILLI)] {
        let mut f = Fleet::new(name, Start::Full);
        // A reserve of r/8 (12.5 tokens/s) refills the pool faster than it expires.
        f.min_milli = R_MILLI / 8;
        let mut a = Client::named("a");
        let mut now = 1_000_000_000u64;
        let mut full = false;
        for _ in 0..40 {
            f.round(&mut a, 0, now);
            let (_, _, ba, _) = a.has.unwrap();
            if f.pool(now) == B - ba {
                full = true;
                break;
            }
            now += TTL_US / 2;
        }
        assert!(full, "{name}: the pool never filled ({})", f.pool(now));
        let mut newcomer = Client::named("new");
        now += 1;
        let reply = f.request(&mut newcomer, want, now);
        assert!(
            reply.rate_milli > 0 && reply.burst > 0,
            "{name}: a newcomer beside a full pool ({}) got {reply:?}",
            f.pool(now)
        );
    }
}

/// When the instance of [`idle_fleet`] left.
const LEFT_AT: u64 = 1_000_000_001;

/// `ms` milliseconds after the instance of [`idle_fleet`] left.
fn at(ms: u64) -> u64 {
    LEFT_AT + ms * 1000
}

/// A fleet whose one instance, `a`, was granted a share and left 1 µs later, reporting
/// that it spends nothing: all of r is idle from then on. Its later calls (leaving again,
/// [`Fleet::leave`]) take nothing and only bring the pool up to date.
fn idle_fleet(test: &str) -> (Fleet, Client) {
    let mut f = Fleet::new(test, Start::Full);
    let mut a = Client::named("a");
    assert!(f.request(&mut a, R_MILLI, LEFT_AT - 1).rate_milli > 0);
    f.leave(&mut a, LEFT_AT);
    (f, a)
}

/// Redis's clock steps back: the idle rate accrues over the time it passed once, never
/// twice (the recorded time does not step back with it).
#[test]
fn a_clock_step_back_accrues_no_interval_twice() {
    let (mut f, mut a) = idle_fleet("rate-stepback");
    // 100 ms idle at r = 100 tokens/s: 10 tokens.
    assert_eq!(f.leave(&mut a, at(100)), 10);
    // The clock steps back 50 ms: nothing accrues.
    assert_eq!(f.leave(&mut a, at(50)), 10);
    // 150 ms after the start, 50 ms after the largest time seen: 15 tokens in all, at
    // most the idle rate over the time that passed.
    let pool = f.leave(&mut a, at(150));
    assert!(
        pool <= 15,
        "after a clock step back the pool holds {pool} tokens, more than the 15 the idle rate refilled in 150 ms"
    );
    assert_eq!(pool, 15);
}

/// A state written by an older script version lacks the idle-rate fields: the first
/// refresh of this version accrues nothing (the rate it would count may have been
/// granted meanwhile), records them, and accrual resumes from there.
#[test]
fn a_state_without_idle_rate_fields_accrues_nothing_on_first_contact() {
    let (mut f, mut a) = idle_fleet("rate-upgrade");
    // What an older version leaves: ep, learn, pool, pexp only.
    let _: () = redis::cmd("HDEL")
        .arg(&f.keys.state)
        .arg("free")
        .arg("acc")
        .arg("pcap")
        .arg("pfrac")
        .query(&mut f.con)
        .unwrap();
    assert_eq!(f.leave(&mut a, at(100)), 0, "accrued on first contact");
    assert_eq!(f.leave(&mut a, at(150)), 5);
}
