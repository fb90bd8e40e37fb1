//! From the file's text to a [`Config`], checking the whole file and listing every
//! problem: a configuration is accepted whole or not at all.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use tokengate::keyed::{DEFAULT_MAX_KEYS, Eviction, KeyedOptions, MAX_SHARDS, Overflow};
use tokengate::leased::MAX_SLOTS;
use tokengate::scope::{Rule, RuleError, RuleSet, Scope, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy};
use toml::de::{DeTable, DeValue};
use toml::{Spanned, Value};

use crate::error::{ConfigError, Problem, ProblemKind, locate};
use crate::model::{Config, LeaseSettings, MAX_OVERRIDES, RuleConfig, Tier};
use crate::raw::{RawEviction, RawFile, RawRule};

impl Config {
    /// Reads and validates the configuration file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Io`] when it cannot be read, [`ConfigError::Invalid`] with every
    /// problem found otherwise.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, &e))?;
        Config::from_toml_named(&text, path)
    }

    /// Validates `text`, a configuration in TOML; errors name the file `<string>`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] with every problem found.
    ///
    /// ```
    /// use tokengate_config::Config;
    /// let config = Config::from_toml(r#"
    ///     [[rule]]
    ///     name = "per-tenant"
    ///     scope = "tenant"
    ///     policies = ["10/s burst 20", "100/m"]
    /// "#)?;
    /// assert_eq!(config.rules[0].policies.len(), 2);
    ///
    /// let err = Config::from_toml("[[rule]]\nname = \"x\"\nscope = \"planet\"\npolicies = []")
    ///     .unwrap_err();
    /// assert_eq!(err.problems().len(), 2); // the scope kind, and no policy
    /// # Ok::<(), tokengate_config::ConfigError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_named(text, Path::new("<string>"))
    }

    /// Validates `text`, naming `file` in errors.
    ///
    /// # Errors
    ///
    /// As [`from_toml`](Config::from_toml).
    pub fn from_toml_named(text: &str, file: &Path) -> Result<Config, ConfigError> {
        let invalid = |problems| ConfigError::Invalid {
            file: file.to_path_buf(),
            problems,
        };
        let mut doc = match DeTable::parse(text) {
            Ok(doc) => doc,
            Err(e) => return Err(invalid(vec![syntax_problem(text, &e)])),
        };
        // Unknown fields are listed and set aside, so that the rest of the file is still
        // checked: one misspelt field does not hide the other problems.
        let mut unknown = Vec::new();
        unknown_fields(text, doc.get_mut(), FILE_FIELDS, &mut unknown);
        let raw = match RawFile::deserialize(toml::de::Deserializer::from(doc)) {
            Ok(raw) => raw,
            Err(e) => {
                unknown.push(syntax_problem(text, &e));
                return Err(invalid(unknown));
            }
        };
        let mut checker = Checker {
            text,
            problems: Vec::new(),
        };
        let config = checker.config(&raw);
        if raw.rule.is_empty() {
            checker.problems.push(Problem {
                location: None,
                field: String::new(),
                kind: ProblemKind::NoRules,
            });
        }
        checker.problems.extend(unknown);
        if checker.problems.is_empty() {
            if let Err(e) = engine_check(&config) {
                checker.problems.push(Problem {
                    location: None,
                    field: String::new(),
                    kind: ProblemKind::Engine(e.to_string()),
                });
            }
        }
        if checker.problems.is_empty() {
            Ok(config)
        } else {
            checker
                .problems
                .sort_by_key(|p| p.location.as_ref().map(|l| (l.line, l.column)));
            Err(invalid(checker.problems))
        }
    }
}

/// The fields of each part of the file, as `raw` declares them.
const FILE_FIELDS: &[&str] = &["rule", "class", "tier", "override", "reload", "redis"];
const RULE_FIELDS: &[&str] = &[
    "name",
    "scope",
    "policies",
    "max_keys",
    "shards",
    "overflow",
    "eviction",
    "counters",
    "shadow",
    "lease",
    "inheritance",
    "normal_rate",
    "downstream_queue",
    "remote",
];
const LEASE_FIELDS: &[&str] = &["slots", "max_lease"];
const CLASS_FIELDS: &[&str] = &["name", "cost", "costs"];
const TIER_FIELDS: &[&str] = &["policies"];
const OVERRIDE_FIELDS: &[&str] = &["scope", "key", "tier"];
const RELOAD_FIELDS: &[&str] = &["inheritance"];

