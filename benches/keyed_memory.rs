//! Heap bytes per key of a keyed limiter holding 1,000,000 `u64` keys, counted by a
//! global allocator that tracks live bytes: governor's keyed limiter (default dashmap
//! store) now, tokengate's keyed limiter beside it once it exists (ENGINE SLOT below).
//!
//! ```text
//! cargo bench --bench keyed_memory             # about 2 s
//! cargo bench --bench keyed_memory -- 100000   # another key count
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use governor::{Quota, RateLimiter};

/// The system allocator, counting live heap bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter only
// observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Live heap bytes added by `build`, per key, with what it built kept alive meanwhile.
fn bytes_per_key<T>(keys: u64, build: impl FnOnce(u64) -> T) -> f64 {
    let before = LIVE.load(Ordering::Relaxed);
    let held = build(keys);
    let after = LIVE.load(Ordering::Relaxed);
    drop(held);
    (after - before) as f64 / keys as f64
}

fn main() {
    let keys: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map_or(1_000_000, |a| {
            a.parse().expect("the key count is a whole number")
        });
    let quota = Quota::per_second(1000.try_into().unwrap()).allow_burst(100.try_into().unwrap());

    let governor = bytes_per_key(keys, |n| {
        let limiter = RateLimiter::keyed(quota);
        for key in 0..n {
            let _ = limiter.check_key(&key);
        }
        limiter
    });
    println!("governor keyed (dashmap)  {keys} keys: {governor:6.1} bytes per key");
    // ENGINE SLOT: tokengate's keyed limiter, filled with the same keys and the regime's
    // policy (B = 100, r = 1000/s), measured with `bytes_per_key` the same way.
}
