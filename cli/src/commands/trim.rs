//! `ringraft trim`: trims the log below an index on every node and prints
//! the first index kept. It asks the cluster to trim (a log entry); it
//! never deletes files itself.

use std::process::ExitCode;

use super::client_error;
use crate::args::Endpoints;

/// Trims below `before`.
pub(crate) async fn run(endpoints: Endpoints, before: u64) -> ExitCode {
    let mut client = match endpoints.client() {
        Ok(client) => client,
        Err(e) => return client_error(e),
    };
    match client.trim(before).await {
        Ok(first) => {
            println!("first index {first}");
            ExitCode::SUCCESS
        }
        Err(e) => client_error(e),
    }
}
