//! `ringraft status`: prints the view of the node reached (text or JSON).
//! A query only: it never changes the cluster.

use std::process::ExitCode;

use ringraft_client::proto::StatusResponse;

use super::client_error;
use super::members::print_members;
use crate::args::Endpoints;

/// Asks one node for its status and prints it.
pub(crate) async fn run(endpoints: Endpoints, json: bool) -> ExitCode {
    let mut client = match endpoints.query_client() {
        Ok(client) => client,
        Err(e) => return client_error(e),
    };
    match client.status().await {
        Ok(s) => {
            if json {
                print_json(&s);
            } else {
                print_text(&s);
            }
            ExitCode::SUCCESS
        }
        Err(e) => client_error(e),
    }
}

fn print_json(s: &StatusResponse) {
    let members: Vec<_> = s
        .members
        .iter()
        .map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter}))
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "id": s.id,
            "state": s.state,
            "leader_id": if s.leader_id == 0 { serde_json::Value::Null } else { s.leader_id.into() },
            "leader_addr": s.leader_addr,
            "term": s.term,
            "commit_index": s.commit_index,
            "applied_index": s.applied_index,
            "last_log_index": s.last_log_index,
            "members": members,
            "fabric": s.fabric,
            "durability": s.durability,
            "votes_blocked": s.votes_blocked,
            "first_index": s.first_index,
            "fence": {"term": s.fence_term, "leader": s.fence_leader},
        })
    );
}

fn print_text(s: &StatusResponse) {
    println!("node {} ({}), term {}", s.id, s.state, s.term);
    println!(
        "leader {}",
        if s.leader_id == 0 {
            "unknown".into()
        } else {
            format!("{} at {}", s.leader_id, s.leader_addr)
        }
    );
    println!(
        "commit {}, applied {}, last log {}, first index {}",
        s.commit_index, s.applied_index, s.last_log_index, s.first_index
    );
    println!(
        "ring fenced by {}",
        if s.fence_leader == 0 {
            "nobody yet".to_string()
        } else {
            format!("node {} in term {}", s.fence_leader, s.fence_term)
        }
    );
    println!(
        "fabric {}, durability {}{}",
        s.fabric,
        s.durability,
        if s.votes_blocked {
            ", votes blocked (log corrupt inside)"
        } else {
            ""
        }
    );
    print_members(&s.members);
}
