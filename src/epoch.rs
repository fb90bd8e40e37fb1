//! The chain of a reconfigurable limiter's epochs: the one place that publishes a
//! replacement, reads the current epoch, waits for a successor, walks the chain and
//! frees what a replacement retired. Every raw pointer to an epoch lives here.
//!
//! A limiter keeps its current configuration (an *epoch*: a policy and the words decided
//! on with it) behind one [`AtomicPtr`]. An operation loads it once and decides on that
//! epoch alone; a reconfiguration seals the old epoch's words (its own protocol, in each
//! limiter), builds the successor and publishes it here. Two kinds of chain:
//!
//! * [`Chain<T, Kept>`]: every epoch stays until the chain is dropped, each linked to the
//!   one it replaced and to its successor. For limiters whose old epochs are still
//!   referenced after the operation that read them returns (a scoped limiter's
//!   reservations name the generation they paid on). [`current`](Chain::current) is then
//!   a plain load.
//! * [`Chain<T, Freed>`]: a replaced epoch is *retired* and freed once no operation can
//!   still hold it. Operations read the current epoch through a [`Pinned`] guard; a
//!   retired epoch is freed after every pin that may have loaded it has ended.
//!
//! # Reclamation: per-thread pin records and an asymmetric fence
//!
//! Each thread that pins owns a record (registered once, reused after the thread exits,
//! never freed) holding one word: the depth of its nested pins (low 16 bits) and how many
//! times its outermost pin ended (the rest). A pin loads it and stores `depth + 1`,
//! then only a compiler fence before the load of the current epoch; ending it stores the
//! depth less one (counting an end when it falls to zero). Both stores are release
//! stores (plain stores on x86-64): a retirement that sees a later pin's word
//! synchronizes with the end of every earlier one (the loom model `epoch` finds the free
//! racing the read when the pin's store is relaxed). No read-modify-write, no shared
//! cache line, no fence instruction.
//!
//! The count of ended pins is what a retirement waits on, and only an *outermost* end
//! may move it: pins nest (one limiter's operation inside another's, a guard the caller
//! holds), and a count of every end would let an inner pin begun after the retirement
//! stand for an outer one still held. So ending a pin is a load, a test of the depth and
//! a store (on x86-64 the test is a conditional move: no branch), beginning one a load,
//! an add and a store (one `inc` of the word in memory on x86-64).
//!
//! On the hot paths, [`Chain::try_pin`] pins without the call that registers a thread's
//! first pin (`None` then: the operation starts again out of line), and the operation
//! hands its [`Pinned`] guard by value to the out-of-line call that finishes a decision
//! the inline path cannot make, which ends it there: nothing but the return follows such
//! a call, so no value of the pin lives across it.
//!
//! A retirement happens after the successor is published. The retiring thread issues the
//! heavy side of the asymmetric fence, `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
//! (Linux; every running thread of the process executes a full barrier), then reads every
//! record. For a pin, either its store was visible to that read (the retired epoch waits
//! for that thread's outermost pin to end: its count of ended pins changes), or its load
//! of the current epoch came after the barrier and found the successor. A retired epoch is
//! freed by a later retirement (or the chain's drop) that sees every pin it waited for
//! ended: reconfigurations never wait, and a pin held across a reconfiguration on the
//! same thread delays nothing but the freeing.
//!
//! Where the fence is not available (another system, a kernel without it) pins pay a
//! real `SeqCst` fence instead (other systems), or retired epochs are kept until the
//! chain is dropped (a Linux kernel that refuses the call). Under `cfg(loom)` both sides
//! use `SeqCst` fences, which the model checks; `loom-tests/tests/epoch.rs` checks that a
//! reader racing a retirement never reads a freed epoch, and catches a retirement that
//! frees at once.

use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr;

use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Mutex, Ordering};

/// An epoch and its links. `value` comes first, so that a `&T` handed out by a chain is
/// also the address of its node.
#[repr(C)]
struct Node<T> {
    value: T,
    /// 0 for the chain's first epoch, one more per replacement.
    number: u64,
    /// [`Kept`]: the node this one replaced (owned: freed with the chain), or null.
    prev: *mut Node<T>,
}

/// A chain whose epochs stay until it is dropped.
#[derive(Debug)]
pub(crate) enum Kept {}

