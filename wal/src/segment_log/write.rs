//! Writing the segments: appending batches (planned into parts, one write
//! per segment, zeroes ahead), undoing a failed batch, sync, truncation and
//! removal of whole segments below a first kept index. It must never write
//! a record that does not continue the log, and never remove a segment
//! still holding an index at or above the first kept one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::disk::{Disk, DiskFile};
use crate::error::{Result, WalError};
use crate::layout::MAX_INDEX;
use crate::segment::{
    OwnRecord, SEGMENT_HEADER_BYTES, SegmentHeader, TermRun, own_record, segment_name,
};
use crate::validate::{ChainTip, LogPos};

use super::*;

/// The segments a batch created: (its part in the plan, file, path).
type NewSegments<F> = Vec<(usize, Arc<F>, PathBuf)>;

/// The files and offsets a batch wrote, and how far the zeroes reach.
type BatchWritten<F> = (Vec<(Arc<F>, u64)>, u64);

impl<D: Disk> SegmentLog<D> {
    /// Appends records: each slice holds one or more whole entry records
    /// in the ring's format, chaining on the log's tail (the caller's own
    /// ring bytes). Writes with one positioned vectored write per segment
    /// touched, rolling to a new segment when the current one is full. Does
    /// not flush: see [`SegmentLog::sync`].
    ///
    /// # Errors
    /// [`WalError::DiskFull`] when a new segment cannot get its space, or
    /// (without preallocation) a write finds the disk full: nothing of the
    /// batch stays written, and a later append can succeed once space is
    /// freed. [`WalError::LogFailed`] after an earlier
    /// failure; [`WalError::Io`] (the log then refuses further writes).
    ///
    /// # Panics
    /// When a slice is not a sequence of whole entry records with good CRCs
    /// continuing the log (index, prev_term, lsn, epoch), or a payload is
    /// above `max_record_bytes`: the caller's own bug (or its memory was
    /// corrupted since it checked the records).
    pub fn append(&mut self, records: &[&[u8]]) -> Result<()> {
        self.check_usable()?;
        self.discard_damage()?;
        let plan = self.plan(records);
        if plan.is_empty() {
            return Ok(());
        }
        let created = self.create_batch_segments(&plan)?;
        let active = {
            let shared = read_lock(&self.shared);
            shared
                .segments
                .back()
                .map(|s| (Arc::clone(&s.file), s.end, s.path.clone()))
        };
        let (written, zeroed_to) = self.write_batch(&plan, &created, active.as_ref())?;
        // Publish.
        let last = plan.last().expect("a non-empty plan");
        self.publish_batch(&plan, &created);
        self.tip = last.tip;
        self.lsn_end = last.lsn_end;
        self.zeroed_to = zeroed_to;
        if !created.is_empty() {
            self.dir_dirty = true;
        }
        for (file, _) in written {
            if !self.unsynced.iter().any(|f| Arc::ptr_eq(f, &file)) {
                self.unsynced.push(file);
            }
        }
        Ok(())
    }

