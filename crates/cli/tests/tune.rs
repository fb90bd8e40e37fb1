//! `tokengate tune` end to end: generated logs with known answers, the formats, bad input,
//! and the same answer at any thread count.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tokengate::Policy;

const T0: u64 = 1_700_000_000;

/// A fresh directory for one test's files.
fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tune")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `tokengate tune` with the outputs in `d`, at `threads` rayon threads.
fn tune(d: &Path, threads: usize, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .arg("tune")
        .args(args)
        .arg("--csv")
        .arg(d.join("cells.csv"))
        .arg("--svg")
        .arg(d.join("heat.svg"))
        .arg("--quiet")
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The CSV of every cell: one map from column name to value per row.
fn cells(d: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(d.join("cells.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn num(row: &std::collections::HashMap<String, String>, column: &str) -> f64 {
    row[column].parse().unwrap()
}

fn write(d: &Path, name: &str, text: &str) -> PathBuf {
    let p = d.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `clients` clients, each sending exactly `n` requests a second for `secs` seconds,
/// evenly spaced (CSV times with fractions, so nothing is spread).
fn steady_csv(clients: u64, n: u64, secs: u64) -> String {
    let mut s = String::from("timestamp,key,cost\n");
    for i in 0..n * secs {
        let nanos = i * 1_000_000_000 / n;
        for c in 0..clients {
            s.push_str(&format!(
                "{}.{:09},client-{c},1\n",
                T0 + nanos / 1_000_000_000,
                nanos % 1_000_000_000
            ));
        }
    }
    s
}

#[test]
fn clients_at_n_per_second_pass_at_rate_n_and_lose_the_excess_below() {
    let d = dir("steady");
    let (clients, n, secs, capacity) = (5u64, 10u64, 60u64, 2u64);
    let log = write(&d, "steady.csv", &steady_csv(clients, n, secs));
    let out = tune(
        &d,
        2,
        &[
            log.to_str().unwrap(),
            "--format=csv",
            "--capacities=2..2",
            "--capacity-steps=1",
            "--rates=2.5..40",
            "--rate-steps=5",
            "--objective=requests",
            "--max-rejected=0",
        ],
    );
    let stdout = ok(&out);
    let rows = cells(&d);
    let rates: Vec<f64> = rows.iter().map(|r| num(r, "rate")).collect();
    assert_eq!(rates, [2.5, 5.0, 10.0, 20.0, 40.0]);
    let requests = clients * n * secs;
    for row in &rows {
        let rate = num(row, "rate");
        assert_eq!(num(row, "requests"), requests as f64);
        let rejected = num(row, "rejected");
        if rate >= n as f64 {
            assert_eq!(rejected, 0.0, "rate {rate}");
        } else {
            // Each client gets its burst of B, then r tokens a second until its last
            // request at secs - 1/n: B + r (secs - 1/n) admitted, within one request
            // (refill lands on tick edges).
            let r = Policy::new(capacity, rate)
                .unwrap()
                .effective_refill_per_second();
            let admitted = capacity as f64 + r * (secs as f64 - 1.0 / n as f64);
            let expected = clients as f64 * (n * secs) as f64 - clients as f64 * admitted.floor();
            assert!(
                (rejected - expected).abs() <= clients as f64,
                "rate {rate}: rejected {rejected}, expected {expected}"
            );
            assert_eq!(num(row, "keys_rejected_share"), 1.0);
        }
    }
    // The rule at zero tolerance: exactly the rate of the clients.
    assert!(
        stdout.contains("recommended: B = 2 tokens, r = 10 tokens/s"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "scope = \"client\"\npolicies = [{ capacity = 2, refill_per_second = 10.0 }]\n\
             max_keys = 1048576\n"
        ),
        "{stdout}"
    );
}

#[test]
fn whole_second_logs_spread_evenly_pass_at_rate_n() {
    // The same clients in Common Log Format: whole-second times, n lines per second
    // and client. Spread evenly they pass at r = n with B = 2; all at the start of their
    // second they are bursts of n that B = 2 cannot hold.
    let d = dir("spread");
    let n = 10;
    let mut log = String::new();
    for s in 0..30u64 {
        let t = format!(
            "14/Nov/2023:22:{:02}:{:02} +0000",
            13 + (20 + s) / 60,
            (20 + s) % 60
        );
        for _ in 0..n {
            for c in 0..3 {
                log.push_str(&format!("10.0.0.{c} - - [{t}] \"GET /a HTTP/1.1\" 200 5\n"));
            }
        }
    }
    let log = write(&d, "access.log", &log);
    let run = |spread: &str| {
        let out = tune(
            &d,
            1,
            &[
                log.to_str().unwrap(),
                "--capacities=2..2",
                "--capacity-steps=1",
                "--rates=10..10",
                "--rate-steps=1",
                "--objective=requests",
                "--max-rejected=1",
                &format!("--spread={spread}"),
            ],
        );
        ok(&out);
        num(&cells(&d)[0], "rejected")
    };
    assert_eq!(run("even"), 0.0);
    assert!(run("start") > 0.0);
}

#[test]
fn a_single_burst_of_k_needs_a_capacity_of_k() {
    let d = dir("burst");
    let k = 53;
    let mut log = String::new();
    for _ in 0..k {
        log.push_str(&format!("{T0}.5,tenant,1\n"));
    }
    // One more request 200 s later, when every bucket of the grid has refilled (it
    // passes): the log then spans 200 s, long enough to judge each cell (fill time
    // B / r at most 100 s).
    log.push_str(&format!("{},tenant,1\n", T0 + 200));
    let log = write(&d, "burst.csv", &log);
    let out = tune(
        &d,
        2,
        &[
            log.to_str().unwrap(),
            "--format=csv",
            "--key=global",
            "--capacities=10..100",
            "--capacity-steps=30",
            "--rates=1..1",
            "--rate-steps=1",
            "--objective=requests",
            "--max-rejected=0",
        ],
    );
    let stdout = ok(&out);
    let rows = cells(&d);
    let capacities: Vec<f64> = rows.iter().map(|r| num(r, "capacity")).collect();
    assert!(capacities.len() > 20 && capacities.contains(&(k as f64)));
    for row in &rows {
        let b = num(row, "capacity");
        assert_eq!(num(row, "rejected"), (k as f64 - b).max(0.0), "B = {b}");
    }
    assert!(
        stdout.contains(&format!("recommended: B = {k} tokens, r = 1 tokens/s")),
        "{stdout}"
    );
    // One key for all: the recommendation is a single bucket.
    assert!(
        stdout.contains(&format!(
            "scope = \"global\"\npolicies = [{{ capacity = {k}, refill_per_second = 1.0 }}]\n\nwrote"
        )),
        "{stdout}"
    );
}

/// A busy log: 200 clients of very different volumes, classes, one-second times.
fn busy_clf(lines: usize) -> String {
    let mut s = String::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Client c with probability ~ 1/(c+1): a few heavy, many light.
        let c = (x % 200) * (x >> 32) % 200 / ((x >> 40) % 7 + 1);
        let sec = i / 50;
        let path = if x.is_multiple_of(11) {
            "/export/all"
        } else {
            "/api/items"
        };
        s.push_str(&format!(
            "192.0.2.{c} - - [14/Nov/2023:{:02}:{:02}:{:02} +0000] \"GET {path} HTTP/1.1\" 200 1\n",
            sec / 3600 % 24,
            sec / 60 % 60,
            sec % 60
        ));
    }
    s
}

#[test]
fn one_thread_and_four_threads_give_the_same_answer() {
    let d = dir("threads");
    let log = write(&d, "busy.log", &busy_clf(20_000));
    let args = [
        log.to_str().unwrap(),
        "--class=GET /export/*=8",
        "--spread=random",
        "--seed=7",
        "--capacity-steps=6",
        "--rate-steps=6",
        "--max-keys=64",
        "--chunk=1000",
    ];
    let strip = |s: String| -> String {
        s.lines()
            .filter(|l| !l.starts_with("time:") && !l.starts_with("wrote"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let one = strip(ok(&tune(&d, 1, &args)));
    let csv_one = std::fs::read_to_string(d.join("cells.csv")).unwrap();
    let four = strip(ok(&tune(&d, 4, &args)));
    let csv_four = std::fs::read_to_string(d.join("cells.csv")).unwrap();
    assert_eq!(one, four);
    assert_eq!(csv_one, csv_four);
    // The map bound matters here: some new keys were refused.
    assert!(
        cells(&d)
            .iter()
            .any(|r| num(r, "key_limit_rejections") > 0.0)
    );
}

#[test]
fn progress_goes_to_standard_error_and_the_report_to_standard_output() {
    let d = dir("progress");
    let log = write(&d, "busy.log", &busy_clf(5000));
    let out = Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .args([
            "tune",
            log.to_str().unwrap(),
            "--chunk=1000",
            "--reorder-window=2s",
        ])
        .args(["--capacity-steps=2", "--rate-steps=2", "--max-rejected=1"])
        .arg("--csv")
        .arg(d.join("cells.csv"))
        .arg("--svg")
        .arg(d.join("heat.svg"))
        .output()
        .unwrap();
    let stdout = ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("% of the logs read (")
            && stderr.contains("5000 lines, 5000 requests; 4 cells replayed"),
        "{stderr}"
    );
    assert!(stderr.contains("tune: 100% of the logs read"), "{stderr}");
    assert!(stderr.lines().count() >= 5, "{stderr}");
    assert!(!stdout.contains("lines read"), "{stdout}");
    assert!(stdout.contains("recommended:"), "{stdout}");
}

#[test]
fn gzip_logs_read_as_the_plain_log() {
    let d = dir("gzip");
    let text = busy_clf(3000);
    let plain = write(&d, "a.log", &text);
    let gz = d.join("a.log.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
    let args = ["--capacity-steps=4", "--rate-steps=4", "--rates=0.1..1000"];
    ok(&tune(
        &d,
        2,
        &[&[plain.to_str().unwrap()][..], &args].concat(),
    ));
    let a = std::fs::read_to_string(d.join("cells.csv")).unwrap();
    ok(&tune(&d, 2, &[&[gz.to_str().unwrap()][..], &args].concat()));
    let b = std::fs::read_to_string(d.join("cells.csv")).unwrap();
    assert_eq!(a, b);
    assert!(a.lines().count() == 17);
}

#[test]
fn combined_and_json_samples_parse_with_their_edge_cases() {
    let d = dir("formats");
    // nginx combined: IPv6, a missing byte count, a quoted user agent with spaces and
    // escaped quotes, different zones for the same instants.
    let combined = r#"2001:db8::1 - - [14/Nov/2023:22:13:20 +0000] "GET /search?q=a%20b HTTP/1.1" 200 - "-" "Mozilla/5.0 (X11; Linux x86_64)"
203.0.113.9 - alice [14/Nov/2023:23:13:20 +0100] "POST /export/csv HTTP/2.0" 201 512 "https://example.com/a b" "curl/8.4 \"quoted\""
2001:db8::1 - - [14/Nov/2023:17:13:22 -0500] "GET /search HTTP/1.1" 304 0 "-" "Mozilla/5.0 (X11; Linux x86_64)"
"#;
    let log = write(&d, "combined.log", combined);
    let out = ok(&tune(
        &d,
        1,
        &[
            log.to_str().unwrap(),
            "--key=field:user-agent",
            "--class=POST /export/*=7",
            "--capacities=1..1",
            "--capacity-steps=1",
            "--rates=1..1",
            "--rate-steps=1",
            "--objective=requests",
            "--max-rejected=1",
        ],
    ));
    assert!(out.contains("3 requests (9 tokens) from 2 keys"), "{out}");
    assert!(out.contains("0 bad"), "{out}");
    // B = 1: the export (cost 7) is above the capacity; the same agent's two searches
    // are two seconds apart at r = 1: both pass. (One second apart, the second would be
    // refused: refill lags the ideal bucket by up to two ticks, never leads it.)
    let row = &cells(&d)[0];
    assert_eq!(num(row, "rejected"), 1.0);
    assert_eq!(num(row, "cost_above_capacity"), 1.0);

    let json = r#"{"ts":"2023-11-14T22:13:20.100Z","req":{"verb":"GET","uri":"/v1/items?id=1"},"tenant":"acme"}
{"ts":1700000000.2,"req":{"verb":"GET","uri":"/v1/items"},"tenant":"acme"}
{"ts":"2023-11-14T23:13:20.300+01:00","req":{"verb":"DELETE","uri":"/v2/items/1"},"tenant":"globex"}
"#;
    let log = write(&d, "app.jsonl", json);
    let out = ok(&tune(
        &d,
        1,
        &[
            log.to_str().unwrap(),
            "--format=json",
            "--json-time=ts",
            "--json-method=req.verb",
            "--json-path=req.uri",
            "--key=path",
            "--class=DELETE *=3",
            "--capacities=2..2",
            "--capacity-steps=1",
            "--rates=40..40",
            "--rate-steps=1",
            "--objective=requests",
            "--max-rejected=1",
        ],
    ));
    assert!(out.contains("3 requests (5 tokens) from 2 keys"), "{out}");
    assert!(out.contains("class DELETE *=3: 1 requests"), "{out}");
    // Key v1 has B = 2 and two requests 100 ms apart: both pass; v2's 3 > B. (The log
    // spans 200 ms: r = 40/s fills B in 50 ms, a rate the log can judge.)
    assert_eq!(num(&cells(&d)[0], "rejected"), 1.0);
}

#[test]
fn out_of_order_lines_pass_within_the_window_and_are_bad_beyond_it() {
    let d = dir("order");
    let log = write(
        &d,
        "o.csv",
        &format!(
            "{a}.9,k,1\n{b}.1,k,1\n{a}.5,k,1\n{c}.0,k,1\n{a}.0,k,1\n",
            a = T0,
            b = T0 + 1,
            c = T0 + 5
        ),
    );
    let out = ok(&tune(
        &d,
        1,
        &[
            log.to_str().unwrap(),
            "--format=csv",
            "--reorder-window=1s",
            "--max-bad=0.5",
            "--capacity-steps=1",
            "--rates=10..10",
            "--rate-steps=1",
            "--max-rejected=1",
        ],
    ));
    assert!(out.contains("4 requests (4 tokens) from 1 keys"), "{out}");
    assert!(out.contains("5 lines, 1 bad"), "{out}");
    assert!(
        out.contains(
            "o.csv:5: 5 s earlier than a line before it, beyond the reorder window of 1 s"
        ),
        "{out}"
    );
}

#[test]
fn bad_lines_are_reported_by_number_and_fail_past_the_threshold() {
    let d = dir("bad");
    let mut text = String::new();
    for i in 0..10 {
        if i % 3 == 1 {
            text.push_str("not a log line\n");
        } else {
            text.push_str(&format!("{},k,1\n", T0 + i));
        }
    }
    let log = write(&d, "b.csv", &text);
    let args = [
        log.to_str().unwrap(),
        "--format=csv",
        "--capacity-steps=2",
        "--rate-steps=2",
        "--max-rejected=1",
    ];
    let out = ok(&tune(&d, 1, &[&args[..], &["--max-bad=0.3"]].concat()));
    assert!(out.contains("10 lines, 3 bad"), "{out}");
    for n in [2, 5, 8] {
        assert!(
            out.contains(&format!("b.csv:{n}: expected 3 comma-separated")),
            "{out}"
        );
    }
    let err = failed(&tune(&d, 1, &[&args[..], &["--max-bad=0.2"]].concat()));
    assert!(
        err.contains("3 of 10 lines are bad (30%), more than --max-bad 20%"),
        "{err}"
    );
    assert!(
        err.contains("b.csv:2:") && err.contains("b.csv:8:"),
        "{err}"
    );
}

#[test]
fn empty_logs_invalid_grids_and_unmatched_classes_are_clear_errors() {
    let d = dir("errors");
    let empty = write(&d, "empty.log", "");
    let err = failed(&tune(&d, 1, &[empty.to_str().unwrap()]));
    assert!(err.contains("the log has no requests: 0 lines"), "{err}");

    let log = write(&d, "one.csv", &format!("{T0},k,1\n"));
    let err = failed(&tune(
        &d,
        1,
        &[
            log.to_str().unwrap(),
            "--format=csv",
            "--capacities=1000000000000..1000000000000",
            "--capacity-steps=1",
            "--rates=1e-9..1e-9",
            "--rate-steps=1",
        ],
    ));
    assert!(err.contains("no policy of the grid is valid"), "{err}");

    let clf = write(
        &d,
        "a.log",
        "10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a HTTP/1.1\" 200 1\n",
    );
    let err = failed(&tune(
        &d,
        1,
        &[clf.to_str().unwrap(), "--class=POST /exprot/*=5"],
    ));
    assert!(
        err.contains("no request matched any work class (POST /exprot/*=5)"),
        "{err}"
    );

    let err = failed(&tune(&d, 1, &[clf.to_str().unwrap(), "--format=json"]));
    assert!(
        err.contains("the log has no requests: 1 lines, 1 bad"),
        "{err}"
    );
    assert!(err.contains("a.log:1: not a JSON object"), "{err}");

    // The wrong format: the run stops after 1000 lines rather than read the whole log.
    let wrong = write(
        &d,
        "wrong.log",
        &"10.0.0.1 - - [x] \"GET / HTTP/1.1\" 200 1\n".repeat(1500),
    );
    let err = failed(&tune(&d, 1, &[wrong.to_str().unwrap(), "--format=csv"]));
    assert!(
        err.contains("none of the first 1000 lines is a request in the csv format"),
        "{err}"
    );

    let missing = d.join("missing.log");
    let err = failed(&tune(&d, 1, &[missing.to_str().unwrap()]));
    assert!(err.contains("cannot open"), "{err}");

    // No cell meets the rule: the files are written, and the run says so.
    let err = failed(&tune(
        &d,
        1,
        &[
            clf.to_str().unwrap(),
            "--objective=requests",
            "--max-rejected=0",
            "--capacities=1..1",
            "--capacity-steps=1",
            "--rates=1..1",
            "--rate-steps=1",
            "--default-cost=2",
        ],
    ));
    assert!(
        err.contains("no cell of the grid has requests rejected <= 0%"),
        "{err}"
    );
    assert_eq!(cells(&d).len(), 1);
}

#[test]
fn a_maximum_wait_reports_delay_percentiles() {
    let d = dir("wait");
    let mut log = String::new();
    for _ in 0..5 {
        log.push_str(&format!("{T0}.5,k,1\n"));
    }
    // Another key a second later (it waits for nothing): the log spans 1 s, enough to
    // judge B = 1 at r = 2/s (fill time 0.5 s).
    log.push_str(&format!("{}.5,other,1\n", T0 + 1));
    let log = write(&d, "w.csv", &log);
    let out = ok(&tune(
        &d,
        1,
        &[
            log.to_str().unwrap(),
            "--format=csv",
            "--capacities=1..1",
            "--capacity-steps=1",
            "--rates=2..2",
            "--rate-steps=1",
            "--max-wait=1200ms",
            "--objective=requests",
            "--max-rejected=1",
        ],
    ));
    // B = 1, r = 2/s: k waits 0, ~0.5 s, ~1 s; the other two would wait over 1.2 s.
    // With the other key's request, the waits are 0, 0, ~0.5 s, ~1 s.
    let row = &cells(&d)[0];
    assert_eq!(num(row, "rejected"), 2.0);
    assert_eq!(num(row, "delayed"), 2.0);
    let p90 = num(row, "delay_p90_ms");
    assert!((1000.0..=1002.0).contains(&p90), "{p90}");
    assert!(out.contains("max_reservation"), "{out}");
    assert!(out.contains("2 requests waited"), "{out}");
}

#[test]
fn the_heatmap_marks_the_recommended_cell() {
    let d = dir("svg");
    let log = write(&d, "busy.log", &busy_clf(2000));
    ok(&tune(
        &d,
        2,
        &[
            log.to_str().unwrap(),
            "--capacity-steps=5",
            "--rate-steps=5",
        ],
    ));
    let svg = std::fs::read_to_string(d.join("heat.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
    assert!(svg.contains("recommended"));
    assert!(svg.contains("refill rate r (tokens/s)"));
    // 25 cells.
    assert!(svg.matches("<rect").count() >= 25);
}

/// An Apache combined log as a busy server writes it: each line stamped with its
/// request's start time (whole seconds, a +0100 zone) but written when the request ends,
/// so a line is up to a minute earlier than lines before it; gzip-compressed.
fn apache_combined_gz(path: &Path, requests: u64) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // (end, start, client) in milliseconds: 20 requests a second on average.
    let mut rows: Vec<(u64, u64, u64)> = Vec::new();
    let mut t = 0;
    for _ in 0..requests {
        t += next() % 100;
        let took = match next() % 100 {
            0 => 10_000 + next() % 50_000, // up to a minute
            1..=5 => next() % 5000,
            _ => next() % 200,
        };
        // A few heavy clients, many light ones.
        let r = next();
        let client = (r % 500) * ((r >> 32) % 500) / 500;
        rows.push((t + took, t, client));
    }
    rows.sort();
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::fast(),
    );
    for (_, start, client) in rows {
        // 2023-11-14T09:00:00+01:00 is 1699948800 s after the epoch.
        let sec = start / 1000;
        let (h, m, s) = (9 + sec / 3600, sec / 60 % 60, sec % 60);
        writeln!(
            enc,
            "198.51.100.{client} - - [14/Nov/2023:{h:02}:{m:02}:{s:02} +0100] \"GET /api/items?page={} HTTP/1.1\" 200 {} \"https://example.com/\" \"Mozilla/5.0 (X11; Linux x86_64)\"",
            start % 7,
            start % 5000
        )
        .unwrap();
    }
    enc.finish().unwrap();
}

#[test]
fn a_real_apache_log_is_read_with_default_flags_and_the_recommendation_is_a_config_rule() {
    let d = dir("apache");
    let log = d.join("access.log.gz");
    apache_combined_gz(&log, 30_000);
    let out = Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .arg("tune")
        .arg(&log)
        .arg("--out")
        .arg(&d)
        .output()
        .unwrap();
    let stdout = ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Nothing is bad: every late line was within the default window.
    assert!(stdout.contains("30000 lines, 0 bad"), "{stdout}");
    assert!(stdout.contains("reordered: "), "{stdout}");
    assert!(
        stdout.contains("s earlier than a line before them"),
        "{stdout}"
    );
    assert!(stderr.contains("tune: 100% of the logs read"), "{stderr}");
    assert!(d.join("tune.csv").exists() && d.join("tune.svg").exists());
    // The recommendation as a configuration rule that validates and builds.
    let toml = &stdout[stdout.find("[[rule]]").expect("a rule")..];
    let toml = &toml[..toml.find("\nwrote").unwrap()];
    let config = tokengate_config::Config::from_toml(toml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.rules.len(), 1);
    assert_eq!(config.rules[0].kind, tokengate::scope::ScopeKind::Client);
    config.rule_set().unwrap().build().unwrap();
    assert!(!stdout.contains("not settled"), "{stdout}");
}

/// The recommended capacity and rate in a report.
fn recommended(out: &str) -> (f64, f64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("recommended: B = "))
        .unwrap_or_else(|| panic!("no recommendation:\n{out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[3].parse().unwrap(), words[7].parse().unwrap())
}

#[test]
fn a_recommendation_at_the_grids_edge_widens_the_grid_and_warns() {
    let d = dir("edge");
    // One request every 20 s from one client for 1980 s: B = 1 at the grid's lowest rate,
    // 0.1/s, refills between requests, so the rates are widened, down to 1/990 s, the
    // lowest at which the log can judge B = 1 (fill time at most half its span). There
    // a lower rate than 0.1/s meets the rule with a capacity the log can judge.
    let mut log = String::new();
    for i in 0..100 {
        log.push_str(&format!("{},client,1\n", T0 + 20 * i));
    }
    let sparse = write(&d, "sparse.csv", &log);
    let out = ok(&tune(&d, 2, &[sparse.to_str().unwrap(), "--format=csv"]));
    assert!(
        out.contains(
            "grid: the recommended rate was the grid's lowest, 0.1/s: rates widened to \
             0.00101..1000 /s and replayed"
        ),
        "{out}"
    );
    assert!(!out.contains("warning"), "{out}");
    let (b, r) = recommended(&out);
    assert!(r < 0.1 && b / r <= 990.0, "B = {b}, r = {r}\n{out}");
    // A grid given on the command line is kept, with the warning: the log can judge
    // rates below 20/s.
    let log = write(&d, "steady.csv", &steady_csv(1, 5, 60));
    let out = ok(&tune(
        &d,
        2,
        &[log.to_str().unwrap(), "--format=csv", "--rates=20..100"],
    ));
    assert!(!out.contains("widened"), "{out}");
    assert!(
        out.contains("warning: the recommended rate is the grid's lowest (20/s)"),
        "{out}"
    );
}

#[test]
fn a_log_whose_keys_fit_in_the_largest_burst_gets_a_rate_it_can_judge() {
    let d = dir("judge");
    // Three clients at 5 requests a second for a minute: 300 requests each, under the
    // grid's largest capacity, 1000. Every rate passes with a burst that holds a whole
    // key; the log can only tell rates whose bucket fills within half its 59.8 s.
    let log = write(&d, "steady.csv", &steady_csv(3, 5, 60));
    let out = ok(&tune(&d, 2, &[log.to_str().unwrap(), "--format=csv"]));
    let (b, r) = recommended(&out);
    let half_span = 59.8 / 2.0;
    assert!(
        b / r <= half_span,
        "B = {b}, r = {r} fills in {} s\n{out}",
        b / r
    );
    // Each key sends 300 requests in 59.8 s: B + r 59.8 >= 300 with B <= r 29.9 needs
    // r >= 3.34/s.
    assert!(r >= 3.3, "B = {b}, r = {r}\n{out}");
    assert!(!out.contains("widened"), "{out}");
    // The cells the log cannot judge are in the CSV, marked, among them cells that
    // reject nothing at lower rates.
    let rows = cells(&d);
    let unjudged: Vec<_> = rows.iter().filter(|c| c["judgeable"] == "false").collect();
    assert!(!unjudged.is_empty());
    for c in &unjudged {
        assert!(num(c, "fill_time_s") > half_span, "{c:?}");
    }
    assert!(
        unjudged
            .iter()
            .any(|c| num(c, "rate") < r && num(c, "rejected") == 0.0)
    );
    for c in rows.iter().filter(|c| c["judgeable"] == "true") {
        assert!(num(c, "fill_time_s") <= half_span, "{c:?}");
    }

    // With only rates too low for any cell the log can judge to meet the rule, the run
    // says so and names the nearest cells.
    let err = failed(&tune(
        &d,
        2,
        &[log.to_str().unwrap(), "--format=csv", "--rates=0.1..1"],
    ));
    assert!(err.contains("among those the log can judge"), "{err}");
    assert!(
        err.contains("the nearest cell the log can judge is B = "),
        "{err}"
    );
    assert!(err.contains("meets it but fills in"), "{err}");
}
