//! [`QuantaClock`]: quanta's calibrated counter, read inline where it is the TSC.

use super::Clock;

/// The default clock: quanta's, reading the CPU's time-stamp counter where it is invariant
/// and scaling it to nanoseconds with a multiply and a shift; the OS monotonic clock
/// elsewhere.
///
/// The first clock in a process calibrates the counter (quanta does this once, in up to
/// about 200 ms); later clocks are free to create.
///
/// On x86-64, where quanta reads the counter, this clock reads it itself with an inlined
/// `rdtsc` (the instruction quanta's `Clock::raw` runs, behind a call) and scales it with
/// one multiply by quanta's own calibration, brought to a 64-bit fraction: the same
/// readings, bit for bit (checked when the clock is made), without a function call or a
/// variable shift on the decision path (measured: BENCHMARKS.md, "The clocks read
/// inline").
///
/// ```
/// use tokengate::{Clock, QuantaClock};
/// let clock = QuantaClock::new();
/// let a = clock.now_nanos();
/// let b = clock.now_nanos();
/// assert!(b >= a);
/// ```
#[derive(Clone, Debug)]
pub struct QuantaClock {
    inner: ::quanta::Clock,
    /// Nanoseconds per counter tick as a 64-bit fraction (`nanos = raw * f / 2^64`), when
    /// the counter is read inline; 0 when readings go through quanta's `Clock::raw`.
    inline_scale: u64,
}

impl QuantaClock {
    /// A clock on quanta's calibrated counter.
    pub fn new() -> QuantaClock {
        let inner = ::quanta::Clock::new();
        let inline_scale = counter::inline_scale(&inner);
        QuantaClock {
            inner,
            inline_scale,
        }
    }

    /// Whether readings come from the counter read inline (x86-64, where quanta reads
    /// the time-stamp counter) rather than through quanta's `Clock::raw`. Either way the
    /// readings are the same.
    pub fn reads_counter_inline(&self) -> bool {
        self.inline_scale != 0
    }

    /// The reading through quanta's own calls, as a clock not read inline takes it: out
    /// of line, so that the inline reading stays small enough to inline everywhere.
    #[inline(never)]
    fn quanta_nanos(&self) -> u64 {
        self.inner.delta_as_nanos(0, self.inner.raw())
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        QuantaClock::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        match self.now_inline() {
            Some(now) => now,
            None => self.quanta_nanos(),
        }
    }

    /// The counter read inline, where it is; `None` where readings go through quanta's
    /// calls.
    #[inline]
    fn now_inline(&self) -> Option<u64> {
        (self.inline_scale != 0).then(|| counter::scaled(counter::read(), self.inline_scale))
    }

    /// An invariant counter (or the OS monotonic clock) never moves back; what cores
    /// disagree by is far below the race tolerance
    /// ([`TOLERANCE_NANOS`](crate::state::TOLERANCE_NANOS)).
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// The time-stamp counter read inline, where quanta reads it.
mod counter {
    /// `raw * scale / 2^64`: nanoseconds from a counter reading.
    #[inline(always)]
    pub(super) fn scaled(raw: u64, scale: u64) -> u64 {
        ((u128::from(raw) * u128::from(scale)) >> 64) as u64
    }

    /// The scale that gives `clock`'s readings from the counter read inline, or 0 when
    /// its raw readings may not be the counter or its scaling has no such fraction.
    ///
    /// The counter: the CPU has the invariant counter and `rdtscp` (what quanta requires
    /// before it reads the counter), and three raw readings each fall between two counter
    /// reads taken around it (a reading of the OS clock, nanoseconds since boot, does
    /// not: the counter runs at the CPU's base frequency from reset).
    ///
    /// The scale: quanta scales a raw reading `x` as `x * m >> s` (`m` below `2^(s+1)`
    /// for a counter of at least 0.5 GHz). At `x = 2^63` that is `m * 2^(63-s)`, so twice
    /// it is `m * 2^(64-s)` exactly, and `x * that >> 64` is quanta's reading bit for bit;
    /// it is checked on readings across the whole range, and any difference gives 0.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub(super) fn inline_scale(clock: &::quanta::Clock) -> u64 {
        let is_counter = (0..3).all(|_| {
            let before = read();
            let raw = clock.raw();
            let after = read();
            before <= raw && raw <= after
        });
        if !(cpu_has_counter() && is_counter) {
            return 0;
        }
        let half = clock.delta_as_nanos(0, 1 << 63);
        let Some(scale) = half.checked_mul(2) else {
            return 0;
        };
        let now = read();
        let probes = [
            1,
            1_000,
            1 << 32,
            now,
            now.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            1 << 62,
            u64::MAX / 3,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX,
        ];
        // A scale of 0 passes only if quanta's is 0 too, and means "not inline" anyway.
        if probes
            .iter()
            .any(|&x| scaled(x, scale) != clock.delta_as_nanos(0, x))
        {
            return 0;
        }
        scale
    }

    /// Whether the CPU has the invariant counter and `rdtscp`: what quanta requires
    /// before it reads the counter.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub(super) fn cpu_has_counter() -> bool {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 gives the highest extended leaf; 0x8000_0001 EDX bit 27 is
        // rdtscp, 0x8000_0007 EDX bit 8 the invariant counter.
        __cpuid(0x8000_0000).eax >= 0x8000_0007
            && __cpuid(0x8000_0001).edx & (1 << 27) != 0
            && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    pub(super) fn inline_scale(_: &::quanta::Clock) -> u64 {
        0
    }

    /// The time-stamp counter (read only where `inline_scale` is not 0).
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    #[inline(always)]
    pub(super) fn read() -> u64 {
        // SAFETY: `rdtsc` exists on every x86-64 CPU and reads a register; it touches no
        // memory.
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    #[inline(always)]
    pub(super) fn read() -> u64 {
        0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The inline counter reads what quanta's calls read: every reading lies between two
    /// of quanta's taken around it (a wrong scale, or a reading of another source, is
    /// out of order at once).
    #[test]
    fn the_inline_reading_is_quantas() {
        let clock = QuantaClock::new();
        for _ in 0..10_000 {
            let (a, b, c) = (
                clock.quanta_nanos(),
                clock.now_nanos(),
                clock.quanta_nanos(),
            );
            assert!(a <= b && b <= c, "{a} {b} {c}");
        }
    }

    /// Where the CPU has what quanta reads the counter with, the counter is read inline,
    /// and its scaling gives quanta's nanoseconds bit for bit across the whole range.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    fn the_counter_is_read_inline_where_quanta_reads_it() {
        let clock = QuantaClock::new();
        let has_counter = counter::cpu_has_counter();
        assert_eq!(clock.reads_counter_inline(), has_counter);
        // A reading is inline exactly where the counter is, and is then quanta's.
        assert_eq!(clock.now_inline().is_some(), has_counter);
        if let Some(b) = clock.now_inline() {
            let (a, c) = (clock.quanta_nanos(), clock.quanta_nanos());
            let (b2, c2) = (clock.now_inline().unwrap(), clock.quanta_nanos());
            assert!(
                b <= a && a <= c && c <= b2 && b2 <= c2,
                "{b} {a} {c} {b2} {c2}"
            );
        }
        if !has_counter {
            return;
        }
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for shift in 0..64 {
            for _ in 0..1_000 {
                // xorshift: readings of every magnitude.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let raw = x >> shift;
                assert_eq!(
                    counter::scaled(raw, clock.inline_scale),
                    clock.inner.delta_as_nanos(0, raw),
                    "raw {raw}"
                );
            }
        }
    }
}
