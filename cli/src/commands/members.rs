//! `ringraft members`: lists the members, adds learners, promotes them to
//! voters, removes members; prints the membership after the change. It
//! changes the cluster only through the client API's membership calls.

use std::process::ExitCode;

use super::client_error;
use crate::args::MembersAction;

/// Runs one membership action and prints the members.
pub(crate) async fn run(action: MembersAction) -> ExitCode {
    let result = match action {
        MembersAction::List { endpoints } => endpoints.query_client().members().await,
        MembersAction::Add {
            endpoints,
            id,
            addr,
        } => endpoints.client().add_learner(id, addr).await,
        MembersAction::Promote { endpoints, ids } => endpoints.client().promote(ids).await,
        MembersAction::Remove { endpoints, ids } => endpoints.client().remove(ids).await,
    };
    match result {
        Ok(members) => {
            print_members(&members);
            ExitCode::SUCCESS
        }
        Err(e) => client_error(e),
    }
}

/// One line per member: id, address, voter or learner.
pub(crate) fn print_members(members: &[ringraft_client::proto::Member]) {
    for m in members {
        println!(
            "{} {} {}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" }
        );
    }
}
