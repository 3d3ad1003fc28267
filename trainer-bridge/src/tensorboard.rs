//! TensorBoard-readable scalar event files, written by hand: a TFRecord
//! stream (length, masked CRC-32C of the length, data, masked CRC-32C of the
//! data) of `tensorflow.Event` protos. `tensorboard --logdir <job>/tensorboard`
//! reads them; no TensorFlow is needed to write them.

use std::io::Write;
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli), as TFRecord uses.
pub fn crc32c(data: &[u8]) -> u32 {
    const POLY: u32 = 0x82F6_3B78;
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// TFRecord's masking, so that CRCs of CRCs stay well distributed.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(field: u32, wire: u8, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | u64::from(wire), out);
}

fn bytes_field(field: u32, data: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

/// `Event { wall_time = 1 (double), step = 2 (int64), file_version = 3 |
/// summary = 5 }`, `Summary { repeated Value value = 1 }`,
/// `Value { tag = 1 (string), simple_value = 2 (float) }`.
pub fn event(
    wall_time: f64,
    step: i64,
    file_version: Option<&str>,
    scalars: &[(String, f32)],
) -> Vec<u8> {
    let mut e = Vec::new();
    key(1, 1, &mut e);
    e.extend_from_slice(&wall_time.to_le_bytes());
    key(2, 0, &mut e);
    varint(step as u64, &mut e);
    if let Some(v) = file_version {
        bytes_field(3, v.as_bytes(), &mut e);
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut v = Vec::new();
            bytes_field(1, tag.as_bytes(), &mut v);
            key(2, 5, &mut v);
            v.extend_from_slice(&value.to_le_bytes());
            bytes_field(1, &v, &mut summary);
        }
        bytes_field(5, &summary, &mut e);
    }
    e
}

/// One TFRecord frame around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// Appends scalar events to one events file per writer.
pub struct EventWriter {
    path: PathBuf,
}

impl EventWriter {
    /// Creates `<dir>/events.out.tfevents.<seconds>.edgeloop` with the
    /// file-version event TensorBoard expects first.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let path = dir.join(format!("events.out.tfevents.{}.edgeloop", now.as_secs()));
        let w = Self { path };
        w.append(&record(&event(
            now.as_secs_f64(),
            0,
            Some("brain.Event:2"),
            &[],
        )))?;
        Ok(w)
    }

    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(bytes)
    }

    pub fn scalars(
        &self,
        step: u64,
        scalars: &std::collections::BTreeMap<String, f64>,
    ) -> std::io::Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let values: Vec<(String, f32)> = scalars
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (k.clone(), *v as f32))
            .collect();
        self.append(&record(&event(
            now.as_secs_f64(),
            step as i64,
            None,
            &values,
        )))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads back the frames of an events file, checking both CRCs; for tests
/// and tools.
pub fn read_records(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = vec![];
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.len() < 12 {
            return Err("truncated header".into());
        }
        let (len_bytes, tail) = rest.split_at(8);
        let len = u64::from_le_bytes(len_bytes.try_into().map_err(|_| "header")?) as usize;
        let crc = u32::from_le_bytes(tail[..4].try_into().map_err(|_| "crc")?);
        if crc != masked_crc(len_bytes) {
            return Err("length CRC mismatch".into());
        }
        let tail = &tail[4..];
        if tail.len() < len + 4 {
            return Err("truncated record".into());
        }
        let (data, tail) = tail.split_at(len);
        let crc = u32::from_le_bytes(tail[..4].try_into().map_err(|_| "crc")?);
        if crc != masked_crc(data) {
            return Err("data CRC mismatch".into());
        }
        out.push(data.to_vec());
        rest = &tail[4..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_vectors() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // TFRecord's masked CRC of eight zero bytes (an empty record's length).
        assert_eq!(
            masked_crc(&0u64.to_le_bytes()),
            crc32c(&0u64.to_le_bytes())
                .rotate_right(15)
                .wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn events_round_trip_through_the_record_format() {
        let dir = tempfile::tempdir().unwrap();
        let w = EventWriter::create(dir.path()).unwrap();
        w.scalars(10, &[("loss".to_string(), 0.5)].into()).unwrap();
        w.scalars(
            20,
            &[("loss".to_string(), 0.25), ("acc".to_string(), 0.9)].into(),
        )
        .unwrap();
        let records = read_records(&std::fs::read(w.path()).unwrap()).unwrap();
        assert_eq!(records.len(), 3);
        assert!(records[0].windows(13).any(|x| x == b"brain.Event:2"));
        assert!(
            records[2].windows(4).any(|x| x == b"loss")
                && records[2].windows(3).any(|x| x == b"acc")
        );
        assert!(records[2].windows(4).any(|x| x == 0.25f32.to_le_bytes()));
        let mut corrupt = std::fs::read(w.path()).unwrap();
        let last = corrupt.len() - 6;
        corrupt[last] ^= 1;
        assert!(read_records(&corrupt).is_err());
    }
}
