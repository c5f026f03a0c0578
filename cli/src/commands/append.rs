//! `ringraft append`: appends the arguments, or one record per stdin line,
//! and prints each record's index, one per line. It never sends a request
//! larger than the client API accepts: a stdin line too long for any
//! append is refused before it is read in full.

use std::io::{BufRead, Read, Write};
use std::process::ExitCode;

use ringraft_client::Client;
use ringraft_client::client::{
    MAX_APPEND_RECORDS_BYTES, MAX_MESSAGE_BYTES, MAX_RECORD_BYTES, append_record_bytes,
};

use super::{client_error, fail};
use crate::args::Endpoints;

/// Appends `data` (none: stdin, one record per line).
pub(crate) async fn run(endpoints: Endpoints, data: Vec<String>) -> ExitCode {
    let mut client = match endpoints.client() {
        Ok(client) => client,
        Err(e) => return client_error(e),
    };
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

/// Bytes of stdin read at a time: a batch ends where what was read ends.
const READ_BUFFER: usize = 1 << 20;
/// Batches read ahead of the appends, at most.
const BATCHES_AHEAD: usize = 16;
/// Bytes of records read ahead of the appends, at most (one batch may take
/// more, alone). With the client's
/// [`PIPELINE_BYTES`](ringraft_client::client::PIPELINE_BYTES) in flight,
/// this bounds the memory the command takes.
const BYTES_AHEAD: usize = 16 << 20;
/// Records per Append request at most.
const BATCH_RECORDS: usize = 256;

/// A batch read ahead, holding its share of [`BYTES_AHEAD`].
type BatchAhead = (Vec<Vec<u8>>, tokio::sync::OwnedSemaphorePermit);

/// One record per stdin line, pipelined ([`Client::append_pipelined`]):
/// the lines read so far go in one request ([`read_batch`]) as soon as they
/// are read, without waiting for the earlier requests' commits; each index
/// is printed once its record is committed, in order. A line no request
/// can carry fails the command after the lines before it were appended.
async fn from_stdin(client: &mut Client, out: &mut impl Write) -> ExitCode {
    let (batches_read, mut read) =
        tokio::sync::mpsc::channel::<Result<BatchAhead, String>>(BATCHES_AHEAD);
    let room = std::sync::Arc::new(tokio::sync::Semaphore::new(BYTES_AHEAD));
    let runtime = tokio::runtime::Handle::current();
    // stdin is read with blocking calls, on a thread of its own; it ends
    // with the input, a bad line, or when nobody takes its batches any more.
    std::thread::spawn(move || {
        let mut input = std::io::BufReader::with_capacity(READ_BUFFER, std::io::stdin());
        let mut line_no = 0;
        let mut carried = None;
        loop {
            let (batch, end) = read_batch(&mut input, &mut line_no, &mut carried);
            if !batch.is_empty() {
                let bytes: usize = batch.iter().map(Vec::len).sum();
                let share = bytes.clamp(1, BYTES_AHEAD) as u32;
                let Ok(permit) = runtime.block_on(room.clone().acquire_many_owned(share)) else {
                    return;
                };
                if batches_read.blocking_send(Ok((batch, permit))).is_err() {
                    return;
                }
            }
            match end {
                None => continue,
                Some(Ok(())) => return,
                Some(Err(why)) => {
                    let _ = batches_read.blocking_send(Err(why));
                    return;
                }
            }
        }
    });
    let mut bad_line = None;
    let batches = futures::stream::poll_fn(|cx| {
        use std::task::Poll;
        match std::task::ready!(read.poll_recv(cx)) {
            // Its room goes back: the client holds the batch now.
            Some(Ok((batch, _room))) => Poll::Ready(Some(batch)),
            Some(Err(why)) => {
                bad_line = Some(why);
                Poll::Ready(None)
            }
            None => Poll::Ready(None),
        }
    });
    let appended = client
        .append_pipelined(batches, |indexes| {
            let printed: String = indexes.iter().map(|i| format!("{i}\n")).collect();
            let _ = out.write_all(printed.as_bytes());
            let _ = out.flush();
        })
        .await;
    match (appended, bad_line) {
        (Err(e), _) => client_error(e),
        (Ok(_), Some(why)) => fail(why),
        (Ok(_), None) => ExitCode::SUCCESS,
    }
}

/// The next batch of lines of `input` (`line_no`: lines read so far): up
/// to [`BATCH_RECORDS`] lines that fit one request together (a line that
/// does not is `carried` to the next batch), ending early where what was
/// read ends (the next line would wait for more input: interactive input
/// goes line by line, a file in full batches). With it, the end of the
/// input (`Some(Ok)`) or a line no request can carry (`Some(Err)`) when the
/// batch ends there.
fn read_batch<R: Read>(
    input: &mut std::io::BufReader<R>,
    line_no: &mut u64,
    carried: &mut Option<Vec<u8>>,
) -> (Vec<Vec<u8>>, Option<Result<(), String>>) {
    let mut batch = Vec::new();
    let mut bytes = 0;
    loop {
        let line = match carried.take() {
            Some(line) => line,
            None => {
                *line_no += 1;
                match next_record(input, *line_no) {
                    Ok(Some(line)) => line,
                    Ok(None) => return (batch, Some(Ok(()))),
                    Err(why) => return (batch, Some(Err(why))),
                }
            }
        };
        let line_bytes = append_record_bytes(line.len());
        if !batch.is_empty() && bytes + line_bytes > MAX_APPEND_RECORDS_BYTES {
            *carried = Some(line);
            return (batch, None);
        }
        bytes += line_bytes;
        batch.push(line);
        if batch.len() == BATCH_RECORDS || input.buffer().is_empty() {
            return (batch, None);
        }
    }
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

#[cfg(test)]
mod tests {
    use std::io::BufReader;

    use super::*;

    /// Every batch of `input` read through a buffer of `capacity` bytes,
    /// and how the input ended.
    fn batches(input: impl Read, capacity: usize) -> (Vec<Vec<Vec<u8>>>, Result<(), String>) {
        let mut input = BufReader::with_capacity(capacity, input);
        let (mut line_no, mut carried, mut out) = (0, None, Vec::new());
        loop {
            let (batch, end) = read_batch(&mut input, &mut line_no, &mut carried);
            out.push(batch);
            if let Some(end) = end {
                return (out, end);
            }
        }
    }

    fn sizes(batches: &[Vec<Vec<u8>>]) -> Vec<usize> {
        batches.iter().map(Vec::len).collect()
    }

    #[test]
    fn what_was_read_goes_in_batches_of_at_most_256_lines() {
        let input: String = (1..=600).map(|k| format!("line {k}\n")).collect();
        let (got, end) = batches(input.as_bytes(), 1 << 20);
        assert_eq!(end, Ok(()));
        assert_eq!(sizes(&got), [256, 256, 88, 0]);
        let lines: Vec<Vec<u8>> = got.concat();
        assert_eq!(lines[599], b"line 600");
    }

    /// Input that comes a line per read (typed, or piped slowly).
    struct LineAtATime(std::vec::IntoIter<&'static [u8]>);

    impl Read for LineAtATime {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some(line) = self.0.next() else {
                return Ok(0);
            };
            buf[..line.len()].copy_from_slice(line);
            Ok(line.len())
        }
    }

    #[test]
    fn a_batch_ends_where_what_was_read_ends() {
        let input = LineAtATime(vec![&b"a\n"[..], b"b\r\nc\n", b"d"].into_iter());
        let (got, end) = batches(input, 1 << 20);
        assert_eq!(end, Ok(()));
        assert_eq!(
            got,
            [
                vec![b"a".to_vec()],
                vec![b"b".to_vec(), b"c".to_vec()],
                vec![b"d".to_vec()],
                vec![]
            ]
        );
    }

    #[test]
    fn a_line_too_long_ends_the_input_after_the_lines_before_it() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'z', MAX_RECORD_BYTES + 1));
        input.extend(b"\nnever\n");
        let (got, end) = batches(&input[..], 1 << 20);
        assert_eq!(got, [vec![b"ok".to_vec()]], "the line before it, alone");
        let why = end.expect_err("the long line is refused");
        assert!(why.contains("stdin line 2"), "{why}");
    }
}
