//! `tokengate bench`, the README's first command, end to end on a short sweep: every
//! default engine measured in every regime it runs in, a table per regime printed, and the CSV
//! and SVG written under `--out`.

use std::path::Path;
use std::process::Command;

#[test]
fn the_readme_bench_command_measures_every_engine_and_writes_its_files() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-readme");
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .args([
            "bench",
            "--threads",
            "2",
            "--rounds",
            "1",
            "--duration",
            "2ms",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed: {stderr}\n{stdout}");

    let csv = std::fs::read_to_string(out.join("bench.csv")).expect("bench.csv under --out");
    let svg = std::fs::read_to_string(out.join("bench.svg")).expect("bench.svg under --out");
    assert!(
        svg.starts_with("<svg") || svg.contains("<svg"),
        "not an SVG: {}",
        &svg[..svg.len().min(80)]
    );
    for engine in [
        "tokengate",
        "tokengate-coarse",
        "tokengate-leased",
        "tokengate-leased-coarse",
        "governor",
        "mutex",
        "tokengate-keyed",
        "governor-keyed",
        "floor-keyed",
    ] {
        assert!(
            csv.lines().any(|l| l.split(',').any(|f| f == engine)),
            "no row for {engine} in bench.csv:\n{csv}"
        );
    }
    for regime in ["admit", "reject", "keyed"] {
        assert!(
            stdout.contains(&format!("{regime} ")),
            "no {regime} table printed:\n{stdout}"
        );
        assert!(
            csv.lines().any(|l| l.split(',').any(|f| f == regime)),
            "no {regime} rows in bench.csv:\n{csv}"
        );
    }
    // Every measured cell is a positive rate, at 1 and 2 threads.
    let rows = csv.lines().skip(1).filter(|l| !l.is_empty()).count();
    assert!(
        rows >= 2 * 9,
        "{rows} rows: expected every engine at 1 and 2 threads\n{csv}"
    );
}
