//! Bad files: each kind of problem is refused with its place, every problem of a file is
//! listed, and nothing of an invalid file is returned.

use tokengate::scope::ScopeKind;
use tokengate_config::{Config, ConfigError, Problem, ProblemKind};

const RULE: &str = r#"
[[rule]]
name = "per-tenant"
scope = "tenant"
policies = ["10/s burst 20"]
"#;

fn problems(text: &str) -> Vec<Problem> {
    match Config::from_toml(text) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(ConfigError::Invalid { problems, .. }) => problems,
        Err(e) => panic!("{e}"),
    }
}

/// The one problem of `text`, checked to be on `line`.
fn one(text: &str, line: usize) -> Problem {
    let mut p = problems(text);
    assert_eq!(p.len(), 1, "{p:?}");
    let p = p.remove(0);
    assert_eq!(p.location.as_ref().map(|l| l.line), Some(line), "{p}");
    p
}

#[test]
fn unknown_fields_are_refused_with_line_and_field() {
    let p = one(&format!("{RULE}burst_size = 3\n"), 6);
    assert_eq!(p.field, "burst_size");
    assert!(
        matches!(&p.kind, ProblemKind::Syntax(m) if m.contains("unknown field")),
        "{p}"
    );

    let p = one(
        "[[rule]]\nname = \"g\"\nscope = \"global\"\npolicies = [{ capacity = 5, refill_per_second = 1, jitter = 2 }]\n",
        4,
    );
    assert!(p.to_string().contains("unknown field `jitter`"), "{p}");
    let p = one(&format!("[extra]\n{RULE}"), 1);
    assert!(p.to_string().contains("unknown field `extra`"), "{p}");
}

#[test]
fn an_unknown_field_in_one_rule_does_not_hide_the_problems_of_another() {
    let text = r#"
[[rule]]
name = "a"
scope = "global"
policies = ["10/s burst 20"]
colour = "red"

[[rule]]
name = "b"
scope = "planet"
policies = ["5/s burst 5"]

[[class]]
name = "export"
cost = 2
weight = 1

[tier.gold]
policies = ["100/s burst 200"]
shiny = true

[reload]
inheritance = "as_is"
when = "always"
"#;
    let p = problems(text);
    let seen: Vec<(usize, &str)> = p
        .iter()
        .map(|p| (p.location.as_ref().unwrap().line, p.field.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (6, "colour"),
            (10, "rule[b].scope"),
            (16, "weight"),
            (20, "shiny"),
            (24, "when")
        ],
        "{p:?}"
    );
    assert!(
        matches!(&p[1].kind, ProblemKind::UnknownScope(s) if s == "planet"),
        "{p:?}"
    );
    assert!(
        p[0].to_string().contains("unknown field `colour`"),
        "{}",
        p[0]
    );
}

#[test]
fn bad_rates_and_capacities_are_refused_with_the_policy_errors() {
    for (policy, needle) in [
        ("{ capacity = 10, refill_per_second = 0 }", "above 0"),
        ("{ capacity = 10, refill_per_second = -3.5 }", "above 0"),
        ("{ capacity = 10, refill_per_second = nan }", "finite"),
        ("{ capacity = 10, refill_per_second = inf }", "finite"),
        (
            "{ capacity = 0, refill_per_second = 1 }",
            "at least 1 token",
        ),
        ("{ capacity = -4, refill_per_second = 1 }", "got -4"),
        (
            "{ capacity = 10, tokens = 5, per = \"0s\" }",
            "longer than zero",
        ),
        ("{ capacity = 10, tokens = 5 }", "missing field `per`"),
        ("{ capacity = 10 }", "missing the rate"),
        (
            "{ capacity = 10, refill_per_second = 1, tokens = 1, per = \"1s\" }",
            "not both",
        ),
        (
            "{ capacity = 10, tokens = 5, per = \"1m\", max_reservation = \"1s\" }",
            "tokens per second",
        ),
        ("\"1e30/s burst 10\"", "largest this layout represents"),
        (
            "\"10/s burst 100000000000000000\"",
            "the largest capacity below it that fits",
        ),
        ("\"ten per second\"", "expected tokens per period"),
        ("42", "a policy"),
    ] {
        let text =
            format!("[[rule]]\nname = \"g\"\nscope = \"global\"\npolicies = [\n  {policy},\n]\n");
        let p = one(&text, 5);
        assert_eq!(p.field, "rule[g].policies[0]", "{policy}");
        assert!(matches!(p.kind, ProblemKind::Policy(_)), "{policy}: {p:?}");
        assert!(p.to_string().contains(needle), "{policy}: {p}");
    }
}

