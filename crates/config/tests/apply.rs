//! A reload applied to a running `ScopedLimiter` (`ConfigWatcher::apply_to`): new
//! policies and costs switched in place with each rule's inheritance, and a file the
//! limiter cannot take in place refused whole, the running configuration kept. Every
//! wait is bounded; nothing asserts a time.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use tokengate::ManualClock;
use tokengate::scope::{Request, Scope, ScopeKind, TenantId};
use tokengate_config::{ConfigError, ConfigWatcher, ProblemKind, ReloadEvent, WatchOptions};

const PATIENCE: Duration = Duration::from_secs(30);

fn file(global: u64, tenant: u64, cost: u64, extra: &str) -> String {
    format!(
        "[[rule]]\nname = \"all\"\nscope = \"global\"\npolicies = [\"100/s burst {global}\"]\n\
         inheritance = \"as_is\"\n\n\
         [[rule]]\nname = \"t\"\nscope = \"tenant\"\npolicies = [\"1/s burst {tenant}\"]\n\
         inheritance = \"additive\"\n\n\
         [[class]]\nname = \"read\"\ncost = {cost}\n{extra}"
    )
}

fn wait_for(
    rx: &Receiver<ReloadEvent>,
    what: &str,
    want: impl Fn(&ReloadEvent) -> bool,
) -> ReloadEvent {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if want(&e) => return e,
            Ok(_) => continue,
            Err(_) => panic!("no event: {what}"),
        }
    }
}

#[test]
fn a_reload_switches_the_running_limiter_in_place_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, file(100, 10, 1, "")).unwrap();
    let watcher = ConfigWatcher::start(
        &path,
        WatchOptions::new().debounce(Duration::from_millis(50)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limiter = Arc::new(
        watcher
            .current()
            .rule_set()
            .unwrap()
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    watcher.apply_to(Arc::clone(&limiter));
    let (tx, rx) = mpsc::channel();
    watcher.subscribe(move |e| {
        let _ = tx.send(e.clone());
    });
    let read = limiter.class("read").unwrap();
    let request = Request::new().tenant(TenantId(5));
    for _ in 0..10 {
        assert!(limiter.try_acquire(&request, read).unwrap().is_admitted());
    }
    assert!(limiter.try_acquire(&request, read).unwrap().is_rejected());

    // New capacities and a new cost: applied in place, tokens carried over.
    std::fs::write(&path, file(50, 30, 2, "")).unwrap();
    wait_for(&rx, "the edit", |e| {
        matches!(e, ReloadEvent::Applied { .. })
    });
    assert_eq!(limiter.reconfigurations(), 1);
    assert_eq!(limiter.policy(ScopeKind::Global).unwrap().capacity(), 50);
    // As is: 90 left, capped at 50. Additive: 0 + (30 - 10).
    assert_eq!(limiter.available(&Scope::Global), Some(50.0));
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(5))), Some(20.0));
    assert!(limiter.try_acquire(&request, read).unwrap().is_admitted());
    assert_eq!(limiter.available(&Scope::Global), Some(48.0)); // the new cost

    // A rule added: not in place. Refused whole; the running one stays, applied.
    let user = "\n[[rule]]\nname = \"u\"\nscope = \"user\"\npolicies = [\"1/s burst 5\"]\n";
    std::fs::write(&path, file(70, 30, 2, user)).unwrap();
    let ReloadEvent::Rejected(e) = wait_for(&rx, "the refusal", |e| {
        matches!(e, ReloadEvent::Rejected(ConfigError::Invalid { .. }))
    }) else {
        unreachable!()
    };
    assert!(
        matches!(&e.problems()[0].kind, ProblemKind::Engine(m) if m.contains("user scopes")),
        "{e}"
    );
    assert!(e.to_string().contains("build a new one"), "{e}");
    assert_eq!(limiter.reconfigurations(), 1);
    assert_eq!(limiter.policy(ScopeKind::Global).unwrap().capacity(), 50);
    assert_eq!(
        watcher.current().rule(ScopeKind::Global).unwrap().policies[0].capacity(),
        50,
        "the running configuration stays published"
    );
}
