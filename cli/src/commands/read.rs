//! `ringraft read`: prints committed records (raw or JSON), once or
//! following new ones across node failures. It only reads: it never
//! appends, and it stops quietly when its reader goes away.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use ringraft_client::{Client, ClientError, Consistency};

use super::{client_error, fail};
use crate::args::ReadArgs;

/// Reads (or follows) the range the flags give.
pub(crate) async fn run(args: ReadArgs) -> ExitCode {
    let ReadArgs {
        endpoints,
        from,
        to,
        follow,
        format,
        consistency,
    } = args;
    let json = match format.as_str() {
        "raw" => false,
        "json" => true,
        other => return fail(format!("--format {other}: expected raw or json")),
    };
    let consistency = match parse_consistency(&consistency) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if follow && let Some(to) = to.filter(|to| *to < from) {
        // Nothing can ever arrive: refuse instead of waiting forever
        // (the server refuses an empty range of a plain read itself).
        return fail(format!("range {from}..={to} is empty"));
    }
    let client = if follow {
        endpoints.client()
    } else {
        endpoints.query_client()
    };
    let mut client = match client {
        Ok(client) => client,
        Err(e) => return client_error(e),
    };
    if follow {
        return follow_from(client, from, to, json).await;
    }
    let mut out = std::io::stdout().lock();
    match client.read(from, to.unwrap_or(0), consistency).await {
        Ok(records) => {
            for r in &records {
                if print_record(&mut out, r, json).is_err() {
                    return ExitCode::SUCCESS;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => client_error(e),
    }
}

/// Prints the records from `from` on (up to `to`) as they commit, following
/// from another node when one goes away.
async fn follow_from(mut client: Client, from: u64, to: Option<u64>, json: bool) -> ExitCode {
    let mut out = std::io::stdout().lock();
    let mut next = from;
    loop {
        let mut stream = match client.follow(next).await {
            Ok(s) => s,
            Err(e) => return client_error(e),
        };
        loop {
            let r = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                // The same request would fail again anywhere.
                Err(status) if !ringraft_client::client::retryable(&status) => {
                    return client_error(ClientError::Refused(status));
                }
                Err(_) => break,
            };
            if to.is_some_and(|t| r.index > t) {
                return ExitCode::SUCCESS;
            }
            next = r.index + 1;
            if print_record(&mut out, &r, json).is_err() || out.flush().is_err() {
                return ExitCode::SUCCESS;
            }
        }
        // The node went away: follow from another one.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn parse_consistency(s: &str) -> Result<Consistency, String> {
    match s {
        "linearizable" => Ok(Consistency::Linearizable),
        "lease" => Ok(Consistency::Lease),
        "stale" => Ok(Consistency::Stale),
        other => Err(format!(
            "--consistency {other}: expected linearizable, lease or stale"
        )),
    }
}

fn print_record(
    out: &mut impl Write,
    r: &ringraft_client::proto::Record,
    json: bool,
) -> std::io::Result<()> {
    if json {
        let data = match std::str::from_utf8(&r.data) {
            Ok(s) => serde_json::Value::String(s.to_string()),
            Err(_) => serde_json::Value::Array(r.data.iter().map(|b| (*b).into()).collect()),
        };
        writeln!(
            out,
            "{}",
            serde_json::json!({"index": r.index, "term": r.term, "data": data})
        )
    } else {
        out.write_all(&r.data)?;
        out.write_all(b"\n")
    }
}