    /// Creates the new segments of `plan` first (their space preallocated),
    /// so that a full disk is found before any byte of the batch is
    /// written. On an error, removes those it created.
    fn create_batch_segments(&mut self, plan: &[Part<'_>]) -> Result<NewSegments<D::File>> {
        let mut created: Vec<(usize, Arc<D::File>, PathBuf)> = Vec::new();
        for (k, part) in plan.iter().enumerate() {
            if let Some(header) = &part.new_header {
                let path = self.dir.join(segment_name(header.first_index));
                match self.create_segment(&path) {
                    Ok(file) => created.push((k, Arc::new(file), path)),
                    Err(err) => {
                        for (_, _, path) in created.iter().rev() {
                            let _ = self.disk.remove(path);
                        }
                        if !matches!(err, WalError::DiskFull { .. }) {
                            self.fail("create", &path, &err);
                        }
                        return Err(err);
                    }
                }
            }
        }
        Ok(created)
    }

    /// Writes each part of `plan` with one positioned vectored write, into
    /// its `created` segment or the `active` one, zeroes ahead. Returns the
    /// files and offsets written and how far the zeroes now reach. On a full
    /// disk, undoes the batch's bytes so that a later append starts clean.
    fn write_batch(
        &mut self,
        plan: &[Part<'_>],
        created: &[(usize, Arc<D::File>, PathBuf)],
        active: Option<&(Arc<D::File>, u64, PathBuf)>,
    ) -> Result<BatchWritten<D::File>> {
        let mut written: Vec<(Arc<D::File>, u64)> = Vec::new();
        let mut zeroed_to = self.zeroed_to;
        for (k, part) in plan.iter().enumerate() {
            let (file, offset, path) = match created.iter().find(|(i, _, _)| *i == k) {
                Some((_, file, path)) => {
                    zeroed_to = 0;
                    (Arc::clone(file), 0, path.clone())
                }
                None => {
                    let (file, end, path) =
                        active.cloned().expect("an append into the active segment");
                    (file, end, path)
                }
            };
            let header_bytes = part.new_header.map(|h| h.encode());
            let mut bufs: Vec<&[u8]> = Vec::with_capacity(part.slices.len() + 2);
            if let Some(h) = &header_bytes {
                bufs.push(h);
            }
            bufs.extend(part.slices.iter().copied());
            let part_end = offset + bufs.iter().map(|b| b.len() as u64).sum::<u64>();
            if !self.zeroes.is_empty() && part_end > zeroed_to {
                let zero_to = part_end
                    .next_multiple_of(self.zeroes.len() as u64)
                    .min(self.config.segment_bytes)
                    .max(part_end);
                bufs.push(&self.zeroes[..(zero_to - part_end) as usize]);
                zeroed_to = zero_to;
            }
            if let Err(err) = file.write_at(&bufs, offset) {
                // A full disk (possible without preallocation): undo the
                // batch's bytes so that a later append starts clean.
                if matches!(err, WalError::DiskFull { .. })
                    && self.undo_batch(created, active).is_ok()
                {
                    self.zeroed_to = active.map_or(0, |a| a.1);
                    return Err(err);
                }
                self.fail("write", &path, &err);
                return Err(err);
            }
            written.push((file, offset));
        }
        Ok((written, zeroed_to))
    }

    /// Publishes a written batch to the readers: the `created` segments
    /// join the list, the other parts extend the active segment.
    fn publish_batch(&self, plan: &[Part<'_>], created: &[(usize, Arc<D::File>, PathBuf)]) {
        let mut shared = write_lock(&self.shared);
        for (k, part) in plan.iter().enumerate() {
            let added: u64 = part.slices.iter().map(|s| s.len() as u64).sum();
            match created.iter().find(|(i, _, _)| *i == k) {
                Some((_, file, path)) => {
                    let header = part.new_header.expect("a new segment's header");
                    let end = SEGMENT_HEADER_BYTES as u64 + added;
                    let file_len = if self.config.preallocate {
                        self.config.segment_bytes.max(end)
                    } else {
                        end
                    };
                    shared.segments.push_back(Segment {
                        first_index: header.first_index,
                        path: path.clone(),
                        file: Arc::clone(file),
                        offsets: part.offsets.clone(),
                        terms: part.terms.clone(),
                        end,
                        file_len,
                        written_at: SystemTime::now(),
                    });
                }
                None => {
                    let segment = shared.segments.back_mut().expect("the active segment");
                    segment.offsets.extend_from_slice(&part.offsets);
                    for run in &part.terms {
                        if segment.terms.last().is_none_or(|r| r.term != run.term) {
                            segment.terms.push(*run);
                        }
                    }
                    segment.end += added;
                    segment.file_len = segment.file_len.max(segment.end);
                    segment.written_at = SystemTime::now();
                }
            }
        }
    }

    /// Removes the segments a failed append created and cuts the active
    /// one back to its end.
    pub(super) fn undo_batch(
        &self,
        created: &[(usize, Arc<D::File>, PathBuf)],
        active: Option<&(Arc<D::File>, u64, PathBuf)>,
    ) -> Result<()> {
        for (_, _, path) in created.iter().rev() {
            self.disk.remove(path)?;
        }
        if !created.is_empty() {
            self.disk.sync_dir(&self.dir)?;
        }
        if let Some((file, end, _)) = active {
            file.set_len(*end)?;
            if self.config.preallocate {
                file.preallocate(self.config.segment_bytes)?;
            }
        }
        Ok(())
    }

    pub(super) fn create_segment(&self, path: &Path) -> Result<D::File> {
        let file = self.disk.create_new(path)?;
        if self.config.preallocate
            && let Err(err) = file.preallocate(self.config.segment_bytes)
        {
            drop(file);
            let _ = self.disk.remove(path);
            return Err(err);
        }
        Ok(file)
    }

    /// Splits the records into per-segment parts, checking the chain.
    pub(super) fn plan<'a>(&self, records: &[&'a [u8]]) -> Vec<Part<'a>> {
        let (mut end, mut has_records) = {
            let shared = read_lock(&self.shared);
            match shared.segments.back() {
                Some(s) => (Some(s.end), !s.offsets.is_empty()),
                None => (None, false),
            }
        };
        let mut tip = self.tip;
        let mut lsn_end = self.lsn_end;
        let mut parts: Vec<Part<'a>> = Vec::new();
        for slice in records {
            let mut at = 0usize;
            let mut run_start = 0usize;
            while at < slice.len() {
                let record = own_record(&slice[at..]);
                self.assert_continues(&record, tip, lsn_end);
                let len = record.len as u64;
                let roll = match end {
                    None => true,
                    Some(end) => has_records && end + len > self.config.segment_bytes,
                };
                if roll {
                    close_run(&mut parts, &slice[run_start..at]);
                    run_start = at;
                    parts.push(Part {
                        new_header: Some(SegmentHeader {
                            cluster_id: self.config.cluster_id,
                            node_id: self.config.node_id,
                            first_index: record.index,
                            prev_term: record.prev_term,
                        }),
                        ..Part::default()
                    });
                    end = Some(SEGMENT_HEADER_BYTES as u64);
                } else if parts.is_empty() {
                    parts.push(Part::default());
                }
                let part = parts.last_mut().expect("a part");
                let offset = end.expect("a segment to write into");
                part.offsets
                    .push(u32::try_from(offset).expect("segment offsets fit in u32"));
                if part.terms.last().is_none_or(|r| r.term != record.term) {
                    part.terms.push(TermRun {
                        first_index: record.index,
                        term: record.term,
                    });
                }
                end = Some(offset + len);
                has_records = true;
                tip = ChainTip {
                    next_index: record.index + 1,
                    last_term: record.term,
                    epoch: record.epoch,
                    unanchored: false,
                };
                lsn_end = record.lsn + len;
                part.tip = tip;
                part.lsn_end = lsn_end;
                at += record.len;
            }
            close_run(&mut parts, &slice[run_start..at]);
        }
        parts
    }

