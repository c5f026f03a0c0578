//! `ringraft append`: appends the arguments, or one record per stdin line,
//! and prints each record's index, one per line. It never sends a request
//! larger than the client API accepts: a stdin line too long for any
//! append is refused before it is read in full.

use std::io::{BufRead, Read, Write};
use std::process::ExitCode;

use ringraft_client::client::{
    MAX_APPEND_RECORDS_BYTES, MAX_MESSAGE_BYTES, MAX_RECORD_BYTES, append_record_bytes,
};
use ringraft_client::{Client, ClientError};

use super::{client_error, fail};
use crate::args::Endpoints;

/// Appends `data` (none: stdin, one record per line).
pub(crate) async fn run(endpoints: Endpoints, data: Vec<String>) -> ExitCode {
    let mut client = endpoints.client();
    let mut out = std::io::stdout().lock();
    if !data.is_empty() {
        let records = data.into_iter().map(String::into_bytes).collect();
        return match client.append(records).await {
            Ok(indexes) => {
                for i in indexes {
                    let _ = writeln!(out, "{i}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => client_error(e),
        };
    }
    from_stdin(&mut client, &mut out).await
}

/// One record per stdin line, in batches of what is available, each small
/// enough for one request.
async fn from_stdin(client: &mut Client, out: &mut impl Write) -> ExitCode {
    let mut stdin = std::io::stdin().lock();
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    for line_no in 1.. {
        let next = next_record(&mut stdin, line_no);
        // The batch goes before a line that would not fit in its
        // request, at the end, and before failing on a bad line.
        let send = match &next {
            Ok(Some(line)) => {
                batch_bytes + append_record_bytes(line.len()) > MAX_APPEND_RECORDS_BYTES
            }
            Ok(None) | Err(_) => true,
        };
        if send && !batch.is_empty() {
            let batch = std::mem::take(&mut batch);
            if let Err(e) = append_printing(client, batch, out).await {
                return client_error(e);
            }
            batch_bytes = 0;
        }
        match next {
            Ok(Some(line)) => {
                batch_bytes += append_record_bytes(line.len());
                batch.push(line);
            }
            Ok(None) => break,
            Err(e) => return fail(e),
        }
        if batch.len() == 256 {
            let batch = std::mem::take(&mut batch);
            if let Err(e) = append_printing(client, batch, out).await {
                return client_error(e);
            }
            batch_bytes = 0;
        }
    }
    ExitCode::SUCCESS
}

/// Appends `batch` and prints each record's index, one per line.
async fn append_printing(
    client: &mut Client,
    batch: Vec<Vec<u8>>,
    out: &mut impl Write,
) -> Result<(), ClientError> {
    for index in client.append(batch).await? {
        let _ = writeln!(out, "{index}");
    }
    Ok(())
}

/// The next line of `input` (line `line_no`) without its line end, or `None`
/// at the end. A line too long for any Append request is refused once its
/// first [`MAX_RECORD_BYTES`] + 2 bytes are read, without reading the rest.
fn next_record(input: &mut impl BufRead, line_no: u64) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    let read = input
        .by_ref()
        .take(MAX_RECORD_BYTES as u64 + 2)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    if line.len() > MAX_RECORD_BYTES {
        return Err(format!(
            "stdin line {line_no} is longer than {MAX_RECORD_BYTES} bytes, the largest record an append can carry within the client API's message limit of {MAX_MESSAGE_BYTES} bytes; no node accepts it"
        ));
    }
    Ok(Some(line))
}
