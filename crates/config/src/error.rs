//! Why a configuration was refused: every problem of the file, each with its place.

use std::fmt;
use std::path::{Path, PathBuf};

use tokengate::scope::ScopeKind;

/// Where in the file a problem is: 1-based line and column, and the field (the key
/// written on that line, or the path the validator knows it by).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// The line and column of byte `offset` in `text` (clamped to the text).
pub(crate) fn locate(text: &str, offset: usize) -> Location {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Location {
        line,
        column: before[line_start..].chars().count() + 1,
    }
}

/// One thing wrong with a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where it is; `None` for a problem of the file as a whole.
    pub location: Option<Location>,
    /// The field: a path such as `rule[tenant].policies[1]`.
    pub field: String,
    /// What is wrong.
    pub kind: ProblemKind,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(at) = &self.location {
            write!(f, "{at}: ")?;
        }
        if self.field.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.field, self.kind)
        }
    }
}

/// What is wrong, typed. Messages name the value and the valid range.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The text is not TOML of the documented shape (an unknown field, a wrong type, a
    /// missing field): the parser's message.
    Syntax(String),
    /// A policy cannot be built: its message names the nearest representable values.
    Policy(String),
    /// A rule, class or tier has an empty name.
    EmptyName,
    /// Two rules have the same name.
    DuplicateRuleName {
        /// The name.
        name: String,
        /// The line of the first one.
        first_line: usize,
    },
    /// Two rules are for the same scope kind (a kind has one rule; a rule may hold
    /// several policies).
    DuplicateScope {
        /// The kind.
        kind: ScopeKind,
        /// The name of the first rule for it.
        first: String,
    },
    /// A scope kind name that does not exist.
    UnknownScope(String),
    /// A rule or tier without any policy.
    NoPolicy,
    /// A keyed map setting (`max_keys`, `shards`, `overflow`, `eviction`) on the global
    /// rule, which has no map.
    KeyedSettingOnGlobal(&'static str),
    /// `lease` on a keyed rule: only the global scope's bucket can be leased.
    LeaseOnKeyedRule(ScopeKind),
    /// The lease settings do not fit the rule's policy.
    Lease(String),
    /// A setting outside its range.
    OutOfRange {
        /// The value given.
        value: String,
        /// The valid range, in words.
        expected: String,
    },
    /// Two classes have the same name.
    DuplicateClass {
        /// The name.
        name: String,
        /// The line of the first one.
        first_line: usize,
    },
    /// A class costs more in a scope kind than one of the kind's policies holds: it
    /// could never be admitted there.
    CostExceedsCapacity {
        /// The class.
        class: String,
        /// The kind.
        kind: ScopeKind,
        /// Its cost there, in tokens.
        cost: u64,
        /// The smallest capacity among the kind's policies (and tiers used for it).
        capacity: u64,
    },
    /// An override for a scope kind that has no rule.
    OverrideWithoutRule(ScopeKind),
    /// An override for the global scope, which has no keys.
    OverrideOnGlobal,
    /// An override's key does not have the shape of its kind's keys.
    BadKey {
        /// The kind.
        kind: ScopeKind,
        /// What the key should look like.
        expected: &'static str,
    },
    /// An override names a tier that is not defined.
    UnknownTier(String),
    /// Two overrides for the same key.
    DuplicateOverride {
        /// The key, as a scope (`tenant:42`).
        scope: String,
        /// The line of the first one.
        first_line: usize,
    },
    /// More overrides than the table holds.
    TooManyOverrides {
        /// How many the file has.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// The file has no rule: it would limit nothing (an editor's half-written save
    /// looks like this).
    NoRules,
    /// The engine refused the rules built from the file.
    Engine(String),
    /// A secret written in the file (`[redis] password`, or a password in a URL): read
    /// it from `password_env` or `password_file`. The value is never shown.
    InlineSecret,
    /// `remote = true` on a rule without a `[redis]` section.
    RemoteWithoutRedis,
    /// `remote = true` on the global rule, which stays local (lease it instead).
    RemoteGlobal,
    /// `remote = true` on a kind with overridden keys (their tiers are local).
    RemoteOverride(ScopeKind),
    /// A reload changes what a running Redis client was built from: refused, the running
    /// configuration kept; restart to apply it.
    NotLive(String),
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProblemKind::Syntax(m) | ProblemKind::Policy(m) | ProblemKind::Engine(m) => {
                f.write_str(m)
            }
            ProblemKind::InlineSecret => f.write_str(
                "a secret written in the file is refused: give the password through \
                 password_env or password_file (and the user through username)",
            ),
            ProblemKind::RemoteWithoutRedis => {
                f.write_str("a remote rule needs a [redis] section: where the fleet's budget lives")
            }
            ProblemKind::RemoteGlobal => {
                f.write_str("the global rule stays local: lease it instead of making it remote")
            }
            ProblemKind::RemoteOverride(k) => write!(
                f,
                "{k} has overridden keys: its tiers are local, so the kind cannot be remote"
            ),
            ProblemKind::NotLive(field) => write!(
                f,
                "{field} changed: a running Redis client cannot take it live; the running \
                 configuration stays (restart to apply it)"
            ),
            ProblemKind::NoRules => {
                f.write_str("no [[rule]]: a configuration must limit at least one scope kind")
            }
            ProblemKind::EmptyName => f.write_str("the name must not be empty"),
            ProblemKind::DuplicateRuleName { name, first_line } => write!(
                f,
                "rule name {name:?} is already used by the rule at line {first_line}"
            ),
            ProblemKind::DuplicateScope { kind, first } => write!(
                f,
                "{kind} scopes already have a rule ({first:?}); give one rule several \
                 policies instead"
            ),
            ProblemKind::UnknownScope(name) => write!(
                f,
                "unknown scope kind {name:?}; expected one of {}",
                ScopeKind::ALL.map(|k| k.name()).join(", ")
            ),
            ProblemKind::NoPolicy => f.write_str("at least one policy is needed"),
            ProblemKind::KeyedSettingOnGlobal(field) => write!(
                f,
                "{field} is a setting of keyed scopes; the global scope has one bucket"
            ),
            ProblemKind::LeaseOnKeyedRule(kind) => write!(
                f,
                "lease on the rule for {kind} scopes: only the global scope's bucket can be \
                 leased"
            ),
            ProblemKind::Lease(m) => write!(f, "lease: {m}"),
            ProblemKind::OutOfRange { value, expected } => {
                write!(f, "must be {expected}, got {value}")
            }
            ProblemKind::DuplicateClass { name, first_line } => write!(
                f,
                "class name {name:?} is already used by the class at line {first_line}"
            ),
            ProblemKind::CostExceedsCapacity {
                class,
                kind,
                cost,
                capacity,
            } => write!(
                f,
                "class {class:?} costs {cost} tokens in {kind} scopes, above a capacity of \
                 {capacity} there: it could never be admitted"
            ),
            ProblemKind::OverrideWithoutRule(kind) => write!(
                f,
                "override for {kind} scopes, which have no rule: add a rule for them first"
            ),
            ProblemKind::OverrideOnGlobal => {
                f.write_str("the global scope has no keys to override; change its rule")
            }
            ProblemKind::BadKey { kind, expected } => {
                write!(f, "a key of {kind} scopes must be {expected}")
            }
            ProblemKind::UnknownTier(name) => write!(f, "no tier named {name:?} is defined"),
            ProblemKind::DuplicateOverride { scope, first_line } => {
                write!(f, "{scope} already has an override, at line {first_line}")
            }
            ProblemKind::TooManyOverrides { count, max } => {
                write!(f, "{count} overrides, above the most allowed, {max}")
            }
        }
    }
}