    pub(super) fn assert_continues(&self, record: &OwnRecord, tip: ChainTip, lsn_end: u64) {
        assert!(
            record.payload_len <= self.config.max_record_bytes,
            "record {} with a payload of {} bytes is above max_record_bytes {}",
            record.index,
            record.payload_len,
            self.config.max_record_bytes
        );
        if !tip.unanchored {
            assert_eq!(
                (record.index, record.prev_term),
                (tip.next_index, tip.last_term),
                "record (index, prev_term) does not continue the segment log"
            );
        }
        assert!(
            record.lsn >= lsn_end,
            "record {} at lsn {} is below the log's lsn end {lsn_end}",
            record.index,
            record.lsn
        );
        assert!(
            record.epoch >= tip.epoch,
            "record {} of {} after a record of {}",
            record.index,
            record.epoch,
            tip.epoch
        );
        assert!(record.index < MAX_INDEX, "record index at MAX_INDEX");
    }

    /// Makes everything appended durable: `fdatasync` of every segment
    /// written since the last sync, and of the directory when a segment was
    /// created or removed. Returns the last entry now durable.
    ///
    /// # Errors
    /// [`WalError::Io`] or [`WalError::DiskFull`] from the flush; the log
    /// then refuses every further write ([`WalError::LogFailed`]).
    pub fn sync(&mut self) -> Result<Option<LogPos>> {
        self.check_usable()?;
        let target = self.last_log();
        while let Some(file) = self.unsynced.last() {
            if let Err(err) = file.sync_data() {
                let path = file.path().to_path_buf();
                self.fail("fdatasync", &path, &err);
                return Err(err);
            }
            self.unsynced.pop();
        }
        if self.dir_dirty {
            if let Err(err) = self.disk.sync_dir(&self.dir) {
                let dir = self.dir.clone();
                self.fail("sync directory", &dir, &err);
                return Err(err);
            }
            self.dir_dirty = false;
        }
        self.durable = target;
        Ok(target)
    }

