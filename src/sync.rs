//! The crate's one door to atomics: `core` normally, `loom` under `cfg(loom)`.
//!
//! Everything that touches shared state imports from here, so the same code is
//! model-checked by `loom-tests/` (the pattern tokio and crossbeam use). It also holds
//! the thread index that spreads threads over cache-padded cells.

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// One step of waiting for another thread to finish a few instructions (a live bucket's
/// switch): spin a while, then yield. Under loom, yield at once so that the model
/// schedules the other thread.
#[inline]
pub(crate) fn spin(spins: &mut u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if *spins < 64 {
            *spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// A keyed map's shard lock: crossbeam's `ShardedLock` (readers on different cores lock
/// different cache lines), or loom's `RwLock` so that loom schedules around it.
#[cfg(not(loom))]
pub(crate) use crossbeam_utils::sync::{
    ShardedLock as ShardLock, ShardedLockReadGuard as ShardReadGuard,
    ShardedLockWriteGuard as ShardWriteGuard,
};
#[cfg(loom)]
pub(crate) use loom::sync::{
    RwLock as ShardLock, RwLockReadGuard as ShardReadGuard, RwLockWriteGuard as ShardWriteGuard,
};

/// This thread's index for spreading threads over cache-padded cells (a leased bucket's
/// slots, the global scope's counter stripes; each masks it by its own count): assigned
/// round robin on the thread's first call, the same for the rest of its life.
///
/// Never panics: during thread-local teardown (a thread-local's destructor taking a
/// token or counting), or wherever the thread-local cannot be reached, it is 0. Any index
/// is correct for every caller; the index only spreads contention.
#[inline]
pub(crate) fn thread_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A plain std counter even under loom (loom's atomics cannot be in a `static`): it
    // only spreads threads, and the loom models choose slots explicitly.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX
        .try_with(|cell| {
            let index = cell.get();
            if index != usize::MAX {
                return index;
            }
            let index = NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
            cell.set(index);
            index
        })
        .unwrap_or(0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::thread_index;

    #[test]
    fn a_thread_keeps_its_index_and_threads_get_distinct_ones() {
        let mine = thread_index();
        assert_eq!(thread_index(), mine);
        let other = std::thread::spawn(thread_index).join().unwrap();
        assert_ne!(other, mine);
    }
}