/// Removes the fields of `table` (and of its known parts) that are not in `known`,
/// recording each. What remains has only fields the file format declares.
fn unknown_fields(text: &str, table: &mut DeTable<'_>, known: &[&str], found: &mut Vec<Problem>) {
    let mut strays = Vec::new();
    for key in table.keys() {
        let name: &str = key.get_ref();
        if !known.contains(&name) {
            strays.push(name.to_owned());
            found.push(Problem {
                location: Some(locate(text, key.span().start)),
                field: name.to_owned(),
                kind: ProblemKind::Syntax(format!(
                    "unknown field `{name}`, expected {}",
                    known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            });
        }
    }
    for stray in &strays {
        table.remove(stray.as_str());
    }
    for (key, value) in table.iter_mut() {
        let parts: &[&str] = match (known, key.get_ref().as_ref()) {
            (FILE_FIELDS, "rule") => RULE_FIELDS,
            (FILE_FIELDS, "class") => CLASS_FIELDS,
            (FILE_FIELDS, "override") => OVERRIDE_FIELDS,
            (FILE_FIELDS, "reload") => RELOAD_FIELDS,
            (FILE_FIELDS, "redis") => crate::redis::REDIS_FIELDS,
            (FILE_FIELDS, "tier") => {
                // A table of named tiers.
                if let DeValue::Table(tiers) = value.get_mut() {
                    for (_, tier) in tiers.iter_mut() {
                        if let DeValue::Table(t) = tier.get_mut() {
                            unknown_fields(text, t, TIER_FIELDS, found);
                        }
                    }
                }
                continue;
            }
            (RULE_FIELDS, "lease") => LEASE_FIELDS,
            _ => continue,
        };
        match value.get_mut() {
            DeValue::Table(t) => unknown_fields(text, t, parts, found),
            DeValue::Array(items) => {
                for item in items.iter_mut() {
                    if let DeValue::Table(t) = item.get_mut() {
                        unknown_fields(text, t, parts, found);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A parse error of the TOML layer, placed; the field is the key written where it points.
fn syntax_problem(text: &str, e: &toml::de::Error) -> Problem {
    let location = e.span().map(|s| locate(text, s.start));
    let field = location
        .as_ref()
        .and_then(|l| text.lines().nth(l.line - 1))
        .and_then(|line| {
            let line = line.trim();
            if line.starts_with('[') {
                Some(
                    line.trim_matches(|c| c == '[' || c == ']')
                        .trim()
                        .to_owned(),
                )
            } else {
                line.split_once('=').map(|(k, _)| k.trim().to_owned())
            }
        })
        .unwrap_or_default();
    Problem {
        location,
        field,
        kind: ProblemKind::Syntax(e.message().trim().to_owned()),
    }
}

/// The engine's own check of the rules built from a valid file (one policy per rule, the
/// first: the others are checked one by one above).
fn engine_check(config: &Config) -> Result<(), RuleError> {
    let mut set = RuleSet::new();
    for r in &config.rules {
        if let Some(&p) = r.policies.first() {
            let mut rule = Rule::new(p).options(r.options);
            if let Some(lease) = r.lease {
                rule = rule.leased(lease.to_lease_config());
            }
            set = set.rule(r.kind, rule);
        }
    }
    for class in &config.classes {
        set = set.class(class.clone());
    }
    set.build_with_clock(ManualClock::new()).map(drop)
}

fn kind_named(name: &str) -> Option<ScopeKind> {
    ScopeKind::ALL.into_iter().find(|k| k.name() == name)
}

struct Checker<'a> {
    text: &'a str,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn line(&self, span: &Range<usize>) -> usize {
        locate(self.text, span.start).line
    }

    fn report(&mut self, span: &Range<usize>, field: &str, kind: ProblemKind) {
        self.problems.push(Problem {
            location: Some(locate(self.text, span.start)),
            field: field.to_owned(),
            kind,
        });
    }

    fn out_of_range(
        &mut self,
        span: &Range<usize>,
        field: &str,
        value: impl ToString,
        expected: &str,
    ) {
        self.report(
            span,
            field,
            ProblemKind::OutOfRange {
                value: value.to_string(),
                expected: expected.to_owned(),
            },
        );
    }

    /// A whole number in `min..=max`, or a problem.
    fn whole(&mut self, v: &Spanned<i64>, field: &str, min: u64, max: u64) -> Option<u64> {
        match u64::try_from(*v.get_ref()) {
            Ok(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.out_of_range(
                    &v.span(),
                    field,
                    v.get_ref(),
                    &if max == u64::MAX {
                        format!("a whole number, at least {min}")
                    } else {
                        format!("a whole number from {min} to {max}")
                    },
                );
                None
            }
        }
    }

    fn policy(&mut self, v: &Spanned<Value>, field: &str) -> Option<Policy> {
        match Policy::deserialize(v.get_ref().clone()) {
            Ok(p) => Some(p),
            Err(e) => {
                self.report(
                    &v.span(),
                    field,
                    ProblemKind::Policy(e.message().to_owned()),
                );
                None
            }
        }
    }

    fn policies(&mut self, list: &Spanned<Vec<Spanned<Value>>>, field: &str) -> Vec<Policy> {
        if list.get_ref().is_empty() {
            self.report(&list.span(), field, ProblemKind::NoPolicy);
        }
        let mut out = Vec::new();
        for (i, v) in list.get_ref().iter().enumerate() {
            if let Some(p) = self.policy(v, &format!("{field}[{i}]")) {
                out.push(p);
            }
        }
        out
    }

    fn kind(&mut self, name: &Spanned<String>, field: &str) -> Option<ScopeKind> {
        let kind = kind_named(name.get_ref());
        if kind.is_none() {
            self.report(
                &name.span(),
                field,
                ProblemKind::UnknownScope(name.get_ref().clone()),
            );
        }
        kind
    }

    fn config(&mut self, raw: &RawFile) -> Config {
        let rules = self.rules(raw);
        let classes = self.classes(raw);
        let tiers = self.tiers(raw);
        let overrides = self.overrides(raw, &rules, &tiers);
        self.costs(raw, &rules, &classes, &tiers, &overrides);
        let redis = self.redis(raw, &rules, &overrides);
        Config {
            rules,
            classes,
            tiers,
            overrides,
            redis,
            inheritance: raw
                .reload
                .as_ref()
                .and_then(|r| r.inheritance)
                .unwrap_or_default(),
        }
    }

    /// The `[redis]` section, and the remote rules' needs: a section, a keyed kind, no
    /// overridden keys.
    fn redis(
        &mut self,
        raw: &RawFile,
        rules: &[RuleConfig],
        overrides: &BTreeMap<Scope, String>,
    ) -> Option<crate::redis::RedisSection> {
        let mut found = Vec::new();
        let section = raw
            .redis
            .as_ref()
            .and_then(|r| crate::redis::section(r.get_ref(), &mut found));
        for (span, field, kind) in found {
            self.report(&span, &field, kind);
        }
        for (i, spanned) in raw.rule.iter().enumerate() {
            let r = spanned.get_ref();
            let Some(remote) = r.remote.as_ref().filter(|v| *v.get_ref()) else {
                continue;
            };
            let field = format!("rule[{}].remote", r.name.get_ref());
            let Some(rule) = rules.iter().find(|c| c.name == *r.name.get_ref()) else {
                continue;
            };
            if raw.redis.is_none() {
                self.report(&remote.span(), &field, ProblemKind::RemoteWithoutRedis);
            }
            if rule.kind == ScopeKind::Global {
                self.report(&remote.span(), &field, ProblemKind::RemoteGlobal);
            }
            if overrides.keys().any(|s| s.kind() == rule.kind) {
                self.report(
                    &remote.span(),
                    &field,
                    ProblemKind::RemoteOverride(rule.kind),
                );
            }
            let _ = i;
        }
        section
    }

    fn rules(&mut self, raw: &RawFile) -> Vec<RuleConfig> {
        let default_inheritance = raw
            .reload
            .as_ref()
            .and_then(|r| r.inheritance)
            .unwrap_or_default();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut kinds: HashMap<ScopeKind, String> = HashMap::new();
        let mut rules = Vec::new();
        for (i, spanned) in raw.rule.iter().enumerate() {
            let r = spanned.get_ref();
            let name = r.name.get_ref().clone();
            let field = if name.is_empty() {
                format!("rule[{i}]")
            } else {
                format!("rule[{name}]")
            };
            if name.is_empty() {
                self.report(
                    &r.name.span(),
                    &format!("{field}.name"),
                    ProblemKind::EmptyName,
                );
            } else if let Some(&first_line) = names.get(&name) {
                self.report(
                    &r.name.span(),
                    &format!("{field}.name"),
                    ProblemKind::DuplicateRuleName {
                        name: name.clone(),
                        first_line,
                    },
                );
            } else {
                names.insert(name.clone(), self.line(&r.name.span()));
            }
            let kind = self.kind(&r.scope, &format!("{field}.scope"));
            if let Some(kind) = kind {
                if let Some(first) = kinds.get(&kind) {
                    self.report(
                        &r.scope.span(),
                        &format!("{field}.scope"),
                        ProblemKind::DuplicateScope {
                            kind,
                            first: first.clone(),
                        },
                    );
                } else {
                    kinds.insert(kind, name.clone());
                }
            }
            let before = self.problems.len();
            let policies = self.policies(&r.policies, &format!("{field}.policies"));
            let options = self.options(r, kind, &field);
            let lease = self.lease(r, kind, &policies, &field);
            let normal_rate = r.normal_rate.as_ref().and_then(|v| {
                let x = *v.get_ref();
                if x.is_finite() && x > 0.0 {
                    Some(x)
                } else {
                    self.out_of_range(
                        &v.span(),
                        &format!("{field}.normal_rate"),
                        x,
                        "a finite number of tokens per second above 0",
                    );
                    None
                }
            });
            let downstream_queue = r
                .downstream_queue
                .as_ref()
                .and_then(|v| self.whole(v, &format!("{field}.downstream_queue"), 0, u64::MAX));
            if let (Some(kind), true) = (kind, self.problems.len() == before) {
                rules.push(RuleConfig {
                    name,
                    kind,
                    policies,
                    options,
                    lease,
                    shadow: r.shadow.unwrap_or(false),
                    inheritance: r.inheritance.unwrap_or(default_inheritance),
                    normal_rate,
                    downstream_queue,
                    remote: r.remote.as_ref().is_some_and(|v| *v.get_ref()),
                });
            }
        }
        rules
    }

    fn options(&mut self, r: &RawRule, kind: Option<ScopeKind>, field: &str) -> KeyedOptions {
        let mut options = KeyedOptions::new(DEFAULT_MAX_KEYS).counters(r.counters.unwrap_or(false));
        let global = kind == Some(ScopeKind::Global);
        let spans = [
            ("max_keys", r.max_keys.as_ref().map(Spanned::span)),
            ("shards", r.shards.as_ref().map(Spanned::span)),
            ("overflow", r.overflow.as_ref().map(Spanned::span)),
            ("eviction", r.eviction.as_ref().map(Spanned::span)),
        ];
        if global {
            for (name, span) in spans {
                if let Some(span) = span {
                    self.report(
                        &span,
                        &format!("{field}.{name}"),
                        ProblemKind::KeyedSettingOnGlobal(name),
                    );
                }
            }
            return options;
        }
        if let Some(v) = &r.max_keys {
            let max = u64::try_from(usize::MAX).unwrap_or(u64::MAX);
            if let Some(n) = self.whole(v, &format!("{field}.max_keys"), 1, max) {
                options = options.max_keys(usize::try_from(n).unwrap_or(usize::MAX));
            }
        }
        if let Some(v) = &r.shards {
            match usize::try_from(*v.get_ref()) {
                Ok(n) if n.is_power_of_two() && n <= MAX_SHARDS => options = options.shards(n),
                _ => self.out_of_range(
                    &v.span(),
                    &format!("{field}.shards"),
                    v.get_ref(),
                    &format!("a power of two from 1 to {MAX_SHARDS}"),
                ),
            }
        }
        if let Some(v) = &r.overflow {
            let f = format!("{field}.overflow");
            match v.get_ref() {
                Value::String(s) if s == "reject" => options = options.overflow(Overflow::Reject),
                Value::Table(t) if t.len() == 1 && t.contains_key("share") => {
                    let share = Spanned::new(v.span(), t["share"].clone());
                    if let Some(p) = self.policy(&share, &format!("{f}.share")) {
                        options = options.overflow(Overflow::Share(p));
                    }
                }
                _ => self.report(
                    &v.span(),
                    &f,
                    ProblemKind::Syntax(
                        "overflow must be \"reject\" or { share = POLICY }".to_owned(),
                    ),
                ),
            }
        }
        if let Some(v) = &r.eviction {
            options = options.eviction(match v.get_ref() {
                RawEviction::Lossless => Eviction::Lossless,
                RawEviction::Full => Eviction::Full,
            });
        }
        options
    }

    fn lease(
        &mut self,
        r: &RawRule,
        kind: Option<ScopeKind>,
        policies: &[Policy],
        field: &str,
    ) -> Option<LeaseSettings> {
        let lease = r.lease.as_ref()?;
        let f = format!("{field}.lease");
        match kind {
            Some(ScopeKind::Global) => {}
            Some(kind) => {
                self.report(&lease.span(), &f, ProblemKind::LeaseOnKeyedRule(kind));
                return None;
            }
            None => return None,
        }
        let raw = lease.get_ref();
        let mut settings = LeaseSettings::default();
        if let Some(v) = &raw.slots {
            let max = u64::try_from(MAX_SLOTS).unwrap_or(u64::MAX);
            settings.slots = self
                .whole(v, &format!("{f}.slots"), 1, max)
                .and_then(|n| usize::try_from(n).ok());
        }
        if let Some(v) = &raw.max_lease {
            settings.max_lease = self.whole(v, &format!("{f}.max_lease"), 1, u64::MAX);
        }
        // The engine's own check, against each policy of the rule.
        for p in policies {
            let rule = Rule::new(*p).leased(settings.to_lease_config());
            if let Err(RuleError::Lease(e)) = RuleSet::new()
                .rule(ScopeKind::Global, rule)
                .build_with_clock(ManualClock::new())
            {
                self.report(&lease.span(), &f, ProblemKind::Lease(e.to_string()));
                break;
            }
        }
        Some(settings)
    }

    fn classes(&mut self, raw: &RawFile) -> Vec<WorkClass> {
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut classes = Vec::new();
        for (i, c) in raw.class.iter().map(Spanned::get_ref).enumerate() {
            let name = c.name.get_ref().clone();
            let field = if name.is_empty() {
                format!("class[{i}]")
            } else {
                format!("class[{name}]")
            };
            let before = self.problems.len();
            if name.is_empty() {
                self.report(
                    &c.name.span(),
                    &format!("{field}.name"),
                    ProblemKind::EmptyName,
                );
            } else if let Some(&first_line) = names.get(&name) {
                self.report(
                    &c.name.span(),
                    &format!("{field}.name"),
                    ProblemKind::DuplicateClass {
                        name: name.clone(),
                        first_line,
                    },
                );
            } else {
                names.insert(name.clone(), self.line(&c.name.span()));
            }
            let cost = self.whole(&c.cost, &format!("{field}.cost"), 0, u64::MAX);
            let mut class = WorkClass::new(name, cost.unwrap_or(0));
            for (kind, cost) in &c.costs {
                let f = format!("{field}.costs.{}", kind.get_ref());
                let kind = self.kind(kind, &f);
                let cost = self.whole(cost, &f, 0, u64::MAX);
                if let (Some(kind), Some(cost)) = (kind, cost) {
                    class = class.with_cost(kind, cost);
                }
            }
            if self.problems.len() == before {
                classes.push(class);
            }
        }
        classes
    }

    fn tiers(&mut self, raw: &RawFile) -> BTreeMap<String, Tier> {
        let mut tiers = BTreeMap::new();
        for (name, t) in &raw.tier {
            let field = format!("tier[{}]", name.get_ref());
            if name.get_ref().is_empty() {
                self.report(&name.span(), &field, ProblemKind::EmptyName);
                continue;
            }
            let before = self.problems.len();
            let policies = self.policies(&t.get_ref().policies, &format!("{field}.policies"));
            if self.problems.len() == before {
                tiers.insert(
                    name.get_ref().clone(),
                    Tier {
                        name: name.get_ref().clone(),
                        policies,
                    },
                );
            }
        }
        tiers
    }

    fn overrides(
        &mut self,
        raw: &RawFile,
        rules: &[RuleConfig],
        tiers: &BTreeMap<String, Tier>,
    ) -> BTreeMap<Scope, String> {
        let mut out = BTreeMap::new();
        let mut lines: HashMap<Scope, usize> = HashMap::new();
        if raw.overrides.len() > MAX_OVERRIDES {
            let span = raw.overrides[MAX_OVERRIDES].span();
            self.report(
                &span,
                "override",
                ProblemKind::TooManyOverrides {
                    count: raw.overrides.len(),
                    max: MAX_OVERRIDES,
                },
            );
        }
        // A kind whose rule failed validation still "has a rule" for this check.
        let ruled: Vec<ScopeKind> = raw
            .rule
            .iter()
            .filter_map(|r| kind_named(r.get_ref().scope.get_ref()))
            .collect();
        debug_assert!(rules.iter().all(|r| ruled.contains(&r.kind)));
        for (i, o) in raw.overrides.iter().map(Spanned::get_ref).enumerate() {
            let field = format!("override[{i}]");
            let Some(kind) = self.kind(&o.scope, &format!("{field}.scope")) else {
                continue;
            };
            if kind == ScopeKind::Global {
                self.report(
                    &o.scope.span(),
                    &format!("{field}.scope"),
                    ProblemKind::OverrideOnGlobal,
                );
                continue;
            }
            if !ruled.contains(&kind) {
                self.report(
                    &o.scope.span(),
                    &format!("{field}.scope"),
                    ProblemKind::OverrideWithoutRule(kind),
                );
            }
            let tier = o.tier.get_ref();
            if !tiers.contains_key(tier) && !raw.tier.keys().any(|t| t.get_ref() == tier) {
                self.report(
                    &o.tier.span(),
                    &format!("{field}.tier"),
                    ProblemKind::UnknownTier(tier.clone()),
                );
            }
            let Some(scope) = scope_of(kind, o.key.get_ref()) else {
                let expected = if kind == ScopeKind::TenantRoute {
                    "a pair of whole numbers [tenant, route]"
                } else {
                    "a whole number from 0 to 2^63-1"
                };
                self.report(
                    &o.key.span(),
                    &format!("{field}.key"),
                    ProblemKind::BadKey { kind, expected },
                );
                continue;
            };
            if let Some(&first_line) = lines.get(&scope) {
                self.report(
                    &o.key.span(),
                    &format!("{field}.key"),
                    ProblemKind::DuplicateOverride {
                        scope: scope.to_string(),
                        first_line,
                    },
                );
                continue;
            }
            lines.insert(scope, self.line(&o.key.span()));
            out.insert(scope, tier.clone());
        }
        out
    }

    /// Every class must fit every policy it may meet: its kind's rule's, the overflow
    /// bucket's, and the tiers given to keys of the kind.
    fn costs(
        &mut self,
        raw: &RawFile,
        rules: &[RuleConfig],
        classes: &[WorkClass],
        tiers: &BTreeMap<String, Tier>,
        overrides: &BTreeMap<Scope, String>,
    ) {
        for rule in rules {
            let mut capacity = rule.min_capacity();
            if let Overflow::Share(p) = rule.options.overflow_value() {
                capacity = capacity.min(p.capacity());
            }
            for (scope, tier) in overrides {
                if scope.kind() == rule.kind {
                    if let Some(t) = tiers.get(tier) {
                        let c = t
                            .policies
                            .iter()
                            .map(Policy::capacity)
                            .min()
                            .unwrap_or(u64::MAX);
                        capacity = capacity.min(c);
                    }
                }
            }
            for (class, raw_class) in classes.iter().zip(raw.class.iter()) {
                let cost = class.cost_in(rule.kind);
                if cost > capacity {
                    let raw_class = raw_class.get_ref();
                    let span = raw_class
                        .costs
                        .iter()
                        .find(|(k, _)| k.get_ref() == rule.kind.name())
                        .map_or(raw_class.cost.span(), |(_, v)| v.span());
                    self.report(
                        &span,
                        &format!("class[{}]", class.name()),
                        ProblemKind::CostExceedsCapacity {
                            class: class.name().to_owned(),
                            kind: rule.kind,
                            cost,
                            capacity,
                        },
                    );
                }
            }
        }
    }
}

/// The scope of an override's key, if the key has the shape of `kind`'s keys: a whole
/// number for a kind keyed by one id, an array of as many for a kind keyed by several
/// ([`Scope::from_ids`], generated from the engine's list of kinds).
fn scope_of(kind: ScopeKind, key: &Value) -> Option<Scope> {
    let id = |v: &Value| v.as_integer().and_then(|n| u64::try_from(n).ok());
    let mut ids = [0; MAX_KEY_IDS];
    let n = kind.key_ids();
    if n == 1 {
        ids[0] = id(key)?;
    } else {
        let Value::Array(parts) = key else {
            return None;
        };
        if parts.len() != n || n > MAX_KEY_IDS {
            return None;
        }
        for (slot, part) in ids.iter_mut().zip(parts) {
            *slot = id(part)?;
        }
    }
    Scope::from_ids(kind, &ids[..n])
}

/// The most ids a kind's key has.
const MAX_KEY_IDS: usize = {
    let mut most = 0;
    let mut i = 0;
    while i < ScopeKind::COUNT {
        let n = ScopeKind::ALL[i].key_ids();
        if n > most {
            most = n;
        }
        i += 1;
    }
    most
};
