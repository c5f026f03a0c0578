//! `ringraft transfer`: asks the leader to hand leadership to a node. It
//! only asks; it never forces an election itself.

use std::process::ExitCode;

use super::client_error;
use crate::args::Endpoints;

/// Asks for node `to` to lead.
pub(crate) async fn run(endpoints: Endpoints, to: u64) -> ExitCode {
    let mut client = match endpoints.client() {
        Ok(client) => client,
        Err(e) => return client_error(e),
    };
    match client.transfer_leader(to).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => client_error(e),
    }
}
