//! A list of at most `N` copyable values on the stack, written only as far as it is
//! filled: what a request pays is listed without zeroing room for everything it might.

use std::mem::MaybeUninit;

/// Up to `N` values of `T`, the first `len` of them written.
pub(super) struct Inline<T: Copy, const N: usize> {
    items: [MaybeUninit<T>; N],
    len: usize,
}

impl<T: Copy, const N: usize> Inline<T, N> {
    /// An empty list (nothing written).
    #[inline(always)]
    pub(super) fn new() -> Self {
        Inline {
            items: [const { MaybeUninit::uninit() }; N],
            len: 0,
        }
    }

    /// Appends `value`.
    ///
    /// # Panics
    ///
    /// When the list holds `N` values already.
    #[inline(always)]
    pub(super) fn push(&mut self, value: T) {
        self.items[self.len] = MaybeUninit::new(value);
        self.len += 1;
    }

    /// The values pushed, in order.
    #[inline(always)]
    pub(super) fn as_slice(&self) -> &[T] {
        // SAFETY: the first `len` items were written by `push` (and `len <= N`, which
        // `push`'s bounds check keeps); `MaybeUninit<T>` has `T`'s layout.
        unsafe { std::slice::from_raw_parts(self.items.as_ptr().cast::<T>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::Inline;

    #[test]
    fn holds_what_was_pushed_in_order() {
        let mut list = Inline::<(u8, u64), 4>::new();
        assert!(list.as_slice().is_empty());
        list.push((1, 10));
        list.push((2, 20));
        assert_eq!(list.as_slice(), &[(1, 10), (2, 20)]);
    }

    #[test]
    #[should_panic]
    fn refuses_a_value_past_its_room() {
        let mut list = Inline::<u8, 1>::new();
        list.push(1);
        list.push(2);
    }
}
