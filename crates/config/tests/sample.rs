//! The README's sample configuration is valid and means what its comments say.

use std::time::Duration;

use tokengate::Policy;
use tokengate::keyed::Overflow;
use tokengate::scope::{RouteId, Scope, ScopeKind, TenantId};
use tokengate_config::{Config, Inheritance};

/// The first ```toml block of the README.
fn sample() -> String {
    let readme = include_str!("../README.md");
    let start = readme.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + readme[start..].find("```").expect("its end");
    readme[start..end].to_owned()
}

#[test]
fn the_readme_sample_is_valid_and_means_what_it_says() {
    let config = Config::from_toml(&sample()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.inheritance, Inheritance::Proportional);
    assert_eq!(config.rules.len(), 3);

    let global = config.rule(ScopeKind::Global).unwrap();
    assert_eq!(global.policies, vec![Policy::new(10_000, 5000.0).unwrap()]);
    assert_eq!(global.lease.unwrap().slots, Some(8));
    assert_eq!(global.normal_rate, Some(3000.0));
    assert_eq!(global.downstream_queue, Some(20_000));

    let tenant = config.rule(ScopeKind::Tenant).unwrap();
    assert_eq!(
        tenant.policies,
        vec![
            Policy::new(20, 10.0).unwrap(),
            Policy::per(100, 100, Duration::from_secs(60)).unwrap(),
        ]
    );
    assert_eq!(tenant.options.max_keys_value(), 100_000);
    assert_eq!(tenant.options.overflow_value(), Overflow::Reject);
    assert_eq!(tenant.inheritance, Inheritance::AsIs);

    let route = config.rule(ScopeKind::TenantRoute).unwrap();
    assert!(route.shadow);
    assert_eq!(route.options.max_keys_value(), 500_000);
    assert_eq!(
        route.options.overflow_value(),
        Overflow::Share(Policy::new(100, 50.0).unwrap())
    );
    assert_eq!(route.inheritance, Inheritance::Proportional);
    assert_eq!(config.shadow_kinds(), vec![ScopeKind::TenantRoute]);

    let export = config
        .classes
        .iter()
        .find(|c| c.name() == "export")
        .unwrap();
    assert_eq!(export.cost_in(ScopeKind::Global), 5);
    assert_eq!(export.cost_in(ScopeKind::Tenant), 20);
    assert_eq!(export.cost_in(ScopeKind::TenantRoute), 0);

    let gold = &config.tiers["gold"].policies;
    let tenant42 = Scope::Tenant(TenantId(42));
    assert_eq!(config.policies_for(&tenant42), Some(&gold[..]));
    assert_eq!(
        config.policies_for(&Scope::Tenant(TenantId(43))),
        Some(&tenant.policies[..])
    );
    let pair = Scope::TenantRoute(TenantId(42), RouteId(7));
    assert_eq!(config.policies_for(&pair), Some(&gold[..]));
}

#[test]
fn the_readme_sample_builds_into_the_engines_rules() {
    let config = Config::from_toml(&sample()).unwrap();
    assert_eq!(config.unsupported(), Vec::<String>::new());
    let limiter = config
        .rule_set()
        .unwrap_or_else(|e| panic!("{e}"))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(limiter.class("export").is_some());
}
