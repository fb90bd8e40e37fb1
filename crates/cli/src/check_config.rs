//! `tokengate check-config FILE`: validates a configuration file and prints what it
//! means before it is deployed: each policy's effective rate, rate error, tick and wrap
//! period, each keyed scope's memory bound, and the warnings of the source document's
//! resource basis (a rate below the traffic the file calls normal, a burst above what
//! the downstream queue absorbs).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tokengate::scope::{ClientId, Scope};
use tokengate::{ManualClock, Policy};
use tokengate_config::{Config, MemoryBound, RuleConfig};

use crate::{Out, show_duration, show_number};

/// Validate a configuration file and print what it means.
#[derive(Debug, Parser)]
pub(crate) struct Args {
    /// The TOML configuration file.
    file: PathBuf,
    /// Fail (non-zero exit) on warnings too, not only on errors.
    #[arg(long)]
    deny_warnings: bool,
    /// Do not connect to the `[redis]` section's server (checked by default, within its
    /// connect and exchange timeouts).
    #[arg(long)]
    offline: bool,
}

/// Runs the check: the report on standard output; an invalid file is an error listing
/// every problem with its line and field.
pub(crate) fn run(args: Args, out: &mut Out) -> Result<(), String> {
    let config = Config::from_file(&args.file).map_err(|e| e.to_string())?;
    let (text, warnings) = report(&config, &args.file.display().to_string());
    out.print(&text)?;
    let store = match &config.redis {
        Some(_) if args.offline => None,
        Some(section) => {
            let store = config.remote_store().map_err(|e| {
                format!(
                    "{}: [redis] at {}: {e}",
                    args.file.display(),
                    shown_url(&section.url)
                )
            })?;
            out.print(&format!(
                "redis: {} answered (namespace {:?}, {} remote rule{})\n",
                shown_url(&section.url),
                section.namespace,
                config.remote_kinds().len(),
                plural(config.remote_kinds().len())
            ))?;
            Some(store)
        }
        None => None,
    };
    let refused = unenforceable(&config, store);
    if !refused.is_empty() {
        return Err(format!(
            "{}: {} problem{}: the engine cannot build this rule set, nothing applied\n  {}",
            args.file.display(),
            refused.len(),
            plural(refused.len()),
            refused.join("\n  ")
        ));
    }
    if args.deny_warnings && warnings > 0 {
        return Err(format!(
            "{warnings} warning{} (--deny-warnings)",
            plural(warnings)
        ));
    }
    Ok(())
}

/// Why the engine cannot build this configuration's rule set, one line per part; empty
/// when it builds. A file that validates but cannot be enforced is refused, as a running
/// service would refuse it.
///
/// Remote rules are built with `store`, the `[redis]` section's store once it answered;
/// without one (`--offline`) they are checked as local rules.
pub(crate) fn unenforceable(
    config: &Config,
    store: Option<std::sync::Arc<tokengate_redis::RedisScopeKinds>>,
) -> Vec<String> {
    let mut local = config.clone();
    if store.is_none() {
        for r in &mut local.rules {
            r.remote = false;
        }
    }
    match local.rule_set() {
        Err(unsupported) => unsupported.parts,
        Ok(set) => {
            let set = match store {
                Some(store) => set.remote_scopes(store),
                None => set,
            };
            match set.build_with_clock(ManualClock::new()) {
                Ok(_) => Vec::new(),
                Err(e) => vec![e.to_string()],
            }
        }
    }
}

