//! Reader indices: each thread's exclusive index among the live threads, naming the
//! record it announces its reader sections in (see [`super::table`]).
//!
//! Taken from a process-wide allocator on a thread's first reader section (the lowest
//! index free), given back by a thread-local destructor when the thread exits. Unlike
//! [`crate::sync::thread_index`], no two live threads hold the same index: a record is
//! written by one thread only.

use std::sync::{Mutex, PoisonError};

/// Free indices below `next`, and the next index never handed out.
#[derive(Default)]
struct Allocator {
    free: Vec<usize>,
    next: usize,
}

impl Allocator {
    fn take(&mut self) -> usize {
        match self.free.iter().enumerate().min_by_key(|&(_, &i)| i) {
            Some((at, _)) => self.free.swap_remove(at),
            None => {
                self.next += 1;
                self.next - 1
            }
        }
    }

    #[cfg_attr(loom, allow(dead_code))]
    fn give_back(&mut self, index: usize) {
        self.free.push(index);
    }
}

// A plain std mutex even under loom: no loom operation runs while it is held, so loom
// never preempts inside it. Under loom the allocator is made afresh for each execution.
#[cfg(not(loom))]
static ALLOCATOR: Mutex<Allocator> = Mutex::new(Allocator {
    free: Vec::new(),
    next: 0,
});

#[cfg(loom)]
loom::lazy_static! {
    static ref ALLOCATOR: Mutex<Allocator> = Mutex::new(Allocator::default());
}

fn allocator() -> std::sync::MutexGuard<'static, Allocator> {
    // The allocator's state is consistent between any two of its statements.
    ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner)
}

const NONE: usize = usize::MAX;

#[cfg(not(loom))]
std::thread_local! {
    /// This thread's index (`NONE` until taken): no destructor of its own, so that
    /// reading it is one load, valid even during thread-local teardown.
    static INDEX: std::cell::Cell<usize> = const { std::cell::Cell::new(NONE) };
    /// Gives the index back when the thread exits (registered on the first section).
    static OWNER: Owner = const { Owner };
}

/// Owns a thread's index: its destructor clears the index (later sections of the
/// exiting thread take the read lock) and gives it back.
#[cfg(not(loom))]
struct Owner;

#[cfg(not(loom))]
impl Drop for Owner {
    fn drop(&mut self) {
        let index = INDEX.replace(NONE);
        if index != NONE {
            allocator().give_back(index);
        }
    }
}

/// This thread's reader index, exclusive among live threads; `usize::MAX` where the
/// thread cannot hold one (during thread-local teardown), which no table has a record
/// for.
#[cfg(not(loom))]
#[inline]
pub(crate) fn index() -> usize {
    match INDEX.get() {
        NONE => first_index(),
        index => index,
    }
}

/// A thread's first [`index`]: taken from the allocator (out of line: once per thread),
/// once the destructor that gives it back is registered; `NONE` when it can no longer be
/// (the thread's thread-locals are being destroyed).
#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn first_index() -> usize {
    if OWNER.try_with(|_| ()).is_err() {
        return NONE;
    }
    let index = allocator().take();
    INDEX.set(index);
    index
}

/// Under loom: one thread-local, made afresh for each execution, as is the allocator
/// (which may already be gone when the model's main thread drops its locals: nothing is
/// given back).
#[cfg(loom)]
struct Index(std::cell::Cell<usize>);

#[cfg(loom)]
loom::thread_local! {
    static INDEX: Index = Index(std::cell::Cell::new(NONE));
}

#[cfg(loom)]
pub(crate) fn index() -> usize {
    INDEX
        .try_with(|cell| {
            let index = cell.0.get();
            if index != NONE {
                return index;
            }
            let index = allocator().take();
            cell.0.set(index);
            index
        })
        .unwrap_or(NONE)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Allocator, index};
    use std::sync::mpsc::channel;

    #[test]
    fn live_threads_hold_distinct_indices() {
        let mine = index();
        assert_eq!(index(), mine);
        let (ready_tx, ready_rx) = channel();
        let (go_tx, go_rx) = channel::<()>();
        let other = std::thread::spawn(move || {
            ready_tx.send(index()).unwrap();
            go_rx.recv().unwrap();
        });
        let theirs = ready_rx.recv().unwrap();
        let third = std::thread::spawn(index).join().unwrap();
        go_tx.send(()).unwrap();
        other.join().unwrap();
        assert_ne!(theirs, mine);
        assert_ne!(third, mine);
        assert_ne!(third, theirs);
    }

    #[test]
    fn the_lowest_free_index_is_taken_first() {
        let mut a = Allocator::default();
        assert_eq!([a.take(), a.take(), a.take(), a.take()], [0, 1, 2, 3]);
        a.give_back(2);
        a.give_back(1);
        assert_eq!([a.take(), a.take(), a.take()], [1, 2, 4]);
    }
}
