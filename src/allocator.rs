//! How the process's memory allocator holds on to memory.

/// Allocations at least this big get their own mapping, returned to the system when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 1 << 20;

/// Makes glibc malloc give memory back rather than keep it per thread. Call it first thing in
/// `main`, before any thread starts (glibc fixes its arena limit when a thread first needs an
/// arena).
///
/// - Large blocks: by default glibc raises its mmap threshold (up to 32 MiB) whenever a mapped
///   block is freed; from then on blocks that size come from heaps it seldom returns.
///   Measured with myelin-bench: registering 2,000 users (a 19 MiB argon2 buffer each, two at
///   a time) left the server at 112 MiB even with `malloc_trim` after every hash, and the runs
///   peaked at 131-160 MiB. With a fixed 1 MiB threshold they peaked at 55-61 MiB, at the
///   same speed.
/// - One arena: glibc gives threads their own heaps (arenas), and each keeps what it freed
///   for its own reuse. An initial sync over 500 rooms needs about 100 MiB of small blocks
///   while it is built; served by the two HTTP workers in turn, it left 202 MiB behind, and
///   with one arena 110 MiB, at the same speed.
///
/// An operator's `MALLOC_MMAP_THRESHOLD_` or `MALLOC_ARENA_MAX` is left alone.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            }
        }
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, 1);
            }
        }
    }
}