/// A chain that frees each replaced epoch once no pin can still hold it.
#[derive(Debug)]
pub(crate) enum Freed {}

/// A limiter's epochs: the current one, published with release ordering, and (`M`)
/// either every one it replaced ([`Kept`]) or those retired and not yet freed
/// ([`Freed`]).
pub(crate) struct Chain<T, M> {
    current: AtomicPtr<Node<T>>,
    /// [`Freed`]: how many replaced epochs stay linked behind the current one (`prev`)
    /// before they are retired ([`Chain::freeing_keeping`]); every one for [`Kept`].
    window: u64,
    /// [`Freed`]: epochs replaced and not yet freed, each with the pins it waits for.
    retired: Mutex<Vec<Retired<T>>>,
    mode: PhantomData<M>,
}

// SAFETY: a chain owns its nodes (each reachable once: from `current`, a successor's
// `prev`, or `retired`) and shares them only as `&T` (so `T: Sync`), dropping them on
// whichever thread frees them (so `T: Send`).
unsafe impl<T: Send + Sync, M> Send for Chain<T, M> {}
// SAFETY: as above; the links are atomics, written before publication, or behind the
// `retired` lock.
unsafe impl<T: Send + Sync, M> Sync for Chain<T, M> {}

impl<T, M> Chain<T, M> {
    fn with_first(first: T, window: u64) -> Chain<T, M> {
        Chain {
            window,
            current: AtomicPtr::new(Box::into_raw(Box::new(Node {
                value: first,
                number: 0,
                prev: ptr::null_mut(),
            }))),
            retired: Mutex::new(Vec::new()),
            mode: PhantomData,
        }
    }

    /// How many `prev` links behind the current epoch are kept: the window (one fewer
    /// under the mutant `EPOCH_WINDOW_SHORT`, whose walks still go the whole window).
    fn links(&self) -> u64 {
        if mutant!(EPOCH_WINDOW_SHORT) {
            return self.window.saturating_sub(1);
        }
        self.window
    }

    /// The current node. Not dereferenced here: a [`Freed`] chain only dereferences it
    /// under a pin.
    #[inline(always)]
    fn load(&self) -> *mut Node<T> {
        // The acquire load pairs with the release store that published the node.
        self.current.load(Ordering::Acquire)
    }

    /// Whether `epoch` (an epoch of this chain) is the current one.
    #[inline(always)]
    pub(crate) fn is_current(&self, epoch: &T) -> bool {
        ptr::eq(self.load().cast_const().cast::<T>(), epoch)
    }

    /// Waits while `epoch` is current and `replacing(epoch)` holds: a reconfiguration
    /// that sealed it publishes its successor a few instructions later (or, should it
    /// unwind, undoes the seal, and `replacing` turns false: the caller retries on it).
    #[cold]
    #[inline(never)]
    pub(crate) fn await_successor(&self, epoch: &T, replacing: impl Fn(&T) -> bool) {
        let mut spins = 0u32;
        while self.is_current(epoch) && replacing(epoch) {
            crate::sync::spin(&mut spins);
        }
    }

    /// Links `next` after `old` (the current node: callers serialize, a sealed epoch is
    /// replaced once) and publishes it. Allocates nothing: a switch publishes a few
    /// instructions after its seal.
    fn link(&self, old: &T, next: Next<T>) -> *mut Node<T> {
        let old = ptr::from_ref(old).cast::<Node<T>>().cast_mut();
        // A node of this chain: what makes the casts here and in `Successor` sound.
        assert_eq!(old, self.load(), "only the current epoch is replaced");
        let node = next.into_raw();
        // SAFETY: `old` is a node of this chain (the caller holds it: `&T` from it),
        // live while that reference is; `node` is the `Next`'s own, not shared yet (a
        // `Held` that named it reads only its value, after the publication).
        unsafe {
            (*node).number = (*old).number + 1;
            if self.window > 0 {
                (*node).prev = old;
            }
        }
        self.current.store(node, Ordering::Release);
        old
    }

    /// How many epochs the chain has had, the current one included.
    pub(crate) fn count(&self) -> u64 {
        let _pin = Pin::new();
        // SAFETY: the current node, pinned.
        unsafe { (*self.load()).number + 1 }
    }
}