    /// Removes every entry after `last_kept` (all of them for `None`):
    /// whole later segments are deleted (newest first), the boundary
    /// segment is cut. Durable when it returns. Removing everything leaves
    /// an empty log that takes any first record.
    ///
    /// # Errors
    /// [`WalError::Io`] (the log then refuses further writes),
    /// [`WalError::LogFailed`].
    pub fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<()> {
        self.check_usable()?;
        self.discard_damage()?;
        let next = last_kept.map_or(0, |i| i.saturating_add(1));
        if next >= self.next_index() {
            return Ok(());
        }
        // Publish first: readers of the removed entries get a range error.
        let (removed, boundary) = {
            let mut shared = write_lock(&self.shared);
            let mut removed = Vec::new();
            while let Some(last) = shared.segments.back() {
                if last.first_index >= next {
                    removed.push(shared.segments.pop_back().expect("a last segment"));
                } else {
                    break;
                }
            }
            let boundary = shared.segments.back_mut().map(|segment| {
                let keep = (next - segment.first_index) as usize;
                if keep < segment.offsets.len() {
                    segment.end = segment.offsets[keep] as u64;
                    segment.offsets.truncate(keep);
                    segment.truncate_terms();
                }
                (Arc::clone(&segment.file), segment.end, segment.path.clone())
            });
            if shared.segments.is_empty() {
                shared.empty_next = 0;
            }
            (removed, boundary)
        };
        let result = self.truncate_files(&removed, boundary.as_ref());
        if let Err(err) = &result {
            let path = boundary.as_ref().map_or(self.dir.clone(), |b| b.2.clone());
            self.fail("truncate", &path, err);
            return result;
        }
        self.unsynced
            .retain(|f| !removed.iter().any(|s| Arc::ptr_eq(f, &s.file)));
        self.zeroed_to = self.last_end();
        // The new tail's chain state: its header, read back.
        match self.last_log() {
            Some(last) => {
                let header = self.header_of(last.index)?;
                self.tip = ChainTip {
                    next_index: last.index + 1,
                    last_term: last.term,
                    epoch: header.epoch,
                    unanchored: false,
                };
                self.lsn_end = header.lsn.checked_add(header.record_len()).ok_or_else(|| {
                    WalError::Corrupt {
                        index: last.index,
                        lsn: header.lsn,
                        detail: "its lsn and length overflow".to_string(),
                    }
                })?;
            }
            None => {
                self.tip = ChainTip::after(None);
                self.lsn_end = 0;
            }
        }
        if self.durable.is_some_and(|d| d.index >= next) {
            self.durable = self.last_log();
        }
        Ok(())
    }

    pub(super) fn truncate_files(
        &mut self,
        removed: &[Segment<D::File>],
        boundary: Option<&(Arc<D::File>, u64, PathBuf)>,
    ) -> Result<()> {
        let paths: Vec<PathBuf> = removed.iter().map(|s| s.path.clone()).collect();
        self.remove_files(&paths)?;
        if let Some((file, end, _)) = boundary {
            file.set_len(*end)?;
            if self.config.preallocate {
                file.preallocate(self.config.segment_bytes)?;
            }
            file.sync_data()?;
            let len = file.size()?;
            let mut shared = write_lock(&self.shared);
            if let Some(last) = shared.segments.back_mut() {
                last.file_len = len;
            }
        }
        Ok(())
    }

    /// Removes files one by one, each removal durable before the next: a
    /// crash leaves a prefix of the removals done, whatever order the file
    /// system would write directory changes back in, so the directory stays
    /// a valid log (callers remove newest first when cutting the end,
    /// oldest first for retention).
    pub(super) fn remove_files(&self, paths: &[PathBuf]) -> Result<()> {
        for path in paths {
            self.disk.remove(path)?;
            self.disk.sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Retention: deletes (oldest first) every whole segment whose entries
    /// are all below `first_kept`, except the last segment, which anchors
    /// the log's chain. Durable when it returns. Returns the new first
    /// index.
    ///
    /// # Errors
    /// [`WalError::Io`] (the log then refuses further writes),
    /// [`WalError::LogFailed`].
    pub fn remove_before(&mut self, first_kept: u64) -> Result<u64> {
        self.check_usable()?;
        let (removed, first) = {
            let mut shared = write_lock(&self.shared);
            let mut removed = Vec::new();
            while shared.segments.len() > 1 && shared.segments[0].next_index() <= first_kept {
                removed.push(shared.segments.pop_front().expect("a first segment"));
            }
            (removed, shared.first_index())
        };
        if removed.is_empty() {
            return Ok(first);
        }
        let paths: Vec<PathBuf> = removed.iter().map(|s| s.path.clone()).collect();
        if let Err(err) = self.remove_files(&paths) {
            let dir = self.dir.clone();
            self.fail("remove", &dir, &err);
            return Err(err);
        }
        self.unsynced
            .retain(|f| !removed.iter().any(|s| Arc::ptr_eq(f, &s.file)));
        Ok(first)
    }
}

/// Adds `run`, whole records of one slice of an append, to the last part;
/// an empty run adds nothing.
fn close_run<'a>(parts: &mut [Part<'a>], run: &'a [u8]) {
    if !run.is_empty() {
        parts
            .last_mut()
            .expect("a part for the run")
            .slices
            .push(run);
    }
}
