//! Resource limits of the process.

/// Raises the soft limit on open files to the hard limit; returns both when it moved.
///
/// Every parked long-poll holds a socket, and the soft limit (1,024 under systemd and in many
/// shells) would refuse connections long before memory runs out. The hard limit is what the
/// operator allows; a server that expects many clients takes it, as Synapse does.
pub fn raise_open_files_limit() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return None;
        }
        let soft = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        (libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0).then_some((soft, limit.rlim_max))
    }
}