impl<T> Chain<T, Kept> {
    /// A chain whose first epoch is `first`, keeping every epoch until it is dropped.
    pub(crate) fn new(first: T) -> Chain<T, Kept> {
        Chain::with_first(first, u64::MAX)
    }

    /// The current epoch.
    #[inline(always)]
    pub(crate) fn current(&self) -> &T {
        // SAFETY: always a live node (from `Box::into_raw`), freed only by `Drop`, which
        // `&self` excludes.
        unsafe { &(*self.load()).value }
    }

    /// Publishes `next` after the current epoch (callers serialize): named before by
    /// [`Next::held`]. Allocates nothing.
    pub(crate) fn push(&self, next: Next<T>) {
        self.link(self.current(), next);
    }

    /// The first epoch, newest first, for which `pred` holds, held.
    pub(crate) fn find(&self, pred: impl Fn(&T) -> bool) -> Option<Held<T>> {
        let mut p = self.load().cast_const();
        // SAFETY: as in `iter`.
        while let Some(node) = unsafe { p.as_ref() } {
            if pred(&node.value) {
                return Some(Held { node: p });
            }
            p = node.prev;
        }
        None
    }

    /// The epochs, newest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        let mut p = self.load().cast_const();
        std::iter::from_fn(move || {
            // SAFETY: every node of a kept chain lives until it is dropped; `prev` is
            // null or such a node.
            let node = unsafe { p.as_ref() }?;
            p = node.prev;
            Some(&node.value)
        })
    }
}

impl<T> Chain<T, Freed> {
    /// A chain whose first epoch is `first`, freeing each epoch once it is replaced and
    /// no pin holds it.
    pub(crate) fn freeing(first: T) -> Chain<T, Freed> {
        Chain::with_first(first, 0)
    }

    /// A chain whose first epoch is `first`, keeping the `window` latest replaced epochs
    /// linked behind the current one ([`kept`](Chain::kept)) and freeing each older one
    /// once no pin holds it: the chain holds at most `window + 1` epochs, and those
    /// retired and still pinned.
    pub(crate) fn freeing_keeping(first: T, window: u64) -> Chain<T, Freed> {
        Chain::with_first(first, window)
    }

