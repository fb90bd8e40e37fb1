//! The crate's one door to atomics: `core` normally, `loom` under `cfg(loom)`.
//!
//! Everything that touches shared state imports from here, so the same code is
//! model-checked by `loom-tests/` (the pattern tokio and crossbeam use). It also holds
//! the thread index that spreads threads over cache-padded cells.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};

/// A cell whose contents are shared by a protocol of the caller's (a keyed shard, read
/// in a reader section or under its lock): `std`'s `UnsafeCell` behind raw pointers, or
/// loom's, whose pointers report to the model every access that no synchronization
/// orders against a conflicting one.
#[cfg(loom)]
#[allow(clippy::unsafe_removed_from_name)] // one name for both builds' cells
pub(crate) use loom::cell::{ConstPtr, MutPtr, UnsafeCell as RawCell};

/// See the loom build's `RawCell`.
#[cfg(not(loom))]
pub(crate) struct RawCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> RawCell<T> {
    pub(crate) fn new(value: T) -> RawCell<T> {
        RawCell(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn get(&self) -> ConstPtr<T> {
        ConstPtr(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn get_mut(&self) -> MutPtr<T> {
        MutPtr(self.0.get())
    }
}

/// A shared pointer into a [`RawCell`].
#[cfg(not(loom))]
pub(crate) struct ConstPtr<T>(*const T);

#[cfg(not(loom))]
impl<T> ConstPtr<T> {
    /// # Safety
    ///
    /// No `&mut` to the contents may exist while the returned reference lives.
    #[inline(always)]
    pub(crate) unsafe fn deref(&self) -> &T {
        // SAFETY: the pointer is the cell's, valid while the cell lives (the borrow of
        // the cell this pointer was made from); exclusion is the caller's contract.
        unsafe { &*self.0 }
    }
}

/// A shared reference through an exclusive pointer (for a `Deref` of a guard that
/// holds one).
///
/// # Safety
///
/// As [`MutPtr::deref`]: no `&mut` to the contents may exist while the result lives.
#[cfg(not(loom))]
#[inline(always)]
pub(crate) unsafe fn shared<T>(p: &MutPtr<T>) -> &T {
    // SAFETY: the pointer is valid while the cell lives; exclusion is the caller's.
    unsafe { &*p.0 }
}

/// See the other build's `shared`.
///
/// # Safety
///
/// As [`MutPtr::deref`].
#[cfg(loom)]
pub(crate) unsafe fn shared<T>(p: &MutPtr<T>) -> &T {
    // SAFETY: the caller's contract; loom checks the access.
    unsafe { p.deref() }
}

/// An exclusive pointer into a [`RawCell`].
#[cfg(not(loom))]
pub(crate) struct MutPtr<T>(*mut T);

#[cfg(not(loom))]
impl<T> MutPtr<T> {
    /// # Safety
    ///
    /// No other reference to the contents may exist while the returned one lives.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn deref(&self) -> &mut T {
        // SAFETY: as `ConstPtr::deref`; exclusivity is the caller's contract.
        unsafe { &mut *self.0 }
    }
}

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

/// Lets other threads run while this one waits: `std`'s yield, or loom's, which tells
/// the model that this thread spins (a plain yield under loom leaves it exploring the
/// spinning thread's loads without end).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
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

/// Under loom, a cell each access to an epoch reads and its drop writes.
#[cfg(loom)]
pub(crate) struct Probe(loom::cell::UnsafeCell<u64>);

// SAFETY: shared, the cell is only read; its one write is the drop's (`&mut`), which loom
// checks against every read.
#[cfg(loom)]
unsafe impl Sync for Probe {}

#[cfg(loom)]
impl Probe {
    pub(crate) fn new() -> Probe {
        Probe(loom::cell::UnsafeCell::new(0))
    }

    pub(crate) fn read(&self) {
        // SAFETY: only the drop writes the cell; loom checks that it happens after.
        let freed = self.0.with(|p| unsafe { *p });
        assert_eq!(freed, 0, "read a freed epoch");
    }
}

#[cfg(loom)]
impl Drop for Probe {
    fn drop(&mut self) {
        // SAFETY: `&mut`: loom reports a write that no synchronization orders after a
        // read.
        self.0.with_mut(|p| unsafe { *p = 1 });
    }
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
