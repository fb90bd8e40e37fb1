//! The `[redis]` section and remote rules: parsed, validated (bad input is a typed
//! problem naming the field, secrets refused and never echoed), mapped to the client's
//! settings, and guarded on reload (a change a running client cannot take is refused, the
//! running configuration kept).

use std::time::Duration;

use tokengate::scope::ScopeKind;
use tokengate_config::{
    Config, ConfigWatcher, PasswordSource, ProblemKind, RedisConfigError, Topology, WatchOptions,
};
use tokengate_redis::FailMode;

const RULES: &str = r#"
[[rule]]
name = "everyone"
scope = "global"
policies = ["1000/s burst 2000"]

[[rule]]
name = "per-tenant"
scope = "tenant"
policies = ["100/s burst 200"]
remote = true
"#;

fn with_redis(section: &str) -> String {
    format!("[redis]\n{section}\n{RULES}")
}

fn problems(text: &str) -> Vec<(String, ProblemKind)> {
    Config::from_toml(text)
        .unwrap_err()
        .problems()
        .iter()
        .map(|p| (p.field.clone(), p.kind.clone()))
        .collect()
}

#[test]
fn a_full_section_maps_to_the_clients_settings() {
    let config = Config::from_toml(&with_redis(
        r#"
url = "rediss://redis.internal:6380/0"
namespace = "api"
tls_ca_file = "/etc/tokengate/ca.pem"
username = "tokengate"
password_env = "TG_REDIS_PASSWORD"
exchange_timeout = "40ms"
connect_timeout = "1s 500ms"
lease_ttl = "3s"
fail_mode = "fail_closed"
instances = 4
"#,
    ))
    .unwrap();
    let redis = config.redis.as_ref().unwrap();
    assert_eq!(redis.url, "rediss://redis.internal:6380/0");
    assert_eq!(
        redis.password,
        Some(PasswordSource::Env("TG_REDIS_PASSWORD".to_owned()))
    );
    assert_eq!(redis.exchange_timeout, Some(Duration::from_millis(40)));
    assert_eq!(redis.connect_timeout, Some(Duration::from_millis(1500)));
    assert_eq!(redis.lease_ttl, Some(Duration::from_secs(3)));
    assert_eq!(redis.fail_mode, Some(FailMode::FailClosed));
    assert_eq!(redis.topology, Topology::Standalone);
    let pool = redis.pool_config().unwrap();
    let shown = format!("{pool:?}");
    for part in [
        "redis.internal:6380",
        "\"api\"",
        "40ms",
        "1.5s",
        "3s",
        "FailClosed",
        "instances: 4",
        "TG_REDIS_PASSWORD",
        "ca.pem",
        "tokengate",
    ] {
        assert!(shown.contains(part), "{part} missing from {shown}");
    }
    // The remote rule, with the policy Redis enforces.
    assert!(config.rule(ScopeKind::Tenant).unwrap().remote);
    let remote = config.remote_kinds();
    assert_eq!(remote.len(), 1);
    assert_eq!(remote[0].0, ScopeKind::Tenant);
    assert_eq!(remote[0].1.capacity(), 200);
}