#[test]
fn every_problem_of_a_file_is_listed_in_file_order() {
    let text = r#"
[[rule]]
name = "a"
scope = "global"
policies = ["0/s", "10/s burst 0"]
max_keys = 5

[[rule]]
name = "a"
scope = "tenant"
policies = []
lease = { slots = 4 }

[[rule]]
name = "b"
scope = "tenant"
policies = ["1/s"]
shards = 3

[[rule]]
name = "c"
scope = "route"
policies = ["1/s"]

[[class]]
name = "export"
cost = 20

[[override]]
scope = "user"
key = 1
tier = "platinum"
"#;
    let p = problems(text);
    let lines: Vec<usize> = p
        .iter()
        .map(|p| p.location.as_ref().unwrap().line)
        .collect();
    let kinds: Vec<&ProblemKind> = p.iter().map(|p| &p.kind).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{lines:?}");
    let has = |f: &dyn Fn(&ProblemKind) -> bool| kinds.iter().any(|k| f(k));
    assert!(has(
        &|k| matches!(k, ProblemKind::Policy(m) if m.contains("above 0"))
    ));
    assert!(has(
        &|k| matches!(k, ProblemKind::Policy(m) if m.contains("at least 1 token"))
    ));
    assert!(has(&|k| matches!(
        k,
        ProblemKind::KeyedSettingOnGlobal("max_keys")
    )));
    assert!(has(&|k| matches!(
        k,
        ProblemKind::DuplicateRuleName { first_line: 3, .. }
    )));
    assert!(has(&|k| matches!(k, ProblemKind::NoPolicy)));
    assert!(has(&|k| matches!(
        k,
        ProblemKind::LeaseOnKeyedRule(ScopeKind::Tenant)
    )));
    assert!(has(&|k| matches!(
        k,
        ProblemKind::DuplicateScope {
            kind: ScopeKind::Tenant,
            ..
        }
    )));
    assert!(has(
        &|k| matches!(k, ProblemKind::OutOfRange { value, .. } if value == "3")
    ));
    assert!(has(&|k| matches!(
        k,
        ProblemKind::CostExceedsCapacity {
            cost: 20,
            capacity: 1,
            ..
        }
    )));
    assert!(has(&|k| matches!(
        k,
        ProblemKind::OverrideWithoutRule(ScopeKind::User)
    )));
    assert!(has(
        &|k| matches!(k, ProblemKind::UnknownTier(t) if t == "platinum")
    ));
    assert_eq!(p.len(), 11, "{p:#?}");
}

#[test]
fn the_message_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, format!("{RULE}max_keys = 0\n")).unwrap();
    let e = Config::from_file(&path).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("1 problem, nothing applied"), "{text}");
    assert!(
        text.contains(
            "limits.toml:6:12: rule[per-tenant].max_keys: must be a whole number, at least 1, got 0"
        ),
        "{text}"
    );
    let missing = Config::from_file(dir.path().join("absent.toml")).unwrap_err();
    assert!(matches!(
        missing,
        ConfigError::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }
    ));
}

#[test]
fn overrides_are_checked_against_rules_tiers_and_each_other() {
    let tiers = "[tier.gold]\npolicies = [\"100/s\"]\n";
    let p = one(
        &format!("{RULE}{tiers}[[override]]\nscope = \"global\"\nkey = 1\ntier = \"gold\"\n"),
        9,
    );
    assert_eq!(p.kind, ProblemKind::OverrideOnGlobal);
    let p = one(
        &format!("{RULE}{tiers}[[override]]\nscope = \"tenant\"\nkey = -1\ntier = \"gold\"\n"),
        10,
    );
    assert!(
        matches!(
            p.kind,
            ProblemKind::BadKey {
                kind: ScopeKind::Tenant,
                ..
            }
        ),
        "{p}"
    );
    let p = one(
        &format!("{RULE}{tiers}[[override]]\nscope = \"tenant\"\nkey = [1, 2]\ntier = \"gold\"\n"),
        10,
    );
    assert!(matches!(p.kind, ProblemKind::BadKey { .. }), "{p}");
    let twice = "[[override]]\nscope = \"tenant\"\nkey = 7\ntier = \"gold\"\n";
    let p = one(&format!("{RULE}{tiers}{twice}{twice}"), 14);
    assert!(
        matches!(&p.kind, ProblemKind::DuplicateOverride { scope, first_line: 10 } if scope == "tenant:7"),
        "{p}"
    );
    // A tier too small for a class used in its kind.
    let small = "[tier.small]\npolicies = [\"1/s\"]\n[[override]]\nscope = \"tenant\"\nkey = 7\ntier = \"small\"\n[[class]]\nname = \"search\"\ncost = 3\n";
    let p = one(&format!("{RULE}{small}"), 14);
    assert!(
        matches!(p.kind, ProblemKind::CostExceedsCapacity { capacity: 1, .. }),
        "{p}"
    );
}

#[test]
fn keyed_and_lease_settings_are_range_checked() {
    let global = "[[rule]]\nname = \"g\"\nscope = \"global\"\npolicies = [\"100/s burst 100\"]\n";
    let p = one(&format!("{global}lease = {{ slots = 3 }}\n"), 5);
    assert!(p.to_string().contains("power of two"), "{p}");
    let p = one(&format!("{global}lease = {{ max_lease = 1000 }}\n"), 5);
    assert!(matches!(p.kind, ProblemKind::Lease(_)), "{p}");
    let p = one(&format!("{RULE}overflow = \"drop\"\n"), 6);
    assert!(
        p.to_string().contains("\"reject\" or { share = POLICY }"),
        "{p}"
    );
    let p = one(&format!("{RULE}eviction = \"sometimes\"\n"), 6);
    assert!(matches!(p.kind, ProblemKind::Syntax(_)), "{p}");
    let p = one(&format!("{RULE}normal_rate = -1.0\n"), 6);
    assert!(matches!(p.kind, ProblemKind::OutOfRange { .. }), "{p}");
    let p = one(&format!("{RULE}inheritance = \"generous\"\n"), 6);
    assert!(p.to_string().contains("as_is"), "{p}");
}

#[test]
fn a_file_without_rules_limits_nothing_and_is_refused() {
    let p = problems("");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].kind, ProblemKind::NoRules);
    assert!(p[0].location.is_none());
}
