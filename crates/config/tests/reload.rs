//! Live reload with real files in a temporary directory: edits, invalid edits, editors'
//! rename-over saves, deletion and return, and a reload applied to a running
//! `ScopedLimiter` (`ConfigWatcher::apply_to`). Every wait is bounded; nothing asserts a
//! time.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use tokengate::ManualClock;
use tokengate::scope::{Request, Scope, ScopeKind, ScopedLimiter, TenantId};
use tokengate_config::{
    ConfigError, ConfigWatcher, ProblemKind, ReloadEvent, WatchError, WatchOptions,
};

/// How long a test waits for an event before it fails (not a timing assertion: events
/// normally arrive within the debounce).
const PATIENCE: Duration = Duration::from_secs(30);

fn rule(capacity: u64) -> String {
    format!("[[rule]]\nname = \"t\"\nscope = \"tenant\"\npolicies = [\"10/s burst {capacity}\"]\n")
}

fn start(path: &Path) -> (ConfigWatcher, Receiver<ReloadEvent>) {
    let watcher = ConfigWatcher::start(
        path,
        WatchOptions::new().debounce(Duration::from_millis(50)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = mpsc::channel();
    watcher.subscribe(move |e| {
        let _ = tx.send(e.clone());
    });
    (watcher, rx)
}

/// [`start`], with a limiter built from the file's configuration that every later
/// reload is applied to.
fn start_applied(
    path: &Path,
) -> (
    ConfigWatcher,
    Receiver<ReloadEvent>,
    Arc<ScopedLimiter<ManualClock>>,
) {
    let (watcher, rx) = start(path);
    let limiter = Arc::new(
        watcher
            .current()
            .rule_set()
            .unwrap()
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    watcher.apply_to(Arc::clone(&limiter));
    (watcher, rx, limiter)
}

/// Waits for the first event `want` accepts (a save may be seen half-written first: a
/// rejection of an empty or partial file is skipped).
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

fn capacity_applied(capacity: u64) -> impl Fn(&ReloadEvent) -> bool {
    move |e| {
        matches!(e, ReloadEvent::Applied { current, .. }
        if current.rule(ScopeKind::Tenant).is_some_and(|r| r.policies[0].capacity() == capacity))
    }
}

fn capacity_of(w: &ConfigWatcher) -> u64 {
    w.current().rule(ScopeKind::Tenant).unwrap().policies[0].capacity()
}

#[test]
fn an_edit_is_published_and_subscribers_see_old_and_new() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, rule(20)).unwrap();
    let (w, rx) = start(&path);
    assert_eq!(capacity_of(&w), 20);
    let shared = w.shared();

    std::fs::write(&path, rule(30)).unwrap();
    let ReloadEvent::Applied { previous, current } =
        wait_for(&rx, "the edit", capacity_applied(30))
    else {
        unreachable!()
    };
    assert_eq!(
        previous.rule(ScopeKind::Tenant).unwrap().policies[0].capacity(),
        20
    );
    assert_eq!(
        current.rule(ScopeKind::Tenant).unwrap().policies[0].capacity(),
        30
    );
    assert_eq!(capacity_of(&w), 30);
    assert_eq!(shared.load().rules[0].policies[0].capacity(), 30);
}

#[test]
fn an_invalid_edit_keeps_the_running_configuration_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, rule(20)).unwrap();
    let (w, rx) = start(&path);

    std::fs::write(&path, format!("{}surprise = 1\n", rule(40))).unwrap();
    let e = wait_for(&rx, "the rejection", |e| {
        matches!(e, ReloadEvent::Rejected(ConfigError::Invalid { problems, .. })
            if problems.iter().any(|p| p.field == "surprise"))
    });
    let ReloadEvent::Rejected(e) = e else {
        unreachable!()
    };
    assert!(
        e.to_string()
            .contains("limits.toml:5:1: surprise: unknown field"),
        "{e}"
    );
    assert_eq!(capacity_of(&w), 20, "nothing of the invalid file applied");
    assert!(w.reload_now().is_err());
    assert_eq!(capacity_of(&w), 20);

    // Fixing the file publishes it.
    std::fs::write(&path, rule(40)).unwrap();
    wait_for(&rx, "the fixed file", capacity_applied(40));
    assert_eq!(capacity_of(&w), 40);
}

#[test]
fn a_rename_over_save_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, rule(20)).unwrap();
    let (w, rx) = start(&path);

    // As editors save: write a new file beside it, then rename it over the old one.
    let tmp = dir.path().join(".limits.toml.swp");
    std::fs::write(&tmp, rule(50)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    wait_for(&rx, "the renamed file", capacity_applied(50));
    assert_eq!(capacity_of(&w), 50);
}

#[test]
fn a_deleted_file_keeps_the_running_configuration_until_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, rule(20)).unwrap();
    let (w, rx) = start(&path);

    std::fs::remove_file(&path).unwrap();
    wait_for(&rx, "the deletion", |e| {
        matches!(
            e,
            ReloadEvent::Rejected(ConfigError::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            })
        )
    });
    assert_eq!(capacity_of(&w), 20);

    // The same file back: published again, so subscribers hear it is good again.
    std::fs::write(&path, rule(20)).unwrap();
    wait_for(&rx, "the file's return", capacity_applied(20));
    assert_eq!(capacity_of(&w), 20);
}