#[test]
fn secrets_in_the_file_are_refused_and_never_echoed() {
    let found = problems(&with_redis(
        "url = \"redis://u:hunter2@h:6379/\"\npassword = \"hunter3\"",
    ));
    assert!(found.contains(&("redis.url".to_owned(), ProblemKind::InlineSecret)));
    assert!(found.contains(&("redis.password".to_owned(), ProblemKind::InlineSecret)));
    let message = Config::from_toml(&with_redis(
        "url = \"redis://u:hunter2@h:6379/\"\npassword = \"hunter3\"",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        !message.contains("hunter2") && !message.contains("hunter3"),
        "{message}"
    );
}

#[test]
fn bad_values_are_typed_problems_naming_each_field() {
    let found = problems(&with_redis(
        r#"
url = "http://h/"
namespace = "a{b}"
exchange_timeout = "forever"
connect_timeout = "2m"
lease_ttl = "1ms"
fail_mode = "maybe"
instances = 0
password_env = "A"
password_file = "/b"
cluster_nodes = ["redis://a:7000/"]
sentinel_master = "m"
"#,
    ));
    let fields: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
    for field in [
        "redis.url",
        "redis.namespace",
        "redis.exchange_timeout",
        "redis.connect_timeout",
        "redis.lease_ttl",
        "redis.fail_mode",
        "redis.instances",
        "redis.password_env",
        "redis.cluster_nodes",
    ] {
        assert!(fields.contains(&field), "{field} not reported: {found:?}");
    }
    // Unknown fields are refused too.
    let found = problems(&with_redis("url = \"redis://h/\"\ntimeout = \"1s\""));
    assert!(
        found
            .iter()
            .any(|(f, k)| f == "timeout" && matches!(k, ProblemKind::Syntax(_))),
        "{found:?}"
    );
}

/// `wait_for_replicas` with `wait_timeout`: mapped to `PoolConfig::wait_for_replicas`;
/// both or neither, the count in the client's range, the timeout a duration below the
/// exchange timeout (the section's, else the client's 50 ms), each a typed problem naming
/// its field; a change of either is a change a running client cannot take.
#[test]
fn wait_for_replicas_maps_to_the_client_and_bad_values_are_typed_problems() {
    let section = |extra: &str| with_redis(&format!("url = \"redis://h:6379/\"\n{extra}"));
    let config =
        Config::from_toml(&section("wait_for_replicas = 2\nwait_timeout = \"20ms\"")).unwrap();
    let redis = config.redis.as_ref().unwrap();
    assert_eq!(
        redis.wait_for_replicas,
        Some((2, Duration::from_millis(20)))
    );
    let pool = redis.pool_config().unwrap();
    assert_eq!(pool.replicas_waited_for(), Some(2));
    assert!(format!("{pool:?}").contains("(2, 20ms)"), "{pool:?}");
    let plain = Config::from_toml(&section("")).unwrap();
    let plain = plain.redis.as_ref().unwrap();
    assert_eq!(plain.wait_for_replicas, None);
    assert_eq!(plain.pool_config().unwrap().replicas_waited_for(), None);
    // A longer exchange timeout admits a longer wait.
    let longer = "exchange_timeout = \"200ms\"\nwait_for_replicas = 1\nwait_timeout = \"150ms\"";
    assert!(Config::from_toml(&section(longer)).is_ok());

    for (extra, field, expected) in [
        (
            "wait_for_replicas = 0\nwait_timeout = \"20ms\"",
            "wait_for_replicas",
            "1 ..= 16",
        ),
        (
            "wait_for_replicas = 17\nwait_timeout = \"20ms\"",
            "wait_for_replicas",
            "1 ..= 16",
        ),
        (
            "wait_for_replicas = -1\nwait_timeout = \"20ms\"",
            "wait_for_replicas",
            "1 ..= 16",
        ),
        (
            "wait_for_replicas = 1\nwait_timeout = \"soon\"",
            "wait_timeout",
            "a duration",
        ),
        (
            "wait_for_replicas = 1\nwait_timeout = \"0ms\"",
            "wait_timeout",
            "1ms ..= 1m",
        ),
        (
            "wait_for_replicas = 1\nwait_timeout = \"50ms\"",
            "wait_timeout",
            "below the exchange timeout (50ms)",
        ),
        (
            "exchange_timeout = \"200ms\"\nwait_for_replicas = 1\nwait_timeout = \"1s\"",
            "wait_timeout",
            "below the exchange timeout (200ms)",
        ),
        ("wait_for_replicas = 1", "wait_for_replicas", "both"),
        ("wait_timeout = \"20ms\"", "wait_timeout", "both"),
    ] {
        let found = problems(&section(extra));
        assert_eq!(found.len(), 1, "{extra}: {found:?}");
        let (f, kind) = &found[0];
        assert_eq!(f, &format!("redis.{field}"), "{extra}: {found:?}");
        assert!(
            matches!(kind, ProblemKind::OutOfRange { expected: e, .. } if e.contains(expected)),
            "{extra}: {kind:?}"
        );
    }

    // Either changed: a field the running client was built from.
    let with = |extra: &str| Config::from_toml(&section(extra)).unwrap().redis.unwrap();
    let running = with("wait_for_replicas = 1\nwait_timeout = \"20ms\"");
    for (extra, changed) in [
        (
            "wait_for_replicas = 1\nwait_timeout = \"30ms\"",
            vec!["wait_timeout"],
        ),
        (
            "wait_for_replicas = 2\nwait_timeout = \"20ms\"",
            vec!["wait_for_replicas"],
        ),
        ("", vec!["wait_for_replicas", "wait_timeout"]),
        ("wait_for_replicas = 1\nwait_timeout = \"20ms\"", vec![]),
    ] {
        assert_eq!(running.changed_fields(&with(extra)), changed, "{extra}");
    }
}

#[test]
fn remote_rules_need_a_section_and_a_keyed_kind() {
    let found = problems(RULES);
    assert_eq!(
        found,
        vec![(
            "rule[per-tenant].remote".to_owned(),
            ProblemKind::RemoteWithoutRedis
        )]
    );
    let global_remote = format!(
        "[redis]\nurl = \"redis://h/\"\n{}",
        RULES.replacen(
            "policies = [\"1000/s burst 2000\"]",
            "policies = [\"1000/s burst 2000\"]\nremote = true",
            1
        )
    );
    assert!(problems(&global_remote).contains(&(
        "rule[everyone].remote".to_owned(),
        ProblemKind::RemoteGlobal
    )));
}

#[test]
fn cluster_and_sentinel_sections_map_to_the_clients_url_forms() {
    let config = Config::from_toml(&with_redis(
        "url = \"rediss://a:7000/\"\ncluster_nodes = [\"rediss://b:7000/\", \"rediss://a:7000\", \"rediss://c:7001/0\"]\nusername = \"tg\"",
    ))
    .unwrap();
    let redis = config.redis.as_ref().unwrap();
    assert!(matches!(&redis.topology, Topology::Cluster { nodes } if nodes.len() == 3));
    // `url`'s node first, each node once, TLS from the scheme.
    assert_eq!(redis.client_url(), "rediss+cluster://a:7000,b:7000,c:7001/");
    let shown = format!("{:?}", redis.pool_config().unwrap());
    assert!(
        shown.contains("rediss+cluster://a:7000,b:7000,c:7001/"),
        "{shown}"
    );

    let config = Config::from_toml(&with_redis(
        "url = \"redis://ignored:6379/3\"\nsentinel_master = \"mymaster\"\nsentinels = [\"redis://s1:26379/\", \"redis://s2\"]",
    ))
    .unwrap();
    let redis = config.redis.as_ref().unwrap();
    assert!(matches!(&redis.topology, Topology::Sentinel { master, .. } if master == "mymaster"));
    assert_eq!(
        redis.client_url(),
        "redis+sentinel://s1:26379,s2/mymaster/3"
    );
    let standalone = Config::from_toml(&with_redis("url = \"redis://h:6379/2\"")).unwrap();
    assert_eq!(
        standalone.redis.as_ref().unwrap().client_url(),
        "redis://h:6379/2"
    );
}

/// A port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_sentinel_section_reaches_the_sentinel_discovery() {
    let port = dead_port();
    let config = Config::from_toml(&with_redis(&format!(
        "url = \"redis://unused/\"\nsentinel_master = \"mymaster\"\nsentinels = [\"redis://127.0.0.1:{port}/\"]\nconnect_timeout = \"200ms\"\nexchange_timeout = \"200ms\""
    )))
    .unwrap();
    let e = config.remote_store().unwrap_err();
    assert!(
        matches!(
            &e,
            RedisConfigError::Pool(tokengate_redis::PoolError::Sentinel { master, .. })
                if master == "mymaster"
        ),
        "{e}"
    );
}

