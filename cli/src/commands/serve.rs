//! `ringraft serve`'s start-up: resolves the configuration, sets up
//! logging and runs the daemon. It owns no daemon logic (that is
//! `daemon/`) and never prints anything but the one error line.

use std::process::ExitCode;

use super::fail;
use crate::daemon::config::{DEV_SECRET, ServeArgs};

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only on a terminal: a log file keeps plain text, which
        // the lab's and the operators' greps (`peer=<ip>:`) rely on.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Runs a node until a termination signal.
pub(crate) async fn run(args: ServeArgs) -> ExitCode {
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    init_logging(config.json_logs);
    if config.secret == DEV_SECRET {
        tracing::warn!(
            "no --secret-file: using the built-in development secret; do not do this in production"
        );
    }
    match crate::daemon::serve::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
