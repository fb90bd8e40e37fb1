//! `rediss://` with rustls against a private `redis-server --tls-port` whose CA and server
//! certificate the test makes with `openssl`, and ACL users on a private server: the
//! minimal ACL of the README, credentials from the URL, the environment and a file, and
//! the typed errors of a wrong CA and a wrong password.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokengate_redis::{
    Admitted, PoolConfig, PoolError, RedisPool, RedisScopes, RemotePolicy, StrictAdmitted,
};

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(common::namespace(test));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed to make the test certificates");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA (`name.crt`, `name.key`) in `dir`.
fn make_ca(dir: &Path, name: &str) {
    let (crt, key) = (format!("{name}.crt"), format!("{name}.key"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &format!("/CN=tokengate test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// `ca.crt`, and `server.crt`/`server.key` for 127.0.0.1 signed by it; `other.crt`, a CA
/// that signed nothing here.
fn make_certificates(dir: &Path) {
    make_ca(dir, "ca");
    make_ca(dir, "other");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private server answering TLS on the returned port (and plain TCP on its own).
fn tls_server(dir: &Path) -> (common::Server, u16) {
    make_certificates(dir);
    let tls_port = free_port();
    let file = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let server = common::Server::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    (server, tls_port)
}

fn fast(config: PoolConfig) -> PoolConfig {
    config
        .connect_timeout(Duration::from_secs(2))
        .exchange_timeout(Duration::from_secs(1))
}

/// Decides on `bucket` until a lease pays (the pool's first round trips ran).
fn admits_leased(bucket: &tokengate_redis::RemoteBucket) {
    common::wait_until(
        "no decision paid from a lease",
        Duration::from_secs(5),
        || bucket.try_acquire(1) == Ok(Admitted::Leased),
        || std::thread::sleep(Duration::from_millis(2)),
    );
}

#[test]
fn over_tls_the_pool_and_strict_scopes_admit_with_the_right_ca_and_refuse_a_wrong_one() {
    let dir = scratch("tls");
    let (_server, port) = tls_server(&dir);
    let url = format!("rediss://127.0.0.1:{port}/");

    // The CA from a file: the pool's thread leases over TLS.
    let pool = RedisPool::connect(fast(
        PoolConfig::new(&url, common::namespace("tls")).tls_root_ca_file(dir.join("ca.crt")),
    ))
    .unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(100, 10.0).unwrap())
        .unwrap();
    admits_leased(&bucket);
    assert!(pool.round_trips() > 0);

    // The CA as PEM: a strict decision over TLS.
    let pem = std::fs::read(dir.join("ca.crt")).unwrap();
    let scopes = RedisScopes::connect(fast(
        PoolConfig::new(&url, common::namespace("tls-strict")).tls_root_ca(pem),
    ))
    .unwrap();
    let tenant = scopes
        .scope("tenant", RemotePolicy::new(10, 1.0).unwrap())
        .unwrap();
    assert_eq!(
        scopes.try_acquire("t1", &[(&tenant, "t1", 1)]),
        Ok(StrictAdmitted::Taken)
    );

    // A CA that did not sign the server's certificate, and the system's roots (which do
    // not hold the test CA): a typed TLS error at connect, for both clients.
    for config in [
        PoolConfig::new(&url, "tls-wrong").tls_root_ca_file(dir.join("other.crt")),
        PoolConfig::new(&url, "tls-system"),
    ] {
        match RedisPool::connect(fast(config.clone())) {
            Err(PoolError::Tls { detail, .. }) => {
                assert!(detail.contains("certificate"), "{detail}");
            }
            other => panic!("expected a TLS error, got {other:?}"),
        }
        assert!(
            matches!(
                RedisScopes::connect(fast(config)),
                Err(PoolError::Tls { .. })
            ),
            "RedisScopes over TLS with an untrusted certificate"
        );
    }
    // A CA file that does not exist: a TLS error naming it.
    let missing = RedisPool::connect(fast(
        PoolConfig::new(&url, "tls-missing").tls_root_ca_file(dir.join("absent.crt")),
    ));
    assert!(
        matches!(&missing, Err(PoolError::Tls { detail, .. }) if detail.contains("absent.crt")),
        "{missing:?}"
    );
    drop((pool, scopes));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's minimal ACL for the crate's user: the commands it sends (`EVALSHA`,
/// `SCRIPT LOAD`, `INFO`, `DEL`) and those its scripts call, on keys under `tg:` only.
const MINIMAL_ACL: &[&str] = &[
    "resetkeys",
    "~tg:*",
    "resetchannels",
    "-@all",
    "+evalsha",
    "+script|load",
    "+info",
    "+del",
    "+time",
    "+hget",
    "+hmget",
    "+hset",
    "+hdel",
    "+pexpire",
    "+zadd",
    "+zcard",
    "+zrange",
    "+zrangebyscore",
    "+zrem",
    "+zremrangebyscore",
    "+zscore",
];

#[test]
fn an_acl_user_with_the_minimal_acl_works_and_a_wrong_password_is_a_typed_error() {
    let server = common::Server::start();
    let mut admin = server.connect();
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg("tokengate")
        .arg("on")
        .arg(">s3cret-pw");
    setuser.arg(MINIMAL_ACL);
    let _: () = setuser.query(&mut admin).unwrap();
    let port = server.port();

    // From the URL: leases, a reset (DEL), and strict takes and give backs.
    let url = format!("redis://tokengate:s3cret-pw@127.0.0.1:{port}/");
    let pool = RedisPool::connect(fast(PoolConfig::new(&url, common::namespace("acl")))).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(100, 10.0).unwrap())
        .unwrap();
    admits_leased(&bucket);
    bucket.request_reset();
    let scopes =
        RedisScopes::connect(fast(PoolConfig::new(&url, common::namespace("acl-s")))).unwrap();
    let user = scopes
        .scope("user", RemotePolicy::new(10, 1.0).unwrap())
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            scopes.try_acquire("u", &[(&user, "u1", 1)]),
            Ok(StrictAdmitted::Taken)
        );
    }
    scopes.give_back("u", &[(&user, "u1", 1)]);
    assert!(!scopes.is_unavailable() && !pool.is_unavailable());
    // Nothing the user ran was refused: every round succeeded.
    admits_leased(&bucket);

    // From a file (a trailing line break, as secrets are mounted) and the user set apart.
    let dir = scratch("acl");
    let secret = dir.join("password");
    std::fs::write(&secret, "s3cret-pw\n").unwrap();
    let plain = format!("redis://127.0.0.1:{port}/");
    let from_file = PoolConfig::new(&plain, common::namespace("acl-f"))
        .username("tokengate")
        .password_file(&secret);
    assert!(!format!("{from_file:?}").contains("s3cret"));
    let scopes = RedisScopes::connect(fast(from_file)).unwrap();
    assert_eq!(
        scopes.try_acquire("u", &[(&user, "u2", 1)]),
        Ok(StrictAdmitted::Taken)
    );

    // From the environment.
    let var = format!("TOKENGATE_TEST_PW_{}", std::process::id());
    // SAFETY: the variable is this test's own; no other code reads or writes it.
    unsafe { std::env::set_var(&var, "s3cret-pw") };
    let from_env = PoolConfig::new(&plain, common::namespace("acl-e"))
        .username("tokengate")
        .password_from_env(&var);
    assert!(!format!("{from_env:?}").contains("s3cret"));
    let pool = RedisPool::connect(fast(from_env)).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(100, 10.0).unwrap())
        .unwrap();
    admits_leased(&bucket);

    // A wrong password, in the URL, a file or the environment: a typed error that shows
    // no password.
    std::fs::write(&secret, "wrong-pw").unwrap();
    let wrong_var = format!("{var}_WRONG");
    // SAFETY: as above.
    unsafe { std::env::set_var(&wrong_var, "wrong-pw") };
    for config in [
        PoolConfig::new(
            format!("redis://tokengate:wrong-pw@127.0.0.1:{port}/"),
            "acl-w",
        ),
        PoolConfig::new(&plain, "acl-w")
            .username("tokengate")
            .password_file(&secret),
        PoolConfig::new(&plain, "acl-w")
            .username("tokengate")
            .password_from_env(&wrong_var),
    ] {
        for result in [
            RedisPool::connect(fast(config.clone())).map(drop),
            RedisScopes::connect(fast(config)).map(drop),
        ] {
            match result {
                Err(e @ PoolError::Auth { .. }) => {
                    let shown = format!("{e} {e:?}");
                    assert!(!shown.contains("wrong-pw"), "{shown}");
                }
                other => panic!("expected an authentication error, got {other:?}"),
            }
        }
    }
    // No password where the server requires one (the default user is off): NOAUTH.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("off")
        .query(&mut admin)
        .unwrap();
    assert!(matches!(
        RedisPool::connect(fast(PoolConfig::new(&plain, "acl-none"))),
        Err(PoolError::Auth { .. })
    ));
    // A password source that has nothing: a typed error naming the source, not a
    // connection without AUTH.
    let unset = format!("{var}_UNSET");
    match RedisPool::connect(fast(
        PoolConfig::new(&plain, "acl-u")
            .username("tokengate")
            .password_from_env(&unset),
    )) {
        Err(PoolError::Credentials { source, .. }) => assert!(source.contains(&unset)),
        other => panic!("expected a credentials error, got {other:?}"),
    }
    std::fs::write(&secret, "\n").unwrap();
    assert!(matches!(
        RedisPool::connect(fast(
            PoolConfig::new(&plain, "acl-u")
                .username("tokengate")
                .password_file(&secret),
        )),
        Err(PoolError::Credentials { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}
