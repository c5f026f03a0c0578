//! The physical floor: what one durable 4 KiB write and one loopback round
//! trip cost on this machine, measured in the same run as the clusters, so
//! that the table can say how far each system is from the hardware.
//!
//! Blocking std I/O on purpose: nothing else runs in this process while it
//! measures, and an async runtime would only add to what is measured.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::report::new_histogram;

/// Bytes of one durable write.
pub const WRITE_BYTES: usize = 4096;
/// Bytes of one ping and of one pong.
pub const PING_BYTES: usize = 64;
/// Iterations run before measuring (page cache, TCP slow start, CPU
/// frequency), whatever the count measured.
const WARMUP_ITERATIONS: usize = 50;

/// Removes the test file however the measurement ends.
struct ScratchFile {
    path: PathBuf,
    file: File,
}

impl ScratchFile {
    fn create(dir: &Path, name: &str) -> std::io::Result<ScratchFile> {
        let path = dir.join(format!("{name}-{}.dat", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok(ScratchFile { path, file })
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn elapsed_ns(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Latency of one [`WRITE_BYTES`] `pwrite` followed by `fdatasync`, in a
/// new file in `dir`, `iterations` times (after a short warm-up), each at
/// the next 4 KiB offset. `preallocate`: the file is first written and
/// synced in full, so only data is flushed (what a log with preallocated
/// segments pays); otherwise each write extends the file, so the inode's
/// size is flushed too (what a log that grows its file pays).
///
/// # Errors
/// The I/O error of creating, writing or syncing the file.
pub fn fdatasync_latency(
    dir: &Path,
    iterations: usize,
    preallocate: bool,
) -> std::io::Result<Histogram<u64>> {
    let total = iterations + WARMUP_ITERATIONS;
    let scratch = ScratchFile::create(
        dir,
        if preallocate {
            "floor-preallocated"
        } else {
            "floor-append"
        },
    )?;
    let block = [0x5au8; WRITE_BYTES];
    if preallocate {
        for k in 0..total {
            scratch
                .file
                .write_all_at(&block, (k * WRITE_BYTES) as u64)?;
        }
        scratch.file.sync_all()?;
    }
    let mut h = new_histogram();
    for k in 0..total {
        let started = Instant::now();
        scratch
            .file
            .write_all_at(&block, (k * WRITE_BYTES) as u64)?;
        scratch.file.sync_data()?;
        if k >= WARMUP_ITERATIONS {
            h.saturating_record(elapsed_ns(started));
        }
    }
    Ok(h)
}

/// Latency of one [`PING_BYTES`] ping answered by a pong of the same size
/// over loopback TCP (`TCP_NODELAY` on both ends), `iterations` times.
///
/// # Errors
/// The I/O error of the socket.
pub fn loopback_rtt(iterations: usize) -> std::io::Result<Histogram<u64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buf = [0u8; PING_BYTES];
        loop {
            match stream.read_exact(&mut buf) {
                Ok(()) => stream.write_all(&buf)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut h = new_histogram();
    {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let ping = [0xa5u8; PING_BYTES];
        let mut pong = [0u8; PING_BYTES];
        for k in 0..iterations + WARMUP_ITERATIONS {
            let started = Instant::now();
            stream.write_all(&ping)?;
            stream.read_exact(&mut pong)?;
            if k >= WARMUP_ITERATIONS {
                h.saturating_record(elapsed_ns(started));
            }
        }
        // Dropping the stream ends the echo thread.
    }
    echo.join()
        .map_err(|_| std::io::Error::other("the echo thread panicked"))??;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each measurement records exactly the iterations asked for, and the
    /// test file is gone afterwards. (No assertion on the times.)
    #[test]
    fn the_floor_records_each_iteration_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        for preallocate in [true, false] {
            let h = fdatasync_latency(dir.path(), 7, preallocate).unwrap();
            assert_eq!(h.len(), 7);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(loopback_rtt(9).unwrap().len(), 9);
        assert!(fdatasync_latency(&dir.path().join("missing"), 1, true).is_err());
    }
}
