//! Ctrl-C and SIGTERM for a harness that must tear its cluster down in
//! order before it exits. Owns the process's SIGINT/SIGTERM handlers while
//! [`interrupted`] is awaited; never exits the process or touches a child.

/// Resolves on the first SIGINT or SIGTERM. When the handlers cannot be
/// installed it never resolves (the signal then ends the process as usual).
pub async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
