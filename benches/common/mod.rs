//! What the benches share: the counts they read from the environment.

/// The count in environment variable `name`, a whole number in `1..=max`, or `default()`
/// when it is not set. A bad value stops the run with a message rather than measuring
/// something else.
pub fn env_count(name: &str, max: usize, default: impl FnOnce() -> usize) -> usize {
    let value = match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => return default(),
        Ok(v) => v,
        Err(std::env::VarError::NotUnicode(v)) => v.to_string_lossy().into_owned(),
    };
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => n,
        _ => {
            eprintln!("error: {name} must be a whole number from 1 to {max}, got {value:?}");
            std::process::exit(2)
        }
    }
}

/// The largest thread count of a sweep: `TOKENGATE_THREADS` (1 to 1024, as `tokengate
/// bench --threads`), or every core.
#[allow(dead_code)] // not every bench sweeps threads
pub fn max_threads() -> usize {
    env_count("TOKENGATE_THREADS", 1024, || {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    })
}
