//! A cache hint shared by the lease table and the timer queue. Its own module so that
//! neither of them imports the other.

/// Asks the CPU to start loading the cache line holding `x`. Only a hint: it cannot fault and
/// nothing depends on it, so on other architectures it is a no-op.
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    safe_arch::prefetch_t0(x);
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = x;
}
