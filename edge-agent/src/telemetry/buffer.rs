//! The on-disk store-and-forward buffer (sled, in `<data-dir>/telemetry`).
//!
//! - Batches: each closed window's report, persisted under the next sequence
//!   number before anything is sent. The sequence is the idempotent batch id
//!   and lives in the same store, so it survives restarts. A batch is deleted
//!   only once the control plane acknowledges its sequence. Past
//!   `max_batches` the oldest is dropped, and its count (plus whatever drop
//!   counts it carried) moves to the next batch created, so no drop goes
//!   unreported.
//! - Samples: hard examples and labelled feedback, bounded by count and
//!   bytes (the oldest dropped and counted). They are attached to the batch
//!   at the head of the queue when it is first sent, and the attachment is
//!   persisted, so a retry after a lost ack sends exactly the same report;
//!   they are deleted with that batch's ack. A dropped batch detaches its
//!   samples, which stay queued.
//!
//! - Epoch: a random number picked when the buffer is created and sent with
//!   every report, so that a buffer lost and made again, its sequences
//!   back at one, is not taken for the old one by the control plane's
//!   deduplication. A buffer from before epochs keeps epoch 0.
//!
//! Every change is one atomic sled batch made under one mutex, so the
//! decisions (which to drop, which to attach) see a consistent store.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;
use edgeloop_proto::agent::v1 as pb;
use prost::Message as _;

const BATCH: u8 = b'b';
const SAMPLE: u8 = b's';
const INDEX: u8 = b'i';
const NEXT_SEQUENCE: &[u8] = b"m/next_sequence";
const EPOCH: &[u8] = b"m/epoch";
const DROPPED_BATCHES: &[u8] = b"m/dropped_batches";
const DROPPED_SAMPLES: &[u8] = b"m/dropped_samples";
/// The head batch's sequence followed by the keys of its samples.
const ATTACHED: &[u8] = b"m/attached";

/// The buffer's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_batches: u64,
    pub max_samples: u64,
    pub max_sample_bytes: u64,
    /// Samples attached to one report.
    pub samples_per_batch: usize,
    /// Sample bytes attached to one report (well under the control plane's
    /// 8 MiB message limit).
    pub sample_bytes_per_batch: usize,
}

/// What the buffer holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferStats {
    pub batches: u64,
    pub samples: u64,
    pub sample_bytes: u64,
    /// Drops not yet written into a batch.
    pub unreported_dropped_batches: u64,
    pub unreported_dropped_samples: u64,
    pub next_sequence: u64,
}

struct State {
    batches: u64,
    samples: u64,
    sample_bytes: u64,
    /// The sequence being sent right now; the cap never drops it (its ack
    /// would otherwise delete samples that the drop put back in the queue).
    in_flight: Option<u64>,
}

pub struct Buffer {
    db: sled::Db,
    epoch: u64,
    limits: Limits,
    state: Mutex<State>,
}

fn key(prefix: u8, id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

fn id_of(k: &[u8]) -> u64 {
    k.get(1..9)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes)
}

fn index_key(model: &str, request_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + model.len() + request_id.len());
    k.push(INDEX);
    k.extend_from_slice(model.as_bytes());
    // Model names are DNS labels, so NUL cannot occur inside one.
    k.push(0);
    k.extend_from_slice(request_id.as_bytes());
    k
}

fn encode_u64(v: u64) -> [u8; 8] {
    v.to_be_bytes()
}

fn decode_u64(raw: Option<sled::IVec>) -> u64 {
    raw.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
        .map_or(0, u64::from_be_bytes)
}

fn encode_attached(seq: u64, samples: &[u64]) -> Vec<u8> {
    std::iter::once(seq)
        .chain(samples.iter().copied())
        .flat_map(u64::to_be_bytes)
        .collect()
}

fn decode_attached(raw: &[u8]) -> Option<(u64, Vec<u64>)> {
    let mut ids = raw
        .chunks_exact(8)
        .map(|c| <[u8; 8]>::try_from(c).map_or(0, u64::from_be_bytes));
    let seq = ids.next()?;
    Some((seq, ids.collect()))
}

fn open_db(dir: &Path) -> sled::Result<sled::Db> {
    edgeloop_client_core::sled_open::open_waiting_for_lock(
        &sled::Config::new()
            .path(dir)
            // An edge device: sled's default 1 GiB page cache is far too much.
            .cache_capacity(16 << 20),
    )
}