#[test]
fn unchanged_text_is_not_published_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, rule(20)).unwrap();
    let (w, rx) = start(&path);
    let before = w.current();

    // Another file of the directory changes: ours is not republished.
    std::fs::write(dir.path().join("other.toml"), "not = [valid").unwrap();
    assert_eq!(w.reload_now(), Ok(false));
    assert!(std::sync::Arc::ptr_eq(&before, &w.current()));

    std::fs::write(&path, rule(60)).unwrap();
    wait_for(&rx, "our edit", capacity_applied(60));
    assert_eq!(w.reload_now(), Ok(false));
}

#[test]
fn a_watch_needs_a_valid_file_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    let e = ConfigWatcher::start(&path, WatchOptions::new()).unwrap_err();
    assert!(
        matches!(e, WatchError::Config(ConfigError::Io { .. })),
        "{e}"
    );
    std::fs::write(&path, "[[rule]]\nname = \"t\"\n").unwrap();
    let e = ConfigWatcher::start(&path, WatchOptions::new()).unwrap_err();
    assert!(e.to_string().contains("missing field"), "{e}");
}

/// A running limiter's rules: global (as is) and tenant (additive), one class.
fn file(global: u64, tenant: u64, cost: u64, extra: &str) -> String {
    format!(
        "[[rule]]\nname = \"all\"\nscope = \"global\"\npolicies = [\"100/s burst {global}\"]\n\
         inheritance = \"as_is\"\n\n\
         [[rule]]\nname = \"t\"\nscope = \"tenant\"\npolicies = [\"1/s burst {tenant}\"]\n\
         inheritance = \"additive\"\n\n\
         [[class]]\nname = \"read\"\ncost = {cost}\n{extra}"
    )
}

#[test]
fn a_reload_switches_the_running_limiter_in_place_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, file(100, 10, 1, "")).unwrap();
    let (watcher, rx, limiter) = start_applied(&path);
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

    // A tier and an override added: tenant 5 moves to gold in place, its tokens carried
    // with its rule's strategy (additive: 18 + (100 - 30)).
    let gold = "\n[tier.gold]\npolicies = [\"10/s burst 100\"]\n\n\
                [[override]]\nscope = \"tenant\"\nkey = 5\ntier = \"gold\"\n";
    std::fs::write(&path, file(50, 30, 2, gold)).unwrap();
    wait_for(&rx, "the override", |e| {
        matches!(e, ReloadEvent::Applied { .. })
    });
    assert_eq!(limiter.reconfigurations(), 2);
    let five = Scope::Tenant(TenantId(5));
    assert_eq!(limiter.policies_for(&five).unwrap()[0].capacity(), 100);
    assert_eq!(limiter.available(&five), Some(88.0));
    assert_eq!(
        watcher.current().policies_for(&five).unwrap()[0].capacity(),
        100
    );

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
    assert_eq!(limiter.reconfigurations(), 2);
    assert_eq!(limiter.policy(ScopeKind::Global).unwrap().capacity(), 50);
    assert_eq!(
        watcher.current().rule(ScopeKind::Global).unwrap().policies[0].capacity(),
        50,
        "the running configuration stays published"
    );
}

#[test]
fn a_reload_a_running_limiter_cannot_take_is_refused_whole() {
    // The tenant rule's map holds 2 keys. Tenants 1 and 2 fill it; tenant 9 is gold
    // and has spent. A reload that takes 9's override away would move a bucket into a
    // full map: the limiter refuses it (what `check_reconfigure` cannot see), so the
    // file is refused and the running configuration stays, published and applied.
    let text = |gold: bool| {
        let mut t = String::from(
            "[[rule]]\nname = \"t\"\nscope = \"tenant\"\npolicies = [\"1/s burst 10\"]\n\
             max_keys = 2\ninheritance = \"as_is\"\n\n\
             [tier.gold]\npolicies = [\"10/s burst 100\"]\n\n\
             [[class]]\nname = \"read\"\ncost = 1\n",
        );
        if gold {
            t.push_str("\n[[override]]\nscope = \"tenant\"\nkey = 9\ntier = \"gold\"\n");
        }
        t
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, text(true)).unwrap();
    let (watcher, rx, limiter) = start_applied(&path);
    let read = limiter.class("read").unwrap();
    for t in [1, 2, 9] {
        let r = Request::new().tenant(TenantId(t));
        assert!(limiter.try_acquire(&r, read).unwrap().is_admitted());
    }
    let nine = Scope::Tenant(TenantId(9));
    std::fs::write(&path, text(false)).unwrap();
    let ReloadEvent::Rejected(e) = wait_for(&rx, "the refusal", |e| {
        matches!(e, ReloadEvent::Rejected(_))
    }) else {
        unreachable!()
    };
    assert!(
        matches!(&e.problems()[0].kind, ProblemKind::Engine(m) if m.contains("room")),
        "{e}"
    );
    assert_eq!(limiter.reconfigurations(), 0);
    assert_eq!(limiter.policies_for(&nine).unwrap()[0].capacity(), 100);
    assert_eq!(limiter.available(&nine), Some(99.0));
    assert_eq!(
        watcher.current().policies_for(&nine).unwrap()[0].capacity(),
        100,
        "the running configuration stays published"
    );
}