#[test]
fn a_cluster_section_reaches_the_cluster_client() {
    let port = dead_port();
    let config = Config::from_toml(&with_redis(&format!(
        "url = \"redis://127.0.0.1:{port}/\"\ncluster_nodes = [\"redis://127.0.0.1:{port}/\"]\nconnect_timeout = \"200ms\"\nexchange_timeout = \"200ms\""
    )))
    .unwrap();
    let e = config.remote_store().unwrap_err();
    // The cluster URL parsed (no `Url` error) and its seed was tried.
    assert!(
        matches!(
            &e,
            RedisConfigError::Pool(tokengate_redis::PoolError::Unreachable { url, .. })
                if url.starts_with("redis+cluster://")
        ),
        "{e}"
    );
}

#[test]
fn cluster_and_sentinel_fields_the_client_cannot_use_are_typed_problems() {
    let found = problems(&with_redis(
        "url = \"redis://a:7000/1\"\ncluster_nodes = [\"rediss://b:7000/\", \"redis://c:7000/2\", \"redis://d:7000/?x=1\"]",
    ));
    let fields: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
    for field in [
        "redis.url",
        "redis.cluster_nodes[0]",
        "redis.cluster_nodes[1]",
        "redis.cluster_nodes[2]",
    ] {
        assert!(fields.contains(&field), "{field} not reported: {found:?}");
    }
    let found = problems(&with_redis(
        "url = \"redis://a/x\"\nsentinel_master = \"my/master\"\nsentinels = [\"rediss://s1:26379/\", \"redis://s2:26379/0\"]",
    ));
    let fields: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
    for field in [
        "redis.url",
        "redis.sentinel_master",
        "redis.sentinels[0]",
        "redis.sentinels[1]",
    ] {
        assert!(fields.contains(&field), "{field} not reported: {found:?}");
    }
}