    /// The current epoch, held until the guard is dropped (pins nest, and may end in any
    /// order).
    #[inline(always)]
    pub(crate) fn pin(&self) -> Pinned<'_, T> {
        self.pinned(Pin::new())
    }

    /// [`pin`](Chain::pin), or `None` (having done nothing) when the calling thread has
    /// not pinned yet: for a hot path that starts again on a cold path of its own (which
    /// calls [`pin`](Chain::pin), registering the thread), so that no call is made on
    /// the way to the decision.
    #[inline(always)]
    pub(crate) fn try_pin(&self) -> Option<Pinned<'_, T>> {
        Some(self.pinned(Pin::try_new()?))
    }

    #[inline(always)]
    fn pinned(&self, pin: Pin) -> Pinned<'_, T> {
        let node = self.load();
        // SAFETY: the current node was live when loaded after the pin: a retirement
        // frees it only after this pin ends (module docs).
        Pinned {
            node: unsafe { &*node },
            _pin: pin,
        }
    }

    /// The current epoch, while the caller holds `held` (an epoch of this chain: a pin
    /// is held for as long as it is borrowed). Pins are the thread's, not an epoch's:
    /// whatever is loaded while one is held stays until it ends.
    #[inline(always)]
    pub(crate) fn current_while<'a>(&'a self, held: &'a T) -> &'a T {
        let _ = held;
        // SAFETY: the thread holds a pin while `held` is borrowed (a `&T` of a freed
        // chain comes from a `Pinned`, or from this method under one), so the node
        // loaded now is not freed before that pin ends.
        unsafe { &(*self.load()).value }
    }

    /// Publishes `next` as the successor of `old` (the current epoch, pinned by the
    /// caller) and retires `old`: freed by a later retirement, or the chain's drop, once
    /// no pin can still hold it.
    pub(crate) fn replace(&self, old: &Pinned<'_, T>, next: Next<T>) {
        // A windowed chain keeps its replaced epochs linked: `replace_linked`.
        debug_assert_eq!(self.window, 0, "replace on a chain with a window");
        let old = self.link(old, next);
        self.retire(old);
    }

    /// [`replace`](Chain::replace), recording `next` as `old`'s [`Successor`], and
    /// retiring the epoch that falls out of the window ([`freeing_keeping`]
    /// (Chain::freeing_keeping)): `old` itself for a window of 0, else the one `window`
    /// replacements older, which stays linked to its successor until it is freed (a
    /// successor link is only followed from an epoch held under a pin, which its
    /// retirement waits for).
    ///
    /// The retirement (a `membarrier`, a walk of the pin records, a lock, the frees)
    /// is made when the guard returned is dropped: a caller holding what requests wait
    /// on lets it go first.
    pub(crate) fn replace_linked(&self, old: &Pinned<'_, T>, next: Next<T>) -> Retiring<'_, T>
    where
        T: Linked,
    {
        let replaced = self.link(old, next);
        let node = self.load();
        old.successor().0.store(node, Ordering::Release);
        // The epoch `window + 1` replacements behind the new one, if the chain has had
        // it: every link walked is of an epoch in the window (not retired: callers
        // serialize, and only this retires).
        let mut out = replaced;
        for _ in 0..self.links() {
            // SAFETY: `out` is in the window (see above), live until retired here.
            out = unsafe { (*out).prev };
            if out.is_null() {
                break;
            }
        }
        // The last kept epoch's link to it is left as it is: no walk reaches it
        // (`kept` stops `window` epochs behind the epoch it starts from).
        Retiring {
            chain: self,
            node: out,
        }
    }

    /// The epoch `held` (the current one when pinned) and the replaced epochs still
    /// linked behind it, newest first: at most the chain's window of them. Each
    /// replaced one was retired, if at all, after `held` was loaded, so the retirement
    /// waits for the pin it was loaded under.
    pub(crate) fn kept<'a>(&'a self, held: &'a Pinned<'_, T>) -> impl Iterator<Item = &'a T> {
        let mut p = ptr::from_ref(held.node).cast_mut();
        let oldest = held.node.number.saturating_sub(self.window);
        std::iter::from_fn(move || {
            // SAFETY: `p` is null or an epoch no older than `window` replacements behind
            // `held`, the current epoch when loaded under the pin `held` keeps: not
            // retired before that load (a replacement retires only epochs outside the
            // window), so not freed before the pin ends.
            let node = unsafe { p.as_ref() }?;
            p = if node.number > oldest {
                node.prev
            } else {
                ptr::null_mut()
            };
            Some(&node.value)
        })
    }

    /// Adds `old`, replaced, to the retired epochs, and frees every retired epoch no pin
    /// can still hold.
    fn retire(&self, old: *mut Node<T>) {
        let waits = pins_to_wait_for();
        let mut ready = Vec::new();
        {
            let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            retired.push(Retired { node: old, waits });
            retired.retain(|r| {
                let keep = !r.ready();
                if !keep {
                    ready.push(r.node);
                }
                keep
            });
        }
        for node in ready {
            // SAFETY: replaced (unreachable from `current`), taken out of `retired` once,
            // and every pin that might have loaded it has ended.
            drop(unsafe { Box::from_raw(node) });
        }
    }

    /// `part` of the current epoch, held while the guard lives.
    pub(crate) fn project<U>(&self, part: fn(&T) -> &U) -> Projected<'_, T, U> {
        Projected {
            pinned: self.pin(),
            part,
        }
    }

    /// Epochs replaced and not yet freed (for tests and diagnostics).
    pub(crate) fn retired(&self) -> usize {
        self.retired.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The current epoch, unpinned: for a caller that excludes its retirement by other
    /// means (a keyed map's shard lock, which every switch of the map write-locks before
    /// it replaces the epoch).
    ///
    /// # Safety
    ///
    /// From before the call until the caller last uses the result, no
    /// [`replace`](Chain::replace) of this chain runs: the caller holds something that
    /// every replacement waits for before it publishes, and that orders the caller's
    /// reads before it.
    #[inline(always)]
    pub(crate) unsafe fn current_excluded(&self) -> &T {
        // SAFETY: the node loaded is current and stays current until the caller's
        // exclusion ends (the caller's contract): it is retired, and so freed, only by a
        // replacement after that.
        unsafe { &(*self.load()).value }
    }
}