/// The buffer's epoch: the one it was given, 0 for a buffer from before
/// epochs (it has sequences but no epoch), else a new random one, made
/// durable before any report carries it.
fn epoch_of(db: &sled::Db) -> anyhow::Result<u64> {
    if let Some(raw) = db.get(EPOCH)? {
        return Ok(decode_u64(Some(raw)));
    }
    let epoch = if db.get(NEXT_SEQUENCE)?.is_some() {
        0
    } else {
        loop {
            let e: u64 = rand::random();
            if e != 0 {
                break e;
            }
        }
    };
    db.insert(EPOCH, &encode_u64(epoch)[..])?;
    db.flush()?;
    Ok(epoch)
}

impl Buffer {
    /// The epoch every report of this buffer carries.
    #[cfg(test)]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn open(dir: &Path, limits: Limits) -> anyhow::Result<Buffer> {
        let db = open_db(dir)
            .with_context(|| format!("opening the telemetry buffer in {}", dir.display()))?;
        let (mut samples, mut sample_bytes) = (0, 0);
        for item in db.scan_prefix([SAMPLE]) {
            let (_, v) = item?;
            samples += 1;
            sample_bytes += v.len() as u64;
        }
        let batches = db.scan_prefix([BATCH]).count() as u64;
        let epoch = epoch_of(&db)?;
        Ok(Buffer {
            db,
            epoch,
            limits,
            state: Mutex::new(State {
                batches,
                samples,
                sample_bytes,
                in_flight: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn meta(&self, k: &[u8]) -> anyhow::Result<u64> {
        Ok(decode_u64(self.db.get(k)?))
    }

    fn attached(&self) -> anyhow::Result<Option<(u64, Vec<u64>)>> {
        Ok(self.db.get(ATTACHED)?.and_then(|raw| decode_attached(&raw)))
    }

    pub fn stats(&self) -> anyhow::Result<BufferStats> {
        let s = self.lock();
        Ok(BufferStats {
            batches: s.batches,
            samples: s.samples,
            sample_bytes: s.sample_bytes,
            unreported_dropped_batches: self.meta(DROPPED_BATCHES)?,
            unreported_dropped_samples: self.meta(DROPPED_SAMPLES)?,
            next_sequence: self.meta(NEXT_SEQUENCE)?.max(1),
        })
    }

    /// The sequences waiting to be acknowledged, oldest first.
    pub fn pending(&self) -> anyhow::Result<Vec<u64>> {
        self.db
            .scan_prefix([BATCH])
            .keys()
            .map(|k| Ok(id_of(&k?)))
            .collect()
    }

    /// Every pending batch as stored (without samples), oldest first.
    #[cfg(test)]
    pub(crate) fn reports(&self) -> Vec<pb::TelemetryReport> {
        self.db
            .scan_prefix([BATCH])
            .values()
            .map(|v| pb::TelemetryReport::decode(v.unwrap().as_ref()).unwrap())
            .collect()
    }

    /// Persists `report` as the next batch (its sequence and drop counts are
    /// filled in here) and makes it durable; returns its sequence.
    pub fn push(&self, mut report: pb::TelemetryReport) -> anyhow::Result<u64> {
        let mut state = self.lock();
        let seq = self.meta(NEXT_SEQUENCE)?.max(1);
        let mut dropped_batches = self.meta(DROPPED_BATCHES)?;
        let mut dropped_samples = self.meta(DROPPED_SAMPLES)?;
        let attached = self.attached()?;
        let mut batch = sled::Batch::default();
        let mut removed = 0;
        if state.batches >= self.limits.max_batches {
            let excess = state.batches + 1 - self.limits.max_batches;
            for item in self.db.scan_prefix([BATCH]) {
                if removed >= excess {
                    break;
                }
                let (k, v) = item?;
                let old = id_of(&k);
                if state.in_flight == Some(old) {
                    continue;
                }
                // A dropped batch's own drop counts carry over too.
                let old_report = pb::TelemetryReport::decode(v.as_ref()).unwrap_or_default();
                dropped_batches += 1 + old_report.dropped_batches;
                dropped_samples += old_report.dropped_samples;
                if attached.as_ref().is_some_and(|(s, _)| *s == old) {
                    // Its samples stay queued for the next head.
                    batch.remove(ATTACHED);
                }
                batch.remove(k);
                removed += 1;
            }
            if removed > 0 {
                tracing::warn!(
                    dropped = removed,
                    max_batches = self.limits.max_batches,
                    "telemetry buffer full: dropped the oldest batches"
                );
            }
        }
        report.sequence = seq;
        report.epoch = self.epoch;
        report.dropped_batches = dropped_batches;
        report.dropped_samples = dropped_samples;
        batch.insert(&key(BATCH, seq)[..], report.encode_to_vec());
        batch.insert(NEXT_SEQUENCE, &encode_u64(seq + 1)[..]);
        batch.insert(DROPPED_BATCHES, &encode_u64(0)[..]);
        batch.insert(DROPPED_SAMPLES, &encode_u64(0)[..]);
        self.db.apply_batch(batch)?;
        // Persisted before any send: a crash after this loses nothing.
        self.db.flush()?;
        state.batches = state.batches + 1 - removed;
        Ok(seq)
    }

    /// The oldest batch, with samples attached (chosen and persisted the
    /// first time it is asked for), marked as in flight until `ack` or
    /// `send_failed`.
    pub fn head(&self) -> anyhow::Result<Option<pb::TelemetryReport>> {
        let mut state = self.lock();
        let (seq, mut report) = loop {
            let Some(item) = self.db.scan_prefix([BATCH]).next() else {
                return Ok(None);
            };
            let (k, v) = item?;
            let seq = id_of(&k);
            match pb::TelemetryReport::decode(v.as_ref()) {
                Ok(report) => break (seq, report),
                // It would block every later batch: drop it, and count it.
                Err(e) => {
                    tracing::error!(seq, error = %e, "telemetry batch is corrupt; dropping it");
                    let mut batch = sled::Batch::default();
                    batch.remove(k);
                    batch.insert(
                        DROPPED_BATCHES,
                        &encode_u64(self.meta(DROPPED_BATCHES)? + 1)[..],
                    );
                    self.db.apply_batch(batch)?;
                    state.batches = state.batches.saturating_sub(1);
                }
            }
        };
        report.sequence = seq;
        report.epoch = self.epoch;
        let keys = match self.attached()? {
            Some((s, keys)) if s == seq => keys,
            _ => {
                let keys = self.choose_samples()?;
                self.db.insert(ATTACHED, encode_attached(seq, &keys))?;
                self.db.flush()?;
                keys
            }
        };
        for id in keys {
            if let Some(raw) = self.db.get(key(SAMPLE, id))? {
                report.samples.push(pb::Sample::decode(raw.as_ref())?);
            }
        }
        state.in_flight = Some(seq);
        Ok(Some(report))
    }

    /// The oldest samples that fit one report.
    fn choose_samples(&self) -> anyhow::Result<Vec<u64>> {
        let (mut keys, mut bytes) = (vec![], 0usize);
        for item in self.db.scan_prefix([SAMPLE]) {
            let (k, v) = item?;
            if keys.len() >= self.limits.samples_per_batch
                || bytes + v.len() > self.limits.sample_bytes_per_batch
            {
                break;
            }
            bytes += v.len();
            keys.push(id_of(&k));
        }
        Ok(keys)
    }

    /// The send of the in-flight batch failed; it stays queued.
    pub fn send_failed(&self) {
        self.lock().in_flight = None;
    }

    /// The control plane has stored everything up to `acked`: delete those
    /// batches and the samples attached to them. Returns how many batches.
    pub fn ack(&self, acked: u64) -> anyhow::Result<u64> {
        let mut state = self.lock();
        state.in_flight = None;
        let mut batch = sled::Batch::default();
        let mut removed = 0;
        for k in self.db.range(key(BATCH, 0)..=key(BATCH, acked)).keys() {
            batch.remove(k?);
            removed += 1;
        }
        let (mut samples, mut bytes) = (0, 0);
        if let Some((seq, ids)) = self.attached()? {
            if seq <= acked {
                for id in ids {
                    if let Some(raw) = self.db.get(key(SAMPLE, id))? {
                        if let Ok(s) = pb::Sample::decode(raw.as_ref()) {
                            let index = index_key(&s.model_name, &s.request_id);
                            // Unless it points at a newer sample with the same id.
                            if self.db.get(&index)?.map(|v| decode_u64(Some(v))) == Some(id) {
                                batch.remove(index);
                            }
                        }
                        batch.remove(&key(SAMPLE, id)[..]);
                        samples += 1;
                        bytes += raw.len() as u64;
                    }
                }
                batch.remove(ATTACHED);
            }
        }
        // The control plane knows sequences this buffer never made (its
        // store was reset): continue above them, or new batches would be
        // discarded as duplicates.
        if acked >= self.meta(NEXT_SEQUENCE)?.max(1) {
            tracing::warn!(
                acked,
                "control plane acknowledged a sequence this agent has not used; skipping ahead"
            );
            batch.insert(NEXT_SEQUENCE, &encode_u64(acked + 1)[..]);
        }
        self.db.apply_batch(batch)?;
        state.batches = state.batches.saturating_sub(removed);
        state.samples = state.samples.saturating_sub(samples);
        state.sample_bytes = state.sample_bytes.saturating_sub(bytes);
        Ok(removed)
    }

    /// The control plane refused batch `seq` as invalid: retrying cannot
    /// help, so it is dropped (and counted) and its samples stay queued.
    pub fn reject(&self, seq: u64) -> anyhow::Result<()> {
        let mut state = self.lock();
        state.in_flight = None;
        let Some(raw) = self.db.get(key(BATCH, seq))? else {
            return Ok(());
        };
        let old = pb::TelemetryReport::decode(raw.as_ref()).unwrap_or_default();
        let mut batch = sled::Batch::default();
        batch.remove(&key(BATCH, seq)[..]);
        if self.attached()?.is_some_and(|(s, _)| s == seq) {
            batch.remove(ATTACHED);
        }
        batch.insert(
            DROPPED_BATCHES,
            &encode_u64(self.meta(DROPPED_BATCHES)? + 1 + old.dropped_batches)[..],
        );
        batch.insert(
            DROPPED_SAMPLES,
            &encode_u64(self.meta(DROPPED_SAMPLES)? + old.dropped_samples)[..],
        );
        self.db.apply_batch(batch)?;
        state.batches = state.batches.saturating_sub(1);
        Ok(())
    }

    /// Queues samples for upload, dropping the oldest unattached ones (and
    /// counting them) past the count and byte caps.
    pub fn add_samples(&self, samples: Vec<pb::Sample>) -> anyhow::Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        let mut batch = sled::Batch::default();
        let (mut count, mut bytes) = (state.samples, state.sample_bytes);
        let mut dropped = 0;
        let mut fresh = vec![];
        for s in samples {
            let raw = s.encode_to_vec();
            if raw.len() as u64 > self.limits.max_sample_bytes {
                dropped += 1;
                continue;
            }
            let id = self.db.generate_id()?;
            let index = index_key(&s.model_name, &s.request_id);
            batch.insert(&key(SAMPLE, id)[..], raw.as_slice());
            batch.insert(index.as_slice(), &encode_u64(id)[..]);
            count += 1;
            bytes += raw.len() as u64;
            fresh.push((id, raw.len() as u64, Some(index)));
        }
        if count > self.limits.max_samples || bytes > self.limits.max_sample_bytes {
            let attached = self.attached()?.map(|(_, ids)| ids).unwrap_or_default();
            // Oldest first: what is stored, then what is being added. Lazy,
            // so only the evicted samples are decoded.
            let stored = self.db.scan_prefix([SAMPLE]).filter_map(|item| {
                let (k, v) = item.ok()?;
                let index = pb::Sample::decode(v.as_ref())
                    .map(|s| index_key(&s.model_name, &s.request_id))
                    .ok();
                Some((id_of(&k), v.len() as u64, index))
            });
            let mut newest_index: std::collections::HashMap<Vec<u8>, u64> = fresh
                .iter()
                .filter_map(|(id, _, index)| Some((index.clone()?, *id)))
                .collect();
            for (id, len, index) in stored.chain(fresh.iter().cloned()) {
                if count <= self.limits.max_samples && bytes <= self.limits.max_sample_bytes {
                    break;
                }
                if attached.contains(&id) {
                    continue;
                }
                batch.remove(&key(SAMPLE, id)[..]);
                // The index may point at a newer sample with the same id.
                if let Some(index) = index {
                    let current = match newest_index.get(&index) {
                        Some(&newer) => Some(newer),
                        None => self.db.get(&index)?.map(|v| decode_u64(Some(v))),
                    };
                    if current == Some(id) {
                        newest_index.remove(&index);
                        batch.remove(index);
                    }
                }
                count -= 1;
                bytes -= len;
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "telemetry sample store full: dropped the oldest samples"
            );
            batch.insert(
                DROPPED_SAMPLES,
                &encode_u64(self.meta(DROPPED_SAMPLES)? + dropped)[..],
            );
        }
        self.db.apply_batch(batch)?;
        state.samples = count;
        state.sample_bytes = bytes;
        Ok(())
    }

    /// Sets the label of a queued sample of `model` with `request_id` that
    /// is not yet attached to a report; false if there is none.
    pub fn label_sample(&self, model: &str, request_id: &str, label: i64) -> anyhow::Result<bool> {
        let mut state = self.lock();
        let Some(id) = self.db.get(index_key(model, request_id))? else {
            return Ok(false);
        };
        let id = decode_u64(Some(id));
        if self.attached()?.is_some_and(|(_, ids)| ids.contains(&id)) {
            return Ok(false);
        }
        let Some(raw) = self.db.get(key(SAMPLE, id))? else {
            return Ok(false);
        };
        let mut sample = pb::Sample::decode(raw.as_ref())?;
        sample.label = Some(label);
        let new = sample.encode_to_vec();
        state.sample_bytes = state.sample_bytes + new.len() as u64 - raw.len() as u64;
        self.db.insert(key(SAMPLE, id), new)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_batches: 3,
            max_samples: 4,
            max_sample_bytes: 1 << 20,
            samples_per_batch: 2,
            sample_bytes_per_batch: 1 << 20,
        }
    }

    fn sample(id: &str) -> pb::Sample {
        pb::Sample {
            kind: pb::SampleKind::HardExample as i32,
            model_name: "m".into(),
            model_version: "1".into(),
            request_id: id.into(),
            ..Default::default()
        }
    }

    fn ids(r: &pb::TelemetryReport) -> Vec<&str> {
        r.samples.iter().map(|s| s.request_id.as_str()).collect()
    }

    #[test]
    fn sequences_survive_reopening_and_acks_delete() {
        let dir = tempfile::tempdir().unwrap();
        {
            let b = Buffer::open(dir.path(), limits()).unwrap();
            assert_eq!(b.push(Default::default()).unwrap(), 1);
            assert_eq!(b.push(Default::default()).unwrap(), 2);
        }
        let b = Buffer::open(dir.path(), limits()).unwrap();
        assert_eq!(b.pending().unwrap(), vec![1, 2]);
        assert_eq!(b.push(Default::default()).unwrap(), 3);
        assert_eq!(b.head().unwrap().unwrap().sequence, 1);
        assert_eq!(b.ack(2).unwrap(), 2);
        assert_eq!(b.pending().unwrap(), vec![3]);
        assert_eq!(b.stats().unwrap().batches, 1);
    }

    #[test]
    fn a_buffer_keeps_its_epoch_a_new_one_gets_another_and_an_old_one_zero() {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let b = Buffer::open(dir.path(), limits()).unwrap();
            b.push(Default::default()).unwrap();
            assert_ne!(b.epoch(), 0);
            assert_eq!(b.head().unwrap().unwrap().epoch, b.epoch());
            b.epoch()
        };
        // Reopened: the same epoch, on every report.
        let b = Buffer::open(dir.path(), limits()).unwrap();
        assert_eq!(b.epoch(), first);
        assert!(b.reports().iter().all(|r| r.epoch == first));
        drop(b);
        // Lost and made again: sequences restart, under another epoch.
        std::fs::remove_dir_all(dir.path()).unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        assert_ne!(b.epoch(), first);
        assert_eq!(b.push(Default::default()).unwrap(), 1);
        drop(b);
        // A buffer from before epochs (sequences, no epoch) keeps 0, so its
        // reports still meet their first copies at the control plane.
        let old = tempfile::tempdir().unwrap();
        {
            let db = open_db(old.path()).unwrap();
            db.insert(NEXT_SEQUENCE, &encode_u64(8)[..]).unwrap();
            db.flush().unwrap();
        }
        let b = Buffer::open(old.path(), limits()).unwrap();
        assert_eq!(b.epoch(), 0);
        assert_eq!(b.push(Default::default()).unwrap(), 8);
    }

    #[test]
    fn the_cap_drops_the_oldest_and_the_count_carries_over() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        for _ in 0..5 {
            b.push(Default::default()).unwrap();
        }
        // 1 and 2 were dropped when 4 and 5 came; 4 reports one drop, 5 one.
        assert_eq!(b.pending().unwrap(), vec![3, 4, 5]);
        // Two more: 3 and 4 go, and 4's report of its drop carries over.
        b.push(Default::default()).unwrap();
        b.push(Default::default()).unwrap();
        assert_eq!(b.pending().unwrap(), vec![5, 6, 7]);
        let total: u64 = [5, 6, 7]
            .iter()
            .map(|&s| {
                let raw = b.db.get(key(BATCH, s)).unwrap().unwrap();
                pb::TelemetryReport::decode(raw.as_ref())
                    .unwrap()
                    .dropped_batches
            })
            .sum();
        assert_eq!(total, 4, "every dropped batch is reported exactly once");
    }

