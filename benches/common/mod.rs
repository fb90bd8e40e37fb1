//! What the benches share: the counts they read from the environment.

/// The count in environment variable `name`, a whole number in `1..=max`, or `default()`
/// when it is not set. A bad value stops the run with a message rather than measuring
/// something else.
pub fn env_count(name: &str, max: usize, default: impl FnOnce() -> usize) -> usize {
    let value = match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => return default(),
        Ok(v) => v,
        Err(std::env::VarError::NotUnicode(v)) => v.to_string_lossy().into_owned(),
    };
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => n,
        _ => {
            eprintln!("error: {name} must be a whole number from 1 to {max}, got {value:?}");
            std::process::exit(2)
        }
    }
}

/// Which case runs `j`-th in round `round` of `count` interleaved cases: each round runs
/// every case once, from a start that moves by one each round, so that no case always
/// follows the same other. In a fixed order a case's time carries what the case before
/// it left behind (caches, branch history, a hypervisor exit): on the HTTP layer's cases
/// that moved a ratio by a few nanoseconds (BENCHMARKS.md, "HTTP layer").
#[allow(dead_code)] // only the interleaved benches
pub fn in_turn(round: usize, j: usize, count: usize) -> usize {
    (round + j) % count
}

/// The 5th percentile and the median of a case's batch means.
#[allow(dead_code)] // only the interleaved benches
pub fn p5_median(mut means: Vec<f64>) -> (f64, f64) {
    means.sort_by(f64::total_cmp);
    (means[means.len() / 20], means[means.len() / 2])
}

/// The largest thread count of a sweep: `TOKENGATE_THREADS` (1 to 1024, as `tokengate
/// bench --threads`), or every core.
#[allow(dead_code)] // not every bench sweeps threads
pub fn max_threads() -> usize {
    env_count("TOKENGATE_THREADS", 1024, || {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    })
}

/// The scoped limiters the benches measure, every rule of `policy` and one class `"one"`
/// costing 1: the global scope alone, the global scope and tenants, or a leased global
/// scope (default lease) with tenants and users; each with its class and the request
/// that pays it (no identity, tenant 1, or tenant 1 and user 1).
#[allow(dead_code)] // not every bench measures the scoped path
pub mod scoped {
    use tokengate::Policy;
    use tokengate::ScopedLimiter;
    use tokengate::leased::LeaseConfig;
    use tokengate::scope::{
        ClassId, Request, Rule, RuleSet, ScopeKind, TenantId, UserId, WorkClass,
    };

    /// A limiter of `rules` with the class `"one"` costing 1, and that class.
    fn with_one(rules: RuleSet) -> (ScopedLimiter, ClassId) {
        let limiter = rules
            .class(WorkClass::new("one", 1))
            .build()
            .expect("valid rules");
        let one = limiter.class("one").expect("a class of this limiter");
        (limiter, one)
    }

    /// The global scope alone, and a request with no identity.
    pub fn global(policy: Policy) -> (ScopedLimiter, ClassId, Request) {
        let (limiter, one) = with_one(RuleSet::new().rule(ScopeKind::Global, Rule::new(policy)));
        (limiter, one, Request::new())
    }

    /// The global scope and tenants, and a request naming tenant 1.
    pub fn tenant(policy: Policy) -> (ScopedLimiter, ClassId, Request) {
        let (limiter, one) = with_one(
            RuleSet::new()
                .rule(ScopeKind::Global, Rule::new(policy))
                .rule(ScopeKind::Tenant, Rule::new(policy)),
        );
        (limiter, one, Request::new().tenant(TenantId(1)))
    }

    /// A leased global scope, tenants and users, and a request naming tenant 1 and user 1.
    pub fn three(policy: Policy) -> (ScopedLimiter, ClassId, Request) {
        let (limiter, one) = with_one(
            RuleSet::new()
                .rule(
                    ScopeKind::Global,
                    Rule::new(policy).leased(LeaseConfig::new()),
                )
                .rule(ScopeKind::Tenant, Rule::new(policy))
                .rule(ScopeKind::User, Rule::new(policy)),
        );
        (
            limiter,
            one,
            Request::new().tenant(TenantId(1)).user(UserId(1)),
        )
    }
}
