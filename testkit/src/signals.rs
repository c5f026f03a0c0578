//! Ctrl-C and SIGTERM for a harness that must tear its cluster down in
//! order before it exits. Owns the process's SIGINT/SIGTERM handlers from
//! the call of [`interrupted`] on; never exits the process or touches a
//! child.

use std::future::Future;

/// Installs the handlers now and resolves on the first SIGINT or SIGTERM
/// after. When they cannot be installed it never resolves (the signal then
/// ends the process as usual). Call it inside a tokio runtime.
///
/// The handlers are installed by the call, not when the future is first
/// polled: a harness that starts its children, says so, and only then
/// polls this future (`tokio::select!` polls its branches in any order)
/// was killed by a Ctrl-C that arrived in between (the demo's test, under
/// load).
pub fn interrupted() -> impl Future<Output = ()> + Send {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        match handlers {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    /// A SIGINT between the call and the first poll is caught, not fatal
    /// (with handlers installed at the first poll, it ended this process).
    #[tokio::test]
    async fn a_signal_before_the_first_poll_is_caught() {
        let interrupted = super::interrupted();
        // SAFETY: raise(2) with a valid signal number.
        assert_eq!(unsafe { libc::raise(libc::SIGINT) }, 0);
        tokio::time::timeout(std::time::Duration::from_secs(60), interrupted)
            .await
            .expect("the SIGINT raised before the first poll is seen");
    }
}