    #[test]
    fn the_batch_in_flight_is_never_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        for _ in 0..3 {
            b.push(Default::default()).unwrap();
        }
        assert_eq!(b.head().unwrap().unwrap().sequence, 1);
        b.push(Default::default()).unwrap();
        assert_eq!(b.pending().unwrap(), vec![1, 3, 4]);
        b.send_failed();
        b.push(Default::default()).unwrap();
        assert_eq!(b.pending().unwrap(), vec![3, 4, 5]);
    }

    #[test]
    fn samples_attach_to_the_head_once_and_go_with_its_ack() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        b.add_samples(vec![sample("a"), sample("b"), sample("c")])
            .unwrap();
        b.push(Default::default()).unwrap();
        let first = b.head().unwrap().unwrap();
        assert_eq!(ids(&first), vec!["a", "b"]);
        b.send_failed();
        // A retry sends the same report, even with newer samples queued.
        b.add_samples(vec![sample("d")]).unwrap();
        assert!(b.label_sample("m", "c", 1).unwrap());
        assert!(!b.label_sample("m", "a", 1).unwrap(), "attached: unchanged");
        assert_eq!(b.head().unwrap().unwrap(), first);
        b.ack(1).unwrap();
        assert_eq!(b.stats().unwrap().samples, 2);
        b.push(Default::default()).unwrap();
        let next = b.head().unwrap().unwrap();
        assert_eq!(ids(&next), vec!["c", "d"]);
        assert_eq!(next.samples[0].label, Some(1));
    }

    #[test]
    fn the_sample_cap_drops_the_oldest_unattached() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        b.add_samples(vec![sample("a"), sample("b")]).unwrap();
        b.push(Default::default()).unwrap();
        b.head().unwrap(); // attaches a, b
        b.add_samples((0..4).map(|i| sample(&format!("n{i}"))).collect())
            .unwrap();
        let stats = b.stats().unwrap();
        assert_eq!((stats.samples, stats.unreported_dropped_samples), (4, 2));
        b.ack(1).unwrap();
        b.push(Default::default()).unwrap();
        let r = b.head().unwrap().unwrap();
        assert_eq!(ids(&r), vec!["n2", "n3"]);
        assert_eq!(r.dropped_samples, 2);
    }

    #[test]
    fn a_rejected_batch_is_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        b.add_samples(vec![sample("a")]).unwrap();
        b.push(Default::default()).unwrap();
        b.head().unwrap();
        b.reject(1).unwrap();
        b.push(Default::default()).unwrap();
        let r = b.head().unwrap().unwrap();
        assert_eq!((r.sequence, r.dropped_batches, ids(&r)), (2, 1, vec!["a"]));
    }

    #[test]
    fn a_corrupt_batch_is_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        b.push(Default::default()).unwrap();
        b.push(Default::default()).unwrap();
        b.db.insert(key(BATCH, 1), &[0xff, 0xff, 0xff][..]).unwrap();
        assert_eq!(b.head().unwrap().unwrap().sequence, 2);
        b.ack(2).unwrap();
        assert_eq!(b.stats().unwrap().unreported_dropped_batches, 1);
    }

    #[test]
    fn an_ack_past_our_sequence_skips_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let b = Buffer::open(dir.path(), limits()).unwrap();
        b.push(Default::default()).unwrap();
        b.ack(41).unwrap();
        assert_eq!(b.push(Default::default()).unwrap(), 42);
    }
}
