//! Instance processes for fleet tests: the test binary re-spawned to run one ignored
//! test (the child's entry point) with its settings in the environment. Each child prints
//! one line per event at once (a SIGKILL loses none it printed); the parent collects each
//! child's lines.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Starts one child per entry of `envs` running the ignored test `entry`, runs `faults`
/// with the children meanwhile, waits until each ends by itself (a straggler is killed
/// at `deadline_ns`, wall clock) and returns each child's stdout lines.
pub fn run(
    entry: &str,
    envs: &[Vec<(String, String)>],
    deadline_ns: u64,
    faults: impl FnOnce(&mut [Child]),
) -> Vec<Vec<String>> {
    let mut children: Vec<Child> = envs
        .iter()
        .map(|env| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    entry,
                    "--test-threads=1",
                    "--nocapture",
                    "--quiet",
                ])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let out = c.stdout.take().unwrap();
            std::thread::spawn(move || {
                BufReader::new(out)
                    .lines()
                    .map_while(Result::ok)
                    .collect::<Vec<String>>()
            })
        })
        .collect();
    faults(&mut children);
    for c in &mut children {
        for _ in 0..100_000 {
            if c.try_wait().unwrap().is_some() || super::wall_ns() > deadline_ns {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    readers.into_iter().map(|r| r.join().unwrap()).collect()
}

/// Admissions from children's lines `a <before ns> <after ns>`, per child.
pub fn admissions(lines: &[String]) -> Vec<(u64, u64)> {
    lines
        .iter()
        .filter_map(|l| {
            let mut f = l.split(' ');
            (f.next() == Some("a")).then(|| {
                (
                    f.next().unwrap().parse().unwrap(),
                    f.next().unwrap().parse().unwrap(),
                )
            })
        })
        .collect()
}

/// Sends `sig` (`-STOP`, `-CONT`) to `child`.
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} failed");
}

/// Sleeps until wall-clock `wall_ns`.
pub fn sleep_until(wall_ns: u64) {
    for _ in 0..100_000 {
        let now = super::wall_ns();
        if now >= wall_ns {
            return;
        }
        std::thread::sleep(Duration::from_nanos((wall_ns - now).min(1_000_000)));
    }
}