#[test]
fn an_unreachable_redis_is_a_typed_error_within_the_timeouts() {
    let port = dead_port();
    let config = Config::from_toml(&with_redis(&format!(
        "url = \"redis://127.0.0.1:{port}/\"\nconnect_timeout = \"200ms\"\nexchange_timeout = \"200ms\""
    )))
    .unwrap();
    let started = std::time::Instant::now();
    let e = config.remote_store().unwrap_err();
    assert!(
        matches!(
            e,
            RedisConfigError::Pool(tokengate_redis::PoolError::Unreachable { .. })
        ),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_reload_changing_the_redis_section_is_refused_and_the_running_one_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokengate.toml");
    let base = with_redis("url = \"redis://h:6379/\"\nexchange_timeout = \"50ms\"");
    std::fs::write(&path, &base).unwrap();
    let w = ConfigWatcher::start(&path, WatchOptions::new()).unwrap();
    // A local rule's policy changes live.
    let live = base.replace("1000/s burst 2000", "500/s burst 1000");
    std::fs::write(&path, &live).unwrap();
    assert_eq!(w.reload_now(), Ok(true));
    assert_eq!(
        w.current().rule(ScopeKind::Global).unwrap().policies[0].capacity(),
        1000
    );
    // The timeout and a remote rule's policy do not: refused, nothing changed.
    let refused = |text: String, want: &[&str]| {
        std::fs::write(&path, text).unwrap();
        let e = w.reload_now().unwrap_err();
        let fields: Vec<&str> = e.problems().iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, want);
        assert!(
            e.problems()
                .iter()
                .all(|p| matches!(p.kind, ProblemKind::NotLive(_)))
        );
        let running = w.current();
        assert_eq!(
            running.redis.as_ref().unwrap().exchange_timeout,
            Some(Duration::from_millis(50))
        );
        let tenant = running.rule(ScopeKind::Tenant).unwrap();
        assert!(tenant.remote);
        assert_eq!(tenant.policies[0].capacity(), 200);
    };
    refused(
        live.replace("50ms", "80ms")
            .replace("100/s burst 200", "50/s burst 100"),
        &["redis.exchange_timeout", "rule[per-tenant].policies"],
    );
    // Nor waiting for replicas, added.
    refused(
        live.replace(
            "exchange_timeout = \"50ms\"",
            "exchange_timeout = \"50ms\"\nwait_for_replicas = 1\nwait_timeout = \"20ms\"",
        ),
        &["redis.wait_for_replicas", "redis.wait_timeout"],
    );
    // Nor a rule's remote flag.
    refused(
        live.replace("remote = true", "remote = false"),
        &["rule[per-tenant].remote"],
    );
}