impl<T, M> Drop for Chain<T, M> {
    fn drop(&mut self) {
        // A loom model that failed: leave the nodes (their drops would re-enter the model
        // while it unwinds).
        #[cfg(loom)]
        if std::thread::panicking() {
            return;
        }
        // `&mut self`: no pin of this chain and no `&T` from it is left.
        let retired = std::mem::take(self.retired.get_mut().unwrap_or_else(|e| e.into_inner()));
        for r in retired {
            // SAFETY: each retired node came from `Box::into_raw`, retired once.
            drop(unsafe { Box::from_raw(r.node) });
        }
        let mut p = self.load();
        let mut links = self.links();
        while !p.is_null() {
            // SAFETY: each node came from `Box::into_raw` and is reachable once, from
            // `current` or from its successor's `prev`, within the window (the epoch a
            // window's last `prev` names was retired, and freed above).
            let node = unsafe { Box::from_raw(p) };
            p = if links == 0 {
                ptr::null_mut()
            } else {
                node.prev
            };
            links = links.saturating_sub(1);
        }
    }
}

/// An epoch of a [`Freed`] chain that [`Chain::replace_linked`] took out of the window,
/// retired when the guard is dropped (on every path, unwinding included), or nothing.
#[must_use = "the epoch is retired when the guard is dropped"]
pub(crate) struct Retiring<'a, T> {
    chain: &'a Chain<T, Freed>,
    /// Null when no epoch left the window.
    node: *mut Node<T>,
}

impl<T> Drop for Retiring<'_, T> {
    fn drop(&mut self) {
        if !self.node.is_null() {
            // Unlinked from every walk (out of the window), and retired once: here.
            self.chain.retire(self.node);
        }
    }
}

/// An epoch of a [`Kept`] chain, named by its address: for a value that lives
/// elsewhere (in an epoch of another chain) but borrows from this one, read back
/// ([`get`](Held::get)) for as long as the chain that made it lives.
pub(crate) struct Held<T> {
    node: *const Node<T>,
}

impl<T> Held<T> {
    /// The epoch, for `'a`.
    ///
    /// # Safety
    ///
    /// The epoch lives during `'a`: the chain that holds it ([`Chain::find`], or
    /// [`Chain::push`] of the [`Next`] that named it) is not dropped then (a kept
    /// chain's epochs live until it is), or, not pushed yet, its [`Next`] is not.
    #[inline(always)]
    pub(crate) unsafe fn get<'a>(self) -> &'a T {
        // SAFETY: a live node for `'a` (the caller's contract).
        unsafe { &(*self.node).value }
    }
}

impl<T> Clone for Held<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Held<T> {}

// SAFETY: a `Held` is an address; it shares the node only as `&T` (`T: Sync`).
unsafe impl<T: Sync> Send for Held<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Held<T> {}

/// An epoch of a chain that knows its successor ([`Chain::replace_linked`]).
///
/// # Safety
///
/// `successor` returns a field of `self` (so that the successor it is set to lives as
/// long as the chain that holds `self`).
pub(crate) unsafe trait Linked: Sized {
    fn successor(&self) -> &Successor<Self>;
}

/// The epoch that replaced one of a chain, set when it is published
/// ([`Chain::replace_linked`]).
pub(crate) struct Successor<T>(AtomicPtr<Node<T>>);

impl<T> Successor<T> {
    pub(crate) fn new() -> Successor<T> {
        Successor(AtomicPtr::new(ptr::null_mut()))
    }

    /// The successor, once published.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        // SAFETY: set only by `replace_linked` on the current node of a chain (the one
        // that holds `self`: `Linked`'s contract), to the node it published. A freed
        // chain's `&T` is borrowed under a
        // pin taken before an epoch was loaded while current, and is that epoch or one
        // reached from it by `kept` and successor links: every epoch so reached was
        // either in the window behind it or published after it when it was loaded, so
        // its retirement, if any, came after the pin began and waits for it to end.
        unsafe { self.0.load(Ordering::Acquire).as_ref() }.map(|n| &n.value)
    }
}

/// An epoch allocated ahead of its publication ([`Chain::replace`],
/// [`Chain::replace_linked`], [`Chain::push`]), so that a switch allocates nothing
/// between its seal and the publication. Its node is allocated once and handed to the
/// chain as the same pointer (never moved as a `Box`), so that the address
/// [`held`](Next::held) names before the push stays valid after it.
pub(crate) struct Next<T>(ptr::NonNull<Node<T>>);