/// The URL as printed: a valid section holds no password, and none is ever printed.
fn shown_url(url: &str) -> &str {
    url
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The report of a valid configuration, and how many warnings it has.
pub(crate) fn report(config: &Config, file: &str) -> (String, usize) {
    let mut s = String::new();
    let mut warnings = 0;
    let _ = writeln!(
        s,
        "{file}: valid: {} rule{}, {} class{}, {} tier{}, {} override{}",
        config.rules.len(),
        plural(config.rules.len()),
        config.classes.len(),
        if config.classes.len() == 1 { "" } else { "es" },
        config.tiers.len(),
        plural(config.tiers.len()),
        config.overrides.len(),
        plural(config.overrides.len()),
    );
    for rule in &config.rules {
        warnings += rule_report(&mut s, rule);
    }
    for tier in config.tiers.values() {
        let _ = writeln!(s, "\ntier {:?}", tier.name);
        for (i, p) in tier.policies.iter().enumerate() {
            policy_report(&mut s, i, p);
        }
    }
    warnings += overrides_report(&mut s, config);
    if !config.classes.is_empty() {
        let _ = writeln!(s, "\nclasses");
        for class in &config.classes {
            let costs: Vec<String> = config
                .rules
                .iter()
                .map(|r| format!("{} {}", r.kind, class.cost_in(r.kind)))
                .collect();
            let _ = writeln!(s, "  {:?}: {}", class.name(), costs.join(", "));
        }
    }
    let unsupported = config.unsupported();
    if !unsupported.is_empty() {
        let _ = writeln!(s, "\nnot enforceable: the engine cannot build these parts:");
        for part in unsupported {
            let _ = writeln!(s, "  {part}");
        }
    }
    let _ = writeln!(s, "\n{warnings} warning{}", plural(warnings));
    (s, warnings)
}

/// A warning for each override keyed by a client address: a [`ClientId`] is the keyed
/// hash of an address under a per-process secret (the HTTP layer's), so a number written
/// in a file matches no client the layer will ever see; returns how many.
fn overrides_report(s: &mut String, config: &Config) -> usize {
    let clients: Vec<&Scope> = config
        .overrides
        .keys()
        .filter(|scope| matches!(scope, Scope::Client(ClientId(_))))
        .collect();
    if clients.is_empty() {
        return 0;
    }
    let _ = writeln!(s, "\noverrides");
    for scope in &clients {
        let _ = writeln!(
            s,
            "  warning: {scope}: a client id is the keyed hash of an address under a \
             per-process secret (the HTTP layer's), so no request will ever carry this \
             one; the override is never applied (give the client a key of its own, such \
             as an API key, to override it)"
        );
    }
    clients.len()
}

/// One rule's section; returns its number of warnings.
fn rule_report(s: &mut String, rule: &RuleConfig) -> usize {
    let mut flags = Vec::new();
    if rule.shadow {
        flags.push("shadow".to_owned());
    }
    flags.push(format!("inheritance {}", rule.inheritance.name()));
    let _ = writeln!(
        s,
        "\nrule {:?}: {} scope{}, {}",
        rule.name,
        rule.kind,
        if rule.memory_bound().is_some() {
            "s (keyed)"
        } else {
            ""
        },
        flags.join(", ")
    );
    for (i, p) in rule.policies.iter().enumerate() {
        policy_report(s, i, p);
    }
    match rule.memory_bound() {
        Some(m) => memory_report(s, &m, rule.options.counters_on()),
        None => {
            let _ = writeln!(s, "  memory: one bucket");
        }
    }
    if let Some(lease) = rule.lease {
        let show = |v: Option<String>| v.unwrap_or_else(|| "default".to_owned());
        let _ = writeln!(
            s,
            "  lease: slots {}, largest lease {}",
            show(lease.slots.map(|n| n.to_string())),
            show(lease.max_lease.map(|n| format!("{n} tokens"))),
        );
    }
    let mut warnings = 0;
    let mut warn = |s: &mut String, text: String| {
        warnings += 1;
        let _ = writeln!(s, "  warning: {text}");
    };
    if let Some(normal) = rule.normal_rate {
        let rate = rule
            .policies
            .iter()
            .map(Policy::effective_refill_per_second)
            .fold(f64::INFINITY, f64::min);
        if rate < normal {
            warn(
                s,
                format!(
                    "refill rate {} tokens/s is below the normal traffic of {} tokens/s{}: \
                     legitimate requests would be refused constantly",
                    show_number(rate),
                    show_number(normal),
                    if rule.memory_bound().is_some() {
                        " per key"
                    } else {
                        ""
                    },
                ),
            );
        }
    }
    if let Some(queue) = rule.downstream_queue {
        let burst = rule
            .policies
            .iter()
            .map(Policy::capacity)
            .max()
            .unwrap_or(0);
        if burst > queue {
            warn(
                s,
                format!(
                    "capacity {burst} tokens is above the {queue} the downstream queue \
                     absorbs: a full burst moves the bottleneck downstream"
                ),
            );
        }
    }
    warnings
}

fn policy_report(s: &mut String, i: usize, p: &Policy) {
    let _ = writeln!(
        s,
        "  policy {}: capacity {}, refill {} tokens/s{}",
        i + 1,
        p.capacity(),
        show_number(p.refill_per_second()),
        if p.starts_full() {
            ""
        } else {
            ", starts empty"
        },
    );
    let _ = writeln!(
        s,
        "    effective {} tokens/s (rate error {}%), tick {}, wraps after {}",
        show_precise(p.effective_refill_per_second()),
        show_number(p.rate_error() * 100.0),
        show_duration(p.tick()),
        show_long(p.wrap_period()),
    );
}

/// A rate close to a round one, with enough digits to see how close.
fn show_precise(v: f64) -> String {
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A long period in days or years.
fn show_long(d: Duration) -> String {
    let days = d.as_secs_f64() / 86_400.0;
    if days >= 365.25 * 2.0 {
        format!(
            "{} years",
            show_number((days / 365.25 * 10.0).round() / 10.0)
        )
    } else if days >= 2.0 {
        format!("{} days", show_number(days.round()))
    } else {
        show_duration(d)
    }
}

fn memory_report(s: &mut String, m: &MemoryBound, counters: bool) {
    let _ = writeln!(
        s,
        "  memory bound: {} keys x {} B = {} (entries of {} B{}, tables just grown)",
        m.max_keys,
        show_number((m.bytes_per_key * 10.0).round() / 10.0),
        show_bytes(m.total_bytes),
        m.entry_bytes,
        if counters { " with counters" } else { "" },
    );
}

fn show_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{} {}", show_number((v * 10.0).round() / 10.0), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_shown_in_binary_units() {
        assert_eq!(show_bytes(512.0), "512 B");
        assert_eq!(show_bytes(38.9 * 1_048_576.0), "38.9 MiB");
    }

    #[test]
    fn long_periods_are_shown_in_years_or_days() {
        assert_eq!(show_long(Duration::from_secs(3 * 365 * 86_400)), "3 years");
        assert_eq!(show_long(Duration::from_secs(13 * 86_400)), "13 days");
    }
}
