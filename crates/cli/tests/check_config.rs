//! `tokengate check-config` end to end: the README's sample, warnings, and each kind of
//! invalid file refused with a non-zero exit and the place of every problem.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Writes `text` to a fresh file named `name` for one test.
fn file(name: &str, text: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("check-config");
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn check(path: &Path, extra: &[&str]) -> (Output, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .arg("check-config")
        .arg(path)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// The sample configuration of the config crate's README.
fn sample() -> String {
    let readme = include_str!("../../config/README.md");
    let start = readme.find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + readme[start..].find("```").unwrap();
    readme[start..end].to_owned()
}

const TENANT: &str =
    "[[rule]]\nname = \"t\"\nscope = \"tenant\"\npolicies = [\"20/s burst 100\"]\n";

#[test]
fn the_sample_is_valid_and_its_figures_are_printed() {
    let (out, stdout, stderr) = check(&file("sample.toml", &sample()), &[]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("valid: 3 rules, 3 classes, 1 tier, 2 overrides"),
        "{stdout}"
    );
    // B = 10000, r = 5000/s: the effective rate is just below, with its error, tick and
    // wrap period.
    assert!(
        stdout.contains("policy 1: capacity 10000, refill 5000 tokens/s"),
        "{stdout}"
    );
    assert!(stdout.contains("effective 4999.8"), "{stdout}");
    assert!(stdout.contains("rate error 0.004%"), "{stdout}");
    assert!(stdout.contains("wraps after 9.1 years"), "{stdout}");
    // 100,000 tenant keys, one map per policy: 80-byte entries in the first (8 key, 8
    // word, 64 counters) and 16-byte ones in the second (8 key, 8 word).
    assert!(
        stdout.contains(
            "memory bound: 100000 keys x 224 B = 21.4 MiB (entries of 96 B with counters"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("lease: slots 8, largest lease 100 tokens"),
        "{stdout}"
    );
    assert!(!stdout.contains("not enforceable"), "{stdout}");
    // The tenant rule's 100/m is below its normal 2/s per key.
    assert!(
        stdout.contains(
            "warning: refill rate 1.667 tokens/s is below the normal traffic of 2 tokens/s per key"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("\n1 warning\n"), "{stdout}");

    let (out, _, stderr) = check(&file("sample-deny.toml", &sample()), &["--deny-warnings"]);
    assert!(!out.status.success());
    assert!(stderr.contains("1 warning (--deny-warnings)"), "{stderr}");
}

#[test]
fn a_burst_above_the_downstream_queue_is_warned_about() {
    let text = format!("{TENANT}downstream_queue = 50\nnormal_rate = 10\n");
    let (out, stdout, _) = check(&file("queue.toml", &text), &[]);
    assert!(out.status.success());
    assert!(
        stdout
            .contains("warning: capacity 100 tokens is above the 50 the downstream queue absorbs"),
        "{stdout}"
    );
    assert!(!stdout.contains("normal traffic"), "{stdout}");
    assert!(stdout.contains("\n1 warning\n"), "{stdout}");
    // Within the figures: no warning.
    let text = format!("{TENANT}downstream_queue = 100\nnormal_rate = 19.99\n");
    let (_, stdout, _) = check(&file("queue-ok.toml", &text), &[]);
    assert!(stdout.contains("\n0 warnings\n"), "{stdout}");
}

#[test]
fn a_valid_file_the_engine_cannot_build_is_refused() {
    // Two policies and a shared overflow bucket on one keyed rule, and a tier of five
    // policies: the format accepts both, the engine builds neither.
    let text = format!(
        "{}overflow = {{ share = \"5/s burst 5\" }}\n\
         [tier.big]\npolicies = [\"1/s\", \"2/s\", \"3/s\", \"4/s\", \"5/s\"]\n",
        TENANT.replace("[\"20/s burst 100\"]", "[\"20/s burst 100\", \"100/m\"]")
    );
    let (out, stdout, stderr) = check(&file("unenforceable.toml", &text), &[]);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stderr.contains("unenforceable.toml: 2 problems: the engine cannot build this rule set"),
        "{stderr}"
    );
    assert!(stderr.contains("shares an overflow bucket"), "{stderr}");
    assert!(stderr.contains("tier \"big\" has 5 policies"), "{stderr}");
    // The report of what the file means is still printed, with the same parts.
    assert!(stdout.contains("not enforceable"), "{stdout}");
}

#[test]
fn every_problem_of_the_file_is_reported_at_once() {
    let text = "[[rule]]\nname = \"a\"\nscope = \"global\"\npolicies = [\"10/s\"]\n\
                colour = \"red\"\n[[rule]]\nname = \"b\"\nscope = \"planet\"\n\
                policies = [\"5/s\"]\n";
    let (out, _, stderr) = check(&file("all-at-once.toml", text), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("2 problems, nothing applied"), "{stderr}");
    assert!(
        stderr.contains("all-at-once.toml:5:1: colour: unknown field `colour`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("all-at-once.toml:8:9: rule[b].scope"),
        "{stderr}"
    );
}

#[test]
fn each_kind_of_invalid_file_is_refused_with_its_place() {
    for (name, text, needles) in [
        (
            "unknown-field.toml",
            format!("{TENANT}burst = 3\n"),
            vec!["unknown-field.toml:5:1: burst: unknown field `burst`"],
        ),
        (
            "zero-rate.toml",
            TENANT.replace("20/s burst 100", "0/s burst 100"),
            vec!["zero-rate.toml:4:13: rule[t].policies[0]: refill rate must be above 0"],
        ),
        (
            "zero-capacity.toml",
            TENANT.replace("burst 100", "burst 0"),
            vec!["capacity must be at least 1 token, got 0"],
        ),
        (
            "unrepresentable.toml",
            TENANT.replace("20/s", "1e30/s"),
            vec!["is above the largest this layout represents for capacity 100"],
        ),
        (
            "duplicate.toml",
            format!("{TENANT}{}", TENANT.replace("tenant", "user")),
            vec![
                "duplicate.toml:6:8: rule[t].name: rule name \"t\" is already used by the rule at line 2",
            ],
        ),
        (
            "orphan.toml",
            format!(
                "{TENANT}[tier.gold]\npolicies = [\"1/s\"]\n[[override]]\nscope = \"user\"\nkey = 1\ntier = \"gold\"\n"
            ),
            vec!["override for user scopes, which have no rule"],
        ),
        (
            "lease.toml",
            format!("{TENANT}lease = {{ slots = 4 }}\n"),
            vec!["lease on the rule for tenant scopes"],
        ),
        (
            "two.toml",
            format!("{TENANT}max_keys = 0\nshards = 5\n"),
            vec![
                "2 problems, nothing applied",
                "two.toml:5:12: rule[t].max_keys",
                "two.toml:6:10: rule[t].shards",
            ],
        ),
        (
            "not-toml.toml",
            "[[rule]\n".to_owned(),
            vec!["not-toml.toml:1:"],
        ),
    ] {
        let (out, stdout, stderr) = check(&file(name, &text), &[]);
        assert_eq!(out.status.code(), Some(2), "{name}: {stdout}");
        assert!(stdout.is_empty(), "{name}: {stdout}");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{name}: {needle:?} not in {stderr}"
            );
        }
    }
    let (out, _, stderr) = check(Path::new("/nonexistent/limits.toml"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("/nonexistent/limits.toml: cannot read"),
        "{stderr}"
    );
}

/// A file with a `[redis]` section at `url` and a remote tenant rule.
fn with_redis(url: &str) -> String {
    format!(
        "[redis]\nurl = \"{url}\"\nnamespace = \"t-check-config\"\nconnect_timeout = \"300ms\"\n\
         exchange_timeout = \"300ms\"\n\n{}remote = true\n",
        TENANT
    )
}

#[test]
fn a_redis_section_is_checked_against_its_server() {
    let url = std::env::var("TOKENGATE_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let (out, stdout, stderr) = check(&file("redis.toml", &with_redis(&url)), &[]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("answered (namespace \"t-check-config\", 1 remote rule)"),
        "{stdout}"
    );
}

#[test]
fn an_unreachable_redis_is_a_clear_error_within_its_timeouts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = file(
        "redis-down.toml",
        &with_redis(&format!("redis://127.0.0.1:{port}/")),
    );
    let (out, _, stderr) = check(&path, &[]);
    assert!(!out.status.success());
    assert!(stderr.contains("[redis] at redis://127.0.0.1:"), "{stderr}");
    assert!(stderr.contains("did not answer within 300ms"), "{stderr}");
    // Offline: the section is validated, not connected to.
    let (out, _, stderr) = check(&path, &["--offline"]);
    assert!(out.status.success(), "{stderr}");
}

#[test]
fn a_secret_in_the_redis_section_is_refused_without_being_printed() {
    let text = with_redis("redis://u:hunter2@127.0.0.1:6379/");
    let (out, stdout, stderr) = check(&file("redis-secret.toml", &text), &[]);
    assert!(!out.status.success());
    assert!(stderr.contains("redis.url"), "{stderr}");
    assert!(
        !stderr.contains("hunter2") && !stdout.contains("hunter2"),
        "{stderr}"
    );
}

/// An override keyed by a client address names a keyed hash no request will carry: a
/// warning, counted (and refused with `--deny-warnings`); other kinds' overrides are not.
#[test]
fn a_client_override_is_warned_as_never_applied() {
    let text = "[[rule]]\nname = \"ip\"\nscope = \"client\"\npolicies = [\"20/s burst 100\"]\n\
                [tier.gold]\npolicies = [\"200/s burst 1000\"]\n\
                [[override]]\nscope = \"client\"\nkey = 42\ntier = \"gold\"\n";
    let (out, stdout, stderr) = check(&file("client-override.toml", text), &[]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("warning: client:42: a client id is the keyed hash of an address"),
        "{stdout}"
    );
    assert!(stdout.contains("\n1 warning\n"), "{stdout}");
    let (out, _, stderr) = check(
        &file("client-override-deny.toml", text),
        &["--deny-warnings"],
    );
    assert!(!out.status.success());
    assert!(stderr.contains("1 warning (--deny-warnings)"), "{stderr}");

    let tenant = text.replace("\"client\"", "\"tenant\"");
    let (out, stdout, stderr) = check(&file("tenant-override.toml", &tenant), &[]);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("\n0 warnings\n"), "{stdout}");
}