impl<T> Next<T> {
    /// The epoch as a kept chain holds it once [`pushed`](Chain::push): its node is
    /// allocated now and stays where it is.
    pub(crate) fn held(&self) -> Held<T> {
        Held {
            node: self.0.as_ptr().cast_const(),
        }
    }

    pub(crate) fn new(value: T) -> Next<T> {
        Next(ptr::NonNull::from(Box::leak(Box::new(Node {
            value,
            number: 0,
            prev: ptr::null_mut(),
        }))))
    }

    /// The node, for the chain that takes it (which frees it from then on).
    fn into_raw(self) -> *mut Node<T> {
        let node = self.0.as_ptr();
        std::mem::forget(self);
        node
    }
}

impl<T> Drop for Next<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` as a `Box`, and not handed to a chain (`into_raw`
        // forgets the `Next`).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

impl<T> Deref for Next<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the `Next` owns its node until it is handed to a chain.
        unsafe { &self.0.as_ref().value }
    }
}

impl<T> std::ops::DerefMut for Next<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, borrowed mutably through the `Next`.
        unsafe { &mut self.0.as_mut().value }
    }
}

/// The current epoch of a [`Chain<T, Freed>`], held while the guard lives.
pub(crate) struct Pinned<'a, T> {
    node: &'a Node<T>,
    _pin: Pin,
}

impl<T> Pinned<'_, T> {
    /// The epoch's number: 0 for the chain's first, one more per replacement (an
    /// identity no later epoch of the chain shares, unlike its address).
    #[inline(always)]
    pub(crate) fn number(&self) -> u64 {
        self.node.number
    }
}

impl<T> Deref for Pinned<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.node.value
    }
}

/// A part of a pinned epoch ([`Chain::project`]).
pub(crate) struct Projected<'a, T, U> {
    pinned: Pinned<'a, T>,
    part: fn(&T) -> &U,
}

impl<T, U> Deref for Projected<'_, T, U> {
    type Target = U;

    fn deref(&self) -> &U {
        (self.part)(&self.pinned)
    }
}

/// A retired node and the pins it waits for.
struct Retired<T> {
    node: *mut Node<T>,
    waits: Vec<Wait>,
}

impl<T> Retired<T> {
    /// Whether every pin it waited for has ended.
    fn ready(&self) -> bool {
        self.waits.iter().all(Wait::ended)
    }
}

// --- Pin records ---------------------------------------------------------------------

/// A record's depth of nested pins.
const DEPTH: u64 = (1 << 16) - 1;
/// One outermost pin ended.
const ENDED: u64 = 1 << 16;

/// One thread's pins: `ended << 16 | depth`, written only by the thread that owns it
/// (`ended` counts the times its depth fell to zero).
struct Record {
    word: AtomicU64,
    /// Non-zero while a thread owns it.
    owned: AtomicUsize,
    /// The record registered before this one (the registry is a push-only list).
    next: *const Record,
}

/// A pin another thread held when an epoch was retired: the record, and how many of its
/// outermost pins had ended then.
struct Wait {
    record: &'static Record,
    ended: u64,
}

impl Wait {
    fn ended(&self) -> bool {
        // Acquire: pairs with the release store that ended the pin, so every read of the
        // epoch under it happens before the free.
        let mut ended = self.record.word.load(Ordering::Acquire) >> 16 != self.ended;
        if mutant!(EPOCH_FREES_EARLY) {
            ended = true;
        }
        ended
    }
}

/// The pin of the calling thread on every [`Freed`] chain: see the module docs.
struct Pin {
    record: &'static Record,
}

impl Pin {
    #[inline(always)]
    fn new() -> Pin {
        let (record, word) = record();
        Pin::on(record, word)
    }

    /// A pin on the calling thread's record, `None` when it has none yet.
    #[inline(always)]
    fn try_new() -> Option<Pin> {
        let (record, word) = self::thread::registered()?;
        Some(Pin::on(record, word))
    }

    #[inline(always)]
    fn on(record: &'static Record, word: u64) -> Pin {
        debug_assert!(word & DEPTH < DEPTH, "pins nested too deep");
        let word = word + 1;
        set_word(word);
        // Release (a plain store on x86-64): a retirement that reads this word (or a later
        // one) to see that an earlier pin ended then also synchronizes with that end.
        record.word.store(word, Ordering::Release);
        reader_fence();
        Pin { record }
    }
}

impl Drop for Pin {
    /// One pin fewer; the last one counts an end. Pins may end in any order.
    #[inline(always)]
    fn drop(&mut self) {
        let word = self::thread::word(self.record) - 1;
        let word = if word & DEPTH == 0 {
            word + ENDED
        } else {
            word
        };
        set_word(word);
        // Release: every read of a pinned epoch happens before this store.
        self.record.word.store(word, Ordering::Release);
    }
}

/// The pins held now by any thread (the retiring thread's own included), after the
/// heavy side of the fence: what a node retired just before must wait for.
fn pins_to_wait_for() -> Vec<Wait> {
    if !writer_fence() {
        // No asymmetric fence: a pin that never ends, so the node waits for the drop.
        return vec![Wait {
            record: never_ended(),
            ended: 0,
        }];
    }
    let mut waits = Vec::new();
    let mut p = registry().load(Ordering::Acquire).cast_const();
    // SAFETY: records are never freed; `next` is written before a record is pushed.
    while let Some(record) = unsafe { p.as_ref() } {
        let word = record.word.load(Ordering::Acquire);
        if word & DEPTH != 0 {
            waits.push(Wait {
                record,
                ended: word >> 16,
            });
        }
        p = record.next;
    }
    waits
}

/// A record no thread owns, whose pin count never changes.
fn never_ended() -> &'static Record {
    Box::leak(Box::new(Record {
        word: AtomicU64::new(1),
        owned: AtomicUsize::new(1),
        next: ptr::null(),
    }))
}

/// Registers the calling thread: a record released by a thread that exited, or a new
/// one.
#[cold]
#[inline(never)]
fn register() -> &'static Record {
    let head = registry();
    let mut p = head.load(Ordering::Acquire).cast_const();
    // SAFETY: records are never freed.
    while let Some(record) = unsafe { p.as_ref() } {
        if record
            .owned
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return record;
        }
        p = record.next;
    }
    let record = Box::leak(Box::new(Record {
        word: AtomicU64::new(0),
        owned: AtomicUsize::new(1),
        next: ptr::null(),
    }));
    let mut first = head.load(Ordering::Acquire);
    loop {
        record.next = first;
        match head.compare_exchange_weak(
            first,
            ptr::from_mut(record),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return record,
            Err(now) => first = now,
        }
    }
}

#[cfg(not(loom))]
mod thread {
    use std::cell::Cell;
    use std::ptr;

    use super::{AtomicPtr, Ordering, Record};

    static REGISTRY: AtomicPtr<Record> = AtomicPtr::new(ptr::null_mut());

    thread_local! {
        /// The calling thread's record, null until it first pins.
        static RECORD: Cell<*const Record> = const { Cell::new(ptr::null()) };
        /// Releases the record when the thread exits.
        static OWNER: Owner = const { Owner };
    }

    struct Owner;

    impl Drop for Owner {
        fn drop(&mut self) {
            let record = RECORD.with(|r| r.replace(ptr::null()));
            // SAFETY: records are never freed.
            if let Some(record) = unsafe { record.as_ref() } {
                record.owned.store(0, Ordering::Release);
            }
        }
    }

    pub(super) fn registry() -> &'static AtomicPtr<Record> {
        &REGISTRY
    }

    /// The calling thread's record and its word.
    #[inline(always)]
    pub(super) fn record() -> (&'static Record, u64) {
        let record = RECORD.with(Cell::get);
        // SAFETY: records are never freed.
        match unsafe { record.as_ref() } {
            // Only this thread writes it.
            Some(record) => (record, record.word.load(Ordering::Relaxed)),
            None => {
                let record = super::register();
                let word = record.word.load(Ordering::Relaxed);
                RECORD.with(|r| r.set(record));
                // A thread whose thread-locals are being destroyed keeps its record.
                let _ = OWNER.try_with(|_| ());
                (record, word)
            }
        }
    }

    /// The calling thread's record and its word, `None` before its first pin.
    #[inline(always)]
    pub(super) fn registered() -> Option<(&'static Record, u64)> {
        // SAFETY: records are never freed.
        let record = unsafe { RECORD.with(Cell::get).as_ref() }?;
        // Only this thread writes it.
        Some((record, record.word.load(Ordering::Relaxed)))
    }

    /// The word of `record`, the calling thread's.
    #[inline(always)]
    pub(super) fn word(record: &Record) -> u64 {
        record.word.load(Ordering::Relaxed)
    }

    /// Nothing to mirror: the record's word is read where it is stored.
    #[inline(always)]
    pub(super) fn set_word(_: u64) {}
}

#[cfg(loom)]
mod thread {
    use std::cell::Cell;
    use std::ptr;

    use super::{AtomicPtr, Ordering, Record};

    loom::lazy_static! {
        static ref REGISTRY: AtomicPtr<Record> = AtomicPtr::new(ptr::null_mut());
    }

    loom::thread_local! {
        static RECORD: Cell<*const Record> = Cell::new(ptr::null());
        static WORD: Cell<u64> = Cell::new(0);
    }

    pub(super) fn registry() -> &'static AtomicPtr<Record> {
        &REGISTRY
    }

    pub(super) fn record() -> (&'static Record, u64) {
        let record = RECORD.with(Cell::get);
        // SAFETY: records are never freed (a model's records are leaked).
        match unsafe { record.as_ref() } {
            Some(record) => (record, WORD.with(Cell::get)),
            None => {
                let record = super::register();
                let word = record.word.load(Ordering::Relaxed);
                RECORD.with(|r| r.set(record));
                WORD.with(|w| w.set(word));
                (record, word)
            }
        }
    }

    pub(super) fn registered() -> Option<(&'static Record, u64)> {
        // SAFETY: records are never freed (a model's records are leaked).
        let record = unsafe { RECORD.with(Cell::get).as_ref() }?;
        Some((record, WORD.with(Cell::get)))
    }

    /// The word of the calling thread's record, from the thread-local mirror (one
    /// operation fewer for the model to interleave).
    pub(super) fn word(_: &Record) -> u64 {
        WORD.with(Cell::get)
    }

    pub(super) fn set_word(word: u64) {
        WORD.with(|w| w.set(word));
    }
}

use thread::{record, registry, set_word};

/// The light side of the fence, after a pin's store and before its load of the current
/// epoch.
#[inline(always)]
fn reader_fence() {
    #[cfg(all(target_os = "linux", not(loom)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(any(loom, not(target_os = "linux")))]
    crate::sync::fence(Ordering::SeqCst);
}

/// The heavy side: after a retirement's publication, before it reads the records.
/// `false` when retired epochs must be kept (no asymmetric fence).
fn writer_fence() -> bool {
    #[cfg(all(target_os = "linux", not(loom)))]
    {
        membarrier::expedited()
    }
    #[cfg(any(loom, not(target_os = "linux")))]
    {
        crate::sync::fence(Ordering::SeqCst);
        true
    }
}

#[cfg(all(target_os = "linux", not(loom)))]
mod membarrier {
    use std::sync::OnceLock;

    const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    fn call(cmd: libc::c_int) -> bool {
        // SAFETY: `membarrier(cmd, flags = 0, cpu_id = 0)` reads and writes no memory of
        // ours.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
    }

    /// A full barrier on every running thread of the process; `false` when the kernel
    /// does not offer it.
    pub(super) fn expedited() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| call(REGISTER_PRIVATE_EXPEDITED)) && call(PRIVATE_EXPEDITED)
    }
}

/// The freeing chain as the loom model `epoch` drives it.
#[cfg(loom)]
pub mod model {
    use super::{Chain, Freed};

    /// A [`Chain<T, Freed>`] with one operation per step of the model.
    pub struct FreedChain<T>(Chain<T, Freed>);

    impl<T> std::fmt::Debug for FreedChain<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("FreedChain")
        }
    }

    impl<T: Send + Sync> FreedChain<T> {
        /// A chain whose first epoch is `first`.
        pub fn new(first: T) -> FreedChain<T> {
            FreedChain(Chain::freeing(first))
        }

        /// `f` on the current epoch, pinned.
        pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
            f(&self.0.pin())
        }

        /// Replaces the current epoch with `next`, retiring it.
        pub fn replace(&self, next: T) {
            let old = self.0.pin();
            self.0.replace(&old, super::Next::new(next));
        }

        /// Epochs retired and not yet freed.
        pub fn retired(&self) -> usize {
            self.0.retired()
        }
    }
}