/// Why a configuration file was refused. Nothing of it was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The file.
        file: PathBuf,
        /// The kind of error.
        kind: std::io::ErrorKind,
        /// The system's message.
        message: String,
    },
    /// The file was read and is invalid: every problem found, in file order.
    Invalid {
        /// The file (`<string>` for text not read from a file).
        file: PathBuf,
        /// The problems, at least one.
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    pub(crate) fn io(file: &Path, e: &std::io::Error) -> ConfigError {
        ConfigError::Io {
            file: file.to_path_buf(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    /// The file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            ConfigError::Io { file, .. } | ConfigError::Invalid { file, .. } => file,
        }
    }

    /// The problems found (none for an I/O error).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Io { .. } => &[],
            ConfigError::Invalid { problems, .. } => problems,
        }
    }
}

impl fmt::Display for ConfigError {
    /// One line per problem: `FILE:LINE:COLUMN: FIELD: MESSAGE`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { file, message, .. } => {
                write!(f, "{}: cannot read: {message}", file.display())
            }
            ConfigError::Invalid { file, problems } => {
                let n = problems.len();
                write!(
                    f,
                    "{}: {n} problem{}, nothing applied",
                    file.display(),
                    if n == 1 { "" } else { "s" }
                )?;
                for p in problems {
                    let sep = if p.location.is_some() { ":" } else { ": " };
                    write!(f, "\n{}{sep}{p}", file.display())?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {}
