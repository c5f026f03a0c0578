//! `ringraft members`: lists the members, adds learners, promotes them to
//! voters, removes members; prints the membership after the change. It
//! changes the cluster only through the client API's membership calls.

use std::process::ExitCode;

use super::client_error;
use crate::args::MembersAction;

/// Runs one membership action and prints the members.
pub(crate) async fn run(action: MembersAction) -> ExitCode {
    let result = match action {
        MembersAction::List { endpoints } => match endpoints.query_client() {
            Ok(mut client) => client.members().await,
            Err(e) => Err(e),
        },
        MembersAction::Add {
            endpoints,
            id,
            addr,
        } => match endpoints.client() {
            Ok(mut client) => client.add_learner(id, addr).await,
            Err(e) => Err(e),
        },
        MembersAction::Promote { endpoints, ids } => match endpoints.client() {
            Ok(mut client) => client.promote(ids).await,
            Err(e) => Err(e),
        },
        MembersAction::Remove { endpoints, ids } => match endpoints.client() {
            Ok(mut client) => client.remove(ids).await,
            Err(e) => Err(e),
        },
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
