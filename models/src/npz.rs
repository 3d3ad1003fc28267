//! `.npz` data sets: one array per model input, keyed by the input name.
//!
//! An `.npz` file is a zip archive (stored by `np.savez`, deflated by
//! `np.savez_compressed`) of `.npy` blobs, one per array, named `<key>.npy`.
//! Calibration and evaluation sets are read from them; an evaluation set also
//! holds `label` (int64 class ids).
//!
//! Both formats arrive from outside, so every size in them is untrusted: a
//! declared size is compared with the bytes actually present before anything
//! of that size is allocated, and every failure is an error naming the array
//! at fault, never a panic.
//!
//! Decisions:
//! - Fortran-ordered arrays are read, and converted to C order (standard
//!   layout), because NumPy writes one whenever it saves a transposed array
//!   (`np.savez(f, x=a.T)`), and callers (ONNX Runtime inputs) expect C order.
//! - Big-endian arrays (`'>f4'`) are read and converted to native values.
//!   Writing is always little-endian, C order, like NumPy on every platform
//!   we run on.
//! - Writing stores entries uncompressed with a fixed timestamp and mode, so
//!   the same arrays always give the same bytes (and the same sha256).

use std::collections::HashSet;
use std::io::{self, Cursor, Read, Write};
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn, ShapeBuilder};
use zip::result::ZipError;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipArchive, ZipWriter};

use crate::tensor::{DType, Tensor};

const NPY_MAGIC: &[u8] = b"\x93NUMPY";
const NPY_SUFFIX: &str = ".npy";
/// NumPy pads headers so the data starts on a 64-byte boundary; we do the
/// same so our files are laid out like NumPy's.
const HEADER_ALIGN: usize = 64;
/// Headers are tiny dict literals; deeper nesting is only ever an attack on
/// the recursive parser's stack.
const MAX_LITERAL_DEPTH: usize = 16;
/// Deflate cannot expand input more than 1032:1 (a 258-byte match per two
/// bits), so a larger declared size is a lie.
const DEFLATE_MAX_RATIO: u64 = 1032;
/// Slack over that ratio for the fixed overhead of tiny streams.
const DEFLATE_SLACK: u64 = 1024;
/// The most an archive may hold once decompressed, all arrays together
/// (the deflate ratio bounds each entry, not their sum: a 100 MB archive
/// could otherwise ask for 100 GB). Far above the largest data set here
/// (MNIST's snapshot is under 200 MB); [`Npz::from_bytes_limited`] takes
/// another bound.
pub const MAX_DECOMPRESSED_BYTES: u64 = 4 << 30;
/// Data sets are not secrets.
const FILE_MODE: u32 = 0o644;
/// Elements are encoded into a buffer of this size before being written, so
/// the zip writer is not called once per element.
const ENCODE_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NpzError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("zip archive: {0}")]
    Zip(#[source] ZipError),
    #[error("zip entry for array `{key}`: {source}")]
    ZipEntry {
        key: String,
        #[source]
        source: ZipError,
    },
    #[error("zip entry for array `{key}` is corrupt: {reason}")]
    CorruptEntry { key: String, reason: String },
    #[error("array `{key}` is not a .npy array: {reason}")]
    NotNpy { key: String, reason: String },
    #[error(
        "array `{key}` has unsupported dtype {descr} \
         (supported: <f2 <f4 <f8 |i1 |u1 <i4 <i8 |b1, or big-endian '>')"
    )]
    UnsupportedDType { key: String, descr: String },
    #[error("array `{key}` with shape {shape:?}: {reason}")]
    ShapeMismatch {
        key: String,
        shape: Vec<u64>,
        reason: String,
    },
    #[error("array `{key}` is truncated: needs {needed} bytes, has {available}")]
    Truncated {
        key: String,
        needed: u64,
        available: u64,
    },
    #[error("array `{key}`: element {index} is byte {byte:#04x}, not a bool (0 or 1)")]
    InvalidBool { key: String, index: usize, byte: u8 },
    #[error("no array `{key}` in the data set; {}", describe_available(available))]
    MissingKey { key: String, available: Vec<String> },
    #[error("array `{key}` appears more than once")]
    DuplicateKey { key: String },
    #[error("invalid array name {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error(
        "the archive would hold over {max} bytes decompressed (array `{key}` declares {declared} \
         more after {so_far}); refusing it"
    )]
    TooLarge {
        key: String,
        declared: u64,
        so_far: u64,
        max: u64,
    },
}

fn describe_available(available: &[String]) -> String {
    if available.is_empty() {
        "it holds no arrays".to_owned()
    } else {
        format!("it holds: {}", available.join(", "))
    }
}

/// Named arrays, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Npz {
    // A Vec, not a map: data sets hold a handful of arrays, and file order is
    // part of what round-trips.
    arrays: Vec<(String, Tensor)>,
}

impl Npz {
    pub fn new() -> Npz {
        Npz::default()
    }

    pub fn read(path: &Path) -> Result<Npz, NpzError> {
        let bytes = std::fs::read(path).map_err(|source| NpzError::Io {
            path: path.to_owned(),
            source,
        })?;
        Npz::from_bytes(&bytes)
    }

    /// Reads an archive of at most [`MAX_DECOMPRESSED_BYTES`] decompressed.
    pub fn from_bytes(bytes: &[u8]) -> Result<Npz, NpzError> {
        Npz::from_bytes_limited(bytes, MAX_DECOMPRESSED_BYTES)
    }

    /// [`from_bytes`](Self::from_bytes), refusing an archive whose arrays
    /// declare more than `max` bytes together before any is read.
    pub fn from_bytes_limited(bytes: &[u8], max: u64) -> Result<Npz, NpzError> {
        let mut archive = ZipArchive::new(Cursor::new(bytes)).map_err(NpzError::Zip)?;
        reject_duplicate_entries(bytes, archive.central_directory_start())?;
        let mut npz = Npz::new();
        // A set, not `get`: an archive may hold many entries, and the check
        // must not be quadratic.
        let mut keys = HashSet::new();
        // Declared sizes are checked against what arrives (read_entry), so
        // their sum bounds what is decompressed.
        let mut total: u64 = 0;
        for index in 0..archive.len() {
            let name = archive.name_for_index(index).unwrap_or_default().to_owned();
            let key = key_for_entry(&name)?;
            if !keys.insert(key.clone()) {
                return Err(NpzError::DuplicateKey { key });
            }
            let declared = archive
                .by_index_raw(index)
                .map_err(|source| NpzError::ZipEntry {
                    key: key.clone(),
                    source,
                })?
                .size();
            match total.checked_add(declared) {
                Some(t) if t <= max => total = t,
                _ => {
                    return Err(NpzError::TooLarge {
                        key,
                        declared,
                        so_far: total,
                        max,
                    })
                }
            }
            let data = read_entry(&mut archive, index, &key, bytes.len())?;
            let tensor = parse_npy(&key, &data)?;
            npz.arrays.push((key, tensor));
        }
        Ok(npz)
    }

    /// Writes the archive so that a reader sees the old file or the new one,
    /// never a torn one.
    pub fn write(&self, path: &Path) -> Result<(), NpzError> {
        let bytes = self.to_bytes()?;
        crate::fs::write_atomic(path, &bytes, FILE_MODE).map_err(|source| NpzError::Io {
            path: path.to_owned(),
            source,
        })
    }

    /// The archive as `np.savez` lays it out: one stored `<key>.npy` per array.
    pub fn to_bytes(&self) -> Result<Vec<u8>, NpzError> {
        let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
        for (key, tensor) in &self.arrays {
            if key.is_empty() {
                return Err(NpzError::InvalidKey {
                    key: key.clone(),
                    reason: "array names must not be empty",
                });
            }
            let entry_error = |source| NpzError::ZipEntry {
                key: key.clone(),
                source,
            };
            let options = SimpleFileOptions::default()
                .compression_method(CompressionMethod::Stored)
                .last_modified_time(DateTime::default())
                .unix_permissions(FILE_MODE)
                .large_file(npy_len(tensor) >= u64::from(u32::MAX));
            zip.start_file(format!("{key}{NPY_SUFFIX}"), options)
                .map_err(entry_error)?;
            write_npy_to(tensor, &mut zip).map_err(|e| entry_error(ZipError::Io(e)))?;
        }
        Ok(zip.finish().map_err(NpzError::Zip)?.into_inner())
    }

    /// Adds an array, or replaces the one of that name where it stands.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        let name = name.into();
        match self.arrays.iter_mut().find(|(n, _)| *n == name) {
            Some((_, slot)) => *slot = t,
            None => self.arrays.push((name, t)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.arrays.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Like [`Npz::get`], but a missing array is an error that names it and
    /// lists what the data set does hold.
    pub fn require(&self, name: &str) -> Result<&Tensor, NpzError> {
        self.get(name).ok_or_else(|| NpzError::MissingKey {
            key: name.to_owned(),
            available: self.names().map(str::to_owned).collect(),
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.arrays.iter().map(|(n, _)| n.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.arrays.iter().map(|(n, t)| (n.as_str(), t))
    }

    pub fn len(&self) -> usize {
        self.arrays.len()
    }

    pub fn is_empty(&self) -> bool {
        self.arrays.is_empty()
    }
}

fn key_for_entry(name: &str) -> Result<String, NpzError> {
    let key = name.strip_suffix(NPY_SUFFIX).unwrap_or(name);
    if key.is_empty() {
        return Err(NpzError::InvalidKey {
            key: name.to_owned(),
            reason: "array names must not be empty",
        });
    }
    Ok(key.to_owned())
}

/// The zip crate keeps only one of several entries with the same name, so a
/// crafted archive could show different arrays to different readers. We walk
/// the central directory ourselves to refuse that.
fn reject_duplicate_entries(bytes: &[u8], directory_start: u64) -> Result<(), NpzError> {
    const SIGNATURE: &[u8] = b"PK\x01\x02";
    const FIXED_LEN: usize = 46;
    let mut seen = HashSet::new();
    let mut pos = usize::try_from(directory_start).unwrap_or(usize::MAX);
    while let Some(header) = bytes.get(pos..pos.saturating_add(FIXED_LEN)) {
        if &header[..4] != SIGNATURE {
            break;
        }
        let field = |at: usize| usize::from(u16::from_le_bytes([header[at], header[at + 1]]));
        let (name_len, extra_len, comment_len) = (field(28), field(30), field(32));
        let name_start = pos + FIXED_LEN;
        let Some(name) = bytes.get(name_start..name_start + name_len) else {
            break;
        };
        let name = String::from_utf8_lossy(name);
        let key = name.strip_suffix(NPY_SUFFIX).unwrap_or(&name).to_owned();
        if !seen.insert(key.clone()) {
            return Err(NpzError::DuplicateKey { key });
        }
        pos = name_start + name_len + extra_len + comment_len;
    }
    Ok(())
}

/// Reads one entry in full, trusting its declared size only as an upper
/// bound: the buffer grows with the bytes that actually arrive.
fn read_entry(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    index: usize,
    key: &str,
    input_len: usize,
) -> Result<Vec<u8>, NpzError> {
    let corrupt = |reason: String| NpzError::CorruptEntry {
        key: key.to_owned(),
        reason,
    };
    let entry = archive
        .by_index(index)
        .map_err(|source| NpzError::ZipEntry {
            key: key.to_owned(),
            source,
        })?;
    let declared = entry.size();
    let compressed = entry.compressed_size();
    match entry.compression() {
        CompressionMethod::Stored if declared != compressed => {
            return Err(corrupt(format!(
                "stored entry declares {declared} bytes but holds {compressed}"
            )));
        }
        CompressionMethod::Deflated
            if declared
                > compressed
                    .saturating_mul(DEFLATE_MAX_RATIO)
                    .saturating_add(DEFLATE_SLACK) =>
        {
            return Err(corrupt(format!(
                "declares {declared} bytes from {compressed} deflated bytes, \
                 more than deflate can expand to"
            )));
        }
        _ => {}
    }
    let reserve = usize::try_from(declared)
        .unwrap_or(usize::MAX)
        .min(input_len);
    let mut data = Vec::with_capacity(reserve);
    // One byte past the declared size tells us the entry lied about it.
    entry
        .take(declared.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| corrupt(e.to_string()))?;
    let actual = data.len() as u64;
    if actual < declared {
        return Err(NpzError::Truncated {
            key: key.to_owned(),
            needed: declared,
            available: actual,
        });
    }
    if actual > declared {
        return Err(corrupt(format!(
            "holds more than the {declared} bytes it declares"
        )));
    }
    Ok(data)
}

/// An element type as it is laid out in a `.npy` blob.
trait Element: Copy {
    const SIZE: usize;
    fn put_le(self, out: &mut Vec<u8>);
    /// `chunk` is exactly `SIZE` bytes long.
    fn from_chunk(chunk: &[u8], big_endian: bool) -> Self;
}

macro_rules! element {
    ($t:ty, $n:expr) => {
        impl Element for $t {
            const SIZE: usize = $n;

            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }

            fn from_chunk(chunk: &[u8], big_endian: bool) -> Self {
                let mut bytes = [0u8; $n];
                bytes.copy_from_slice(chunk);
                if big_endian {
                    <$t>::from_be_bytes(bytes)
                } else {
                    <$t>::from_le_bytes(bytes)
                }
            }
        }
    };
}

element!(f32, 4);
element!(f64, 8);
element!(half::f16, 2);
element!(i8, 1);
element!(u8, 1);
element!(i32, 4);
element!(i64, 8);

impl Element for bool {
    const SIZE: usize = 1;

    fn put_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }

    // Reading goes through `decode_bools`, which refuses bytes other than 0
    // and 1 instead of guessing.
    fn from_chunk(chunk: &[u8], _big_endian: bool) -> Self {
        chunk.first().is_some_and(|&b| b != 0)
    }
}

/// The dtype's `descr` without its byte-order character.
fn type_code(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f4",
        DType::F64 => "f8",
        DType::F16 => "f2",
        DType::I8 => "i1",
        DType::U8 => "u1",
        DType::I32 => "i4",
        DType::I64 => "i8",
        DType::Bool => "b1",
    }
}

/// `'<f4'`, `'>i8'`, `'|u1'`: the dtype and whether it is big-endian.
/// Native order (`'='`, or `'|'` on a multi-byte type) is refused: it means
/// whatever the writer's machine was, which the file does not say.
fn parse_descr(descr: &str) -> Option<(DType, bool)> {
    let (order, code) = descr.split_at_checked(1)?;
    let dtype = DType::ALL.into_iter().find(|&d| type_code(d) == code)?;
    let big_endian = match (order, dtype.size_bytes()) {
        ("<", _) => false,
        (">", _) => true,
        ("|", 1) => false,
        _ => return None,
    };
    Some((dtype, big_endian))
}

fn write_descr(dtype: DType) -> String {
    let order = if dtype.size_bytes() == 1 { '|' } else { '<' };
    format!("{order}{}", type_code(dtype))
}

/// Parses one `.npy` blob: format versions 1.0, 2.0 and 3.0; little-,
/// big-endian and byte types; C or Fortran order (returned in C order);
/// 0-d and empty arrays. `key` names the array in errors.
pub fn parse_npy(key: &str, bytes: &[u8]) -> Result<Tensor, NpzError> {
    let not_npy = |reason: String| NpzError::NotNpy {
        key: key.to_owned(),
        reason,
    };
    let truncated = |needed: u64| NpzError::Truncated {
        key: key.to_owned(),
        needed,
        available: bytes.len() as u64,
    };
    if bytes.get(..NPY_MAGIC.len()) != Some(NPY_MAGIC) {
        return Err(not_npy("missing the \\x93NUMPY magic".to_owned()));
    }
    let (Some(&major), Some(&minor)) = (bytes.get(6), bytes.get(7)) else {
        return Err(truncated(8));
    };
    let (len_bytes, utf8) = match (major, minor) {
        (1, 0) => (2, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => {
            return Err(not_npy(format!(
                "unsupported format version {major}.{minor}"
            )))
        }
    };
    let preamble = 8 + len_bytes;
    let Some(len_field) = bytes.get(8..preamble) else {
        return Err(truncated(preamble as u64));
    };
    let header_len = len_field
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    // Saturating: on 32-bit targets a 4 GiB length must read as truncated,
    // not wrap.
    let data_start = preamble.saturating_add(header_len);
    let Some(header) = bytes.get(preamble..data_start) else {
        return Err(truncated(data_start as u64));
    };
    // Versions 1 and 2 are latin-1; 3 is UTF-8.
    let header = if utf8 {
        std::str::from_utf8(header)
            .map_err(|e| not_npy(format!("header is not UTF-8: {e}")))?
            .to_owned()
    } else {
        header.iter().map(|&b| char::from(b)).collect()
    };
    let header = parse_header(key, &header)?;
    let shape_error = |reason: String| NpzError::ShapeMismatch {
        key: key.to_owned(),
        shape: header.shape.clone(),
        reason,
    };

    let size = header.dtype.size_bytes() as u64;
    let data_len = header
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|count| count.checked_mul(size))
        .ok_or_else(|| shape_error("has more bytes than fit in 64 bits".to_owned()))?;
    let needed = (data_start as u64)
        .checked_add(data_len)
        .ok_or_else(|| shape_error("has more bytes than fit in 64 bits".to_owned()))?;
    let available = bytes.len() as u64;
    if available < needed {
        return Err(truncated(needed));
    }
    if available > needed {
        return Err(shape_error(format!(
            "needs {data_len} data bytes of {}, but {} follow the header",
            header.dtype,
            available - data_start as u64
        )));
    }
    let data = &bytes[data_start..];
    let dims = header
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| shape_error("does not fit in memory addresses".to_owned()))?;

    let (big_endian, fortran) = (header.big_endian, header.fortran_order);
    let shape_refused = |e: ndarray::ShapeError| shape_error(e.to_string());
    Ok(match header.dtype {
        DType::F32 => {
            Tensor::F32(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::F64 => {
            Tensor::F64(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::F16 => {
            Tensor::F16(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::I8 => {
            Tensor::I8(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::U8 => {
            Tensor::U8(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::I32 => {
            Tensor::I32(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::I64 => {
            Tensor::I64(to_array(decode(data, big_endian), &dims, fortran).map_err(shape_refused)?)
        }
        DType::Bool => {
            Tensor::Bool(to_array(decode_bools(key, data)?, &dims, fortran).map_err(shape_refused)?)
        }
    })
}

fn decode<T: Element>(data: &[u8], big_endian: bool) -> Vec<T> {
    data.chunks_exact(T::SIZE)
        .map(|chunk| T::from_chunk(chunk, big_endian))
        .collect()
}

fn decode_bools(key: &str, data: &[u8]) -> Result<Vec<bool>, NpzError> {
    data.iter()
        .enumerate()
        .map(|(index, &byte)| match byte {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(NpzError::InvalidBool {
                key: key.to_owned(),
                index,
                byte,
            }),
        })
        .collect()
}

/// `values` holds exactly the product of `dims` elements; ndarray still
/// checks, and refuses shapes whose non-zero axes overflow `isize`.
fn to_array<T: Clone>(
    values: Vec<T>,
    dims: &[usize],
    fortran: bool,
) -> Result<ArrayD<T>, ndarray::ShapeError> {
    let array = if fortran {
        ArrayD::from_shape_vec(IxDyn(dims).f(), values)?
    } else {
        ArrayD::from_shape_vec(IxDyn(dims), values)?
    };
    Ok(if array.is_standard_layout() {
        array
    } else {
        array.as_standard_layout().into_owned()
    })
}

struct Header {
    dtype: DType,
    big_endian: bool,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// The header is a Python dict literal with exactly the keys `descr`,
/// `fortran_order` and `shape`, as NumPy requires.
fn parse_header(key: &str, text: &str) -> Result<Header, NpzError> {
    let not_npy = |reason: String| NpzError::NotNpy {
        key: key.to_owned(),
        reason: format!("header {reason}"),
    };
    let entries = Parser::new(text).header_dict().map_err(not_npy)?;
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    for (name, value, raw) in entries {
        let slot = match name.as_str() {
            "descr" => &mut descr,
            "fortran_order" => &mut fortran_order,
            "shape" => &mut shape,
            _ => return Err(not_npy(format!("has unexpected key {name:?}"))),
        };
        if slot.replace((value, raw)).is_some() {
            return Err(not_npy(format!("repeats key {name:?}")));
        }
    }
    let missing = |name: &str| not_npy(format!("lacks key {name:?}"));
    let (descr, raw_descr) = descr.ok_or_else(|| missing("descr"))?;
    let (fortran_order, _) = fortran_order.ok_or_else(|| missing("fortran_order"))?;
    let (shape, raw_shape) = shape.ok_or_else(|| missing("shape"))?;

    let unsupported = || NpzError::UnsupportedDType {
        key: key.to_owned(),
        descr: raw_descr.to_owned(),
    };
    let (dtype, big_endian) = match descr {
        Literal::Str(s) => parse_descr(&s).ok_or_else(unsupported)?,
        _ => return Err(unsupported()),
    };
    let Literal::Bool(fortran_order) = fortran_order else {
        return Err(not_npy("has a non-bool fortran_order".to_owned()));
    };
    let Literal::Tuple(dims) = shape else {
        return Err(not_npy(format!("has shape {raw_shape}, not a tuple")));
    };
    let shape = dims
        .into_iter()
        .map(|d| match d {
            Literal::Int(Some(n)) => Ok(n),
            _ => Err(not_npy(format!(
                "has shape {raw_shape}: dimensions must be integers in 0..2^64"
            ))),
        })
        .collect::<Result<Vec<u64>, _>>()?;
    Ok(Header {
        dtype,
        big_endian,
        fortran_order,
        shape,
    })
}

/// The subset of Python literals that `.npy` headers use.
#[derive(Debug, PartialEq)]
enum Literal {
    Str(String),
    Bool(bool),
    None,
    /// `None` when negative or beyond `u64`.
    Int(Option<u64>),
    Tuple(Vec<Literal>),
    // Lists and dicts are parsed (a structured dtype is a list) but their
    // contents are never needed.
    List,
    Dict,
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text,
            pos: 0,
            depth: 0,
        }
    }

    /// The top-level dict, with each value's source text for error messages.
    fn header_dict(mut self) -> Result<Vec<(String, Literal, &'a str)>, String> {
        self.skip_space();
        self.expect(b'{')?;
        let mut entries = Vec::new();
        loop {
            self.skip_space();
            if self.eat(b'}') {
                break;
            }
            let Literal::Str(name) = self.value()? else {
                return Err("has a key that is not a string".to_owned());
            };
            self.skip_space();
            self.expect(b':')?;
            self.skip_space();
            let start = self.pos;
            let value = self.value()?;
            entries.push((name, value, &self.text[start..self.pos]));
            self.skip_space();
            if !self.eat(b',') {
                self.skip_space();
                self.expect(b'}')?;
                break;
            }
        }
        self.skip_space();
        if self.pos != self.text.len() {
            return Err(format!("has trailing text at byte {}", self.pos));
        }
        Ok(entries)
    }

    fn value(&mut self) -> Result<Literal, String> {
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => self.string(q),
            Some(b'(') => self.nested(|p| p.sequence(b')').map(seq_to_tuple)),
            Some(b'[') => self.nested(|p| p.sequence(b']').map(|_| Literal::List)),
            Some(b'{') => self.nested(Parser::dict),
            Some(b'-' | b'0'..=b'9') => Ok(self.int()),
            Some(b) if b.is_ascii_alphabetic() => self.word(),
            Some(b) => Err(format!(
                "has unexpected {:?} at byte {}",
                char::from(b),
                self.pos
            )),
            None => Err("ends early".to_owned()),
        }
    }

    fn nested(
        &mut self,
        parse: impl FnOnce(&mut Self) -> Result<Literal, String>,
    ) -> Result<Literal, String> {
        self.depth += 1;
        if self.depth > MAX_LITERAL_DEPTH {
            return Err(format!("nests deeper than {MAX_LITERAL_DEPTH}"));
        }
        self.pos += 1; // the opening bracket
        let value = parse(self);
        self.depth -= 1;
        value
    }

    /// Items up to `close`, and whether a comma followed the last one (which
    /// makes `(x,)` a tuple where `(x)` is just `x`).
    fn sequence(&mut self, close: u8) -> Result<(Vec<Literal>, bool), String> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            if self.eat(close) {
                return Ok((items, true));
            }
            items.push(self.value()?);
            self.skip_space();
            if !self.eat(b',') {
                self.expect(close)?;
                return Ok((items, false));
            }
        }
    }

    fn dict(&mut self) -> Result<Literal, String> {
        loop {
            self.skip_space();
            if self.eat(b'}') {
                return Ok(Literal::Dict);
            }
            self.value()?;
            self.skip_space();
            self.expect(b':')?;
            self.skip_space();
            self.value()?;
            self.skip_space();
            if !self.eat(b',') {
                self.expect(b'}')?;
                return Ok(Literal::Dict);
            }
        }
    }

    /// Backslash escapes keep the next character as-is: enough for the names
    /// and dtype strings NumPy writes, and an odd escape can only make a
    /// header we refuse anyway.
    fn string(&mut self, quote: u8) -> Result<Literal, String> {
        let start = self.pos;
        let mut out = String::new();
        let mut chars = self.text[start + 1..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, escaped)) => out.push(escaped),
                    None => break,
                },
                c if c == char::from(quote) => {
                    self.pos = start + 1 + i + 1;
                    return Ok(Literal::Str(out));
                }
                c => out.push(c),
            }
        }
        Err(format!("has an unterminated string at byte {start}"))
    }

    /// Integers, with Python 2's `L` suffix that old NumPy wrote in shapes.
    fn int(&mut self) -> Literal {
        let negative = self.eat(b'-');
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits = &self.text[start..self.pos];
        if matches!(self.peek(), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        let value = digits.parse::<u64>().ok();
        Literal::Int(match value {
            Some(0) => Some(0),
            _ if negative => None,
            v => v,
        })
    }

    fn word(&mut self) -> Result<Literal, String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            self.pos += 1;
        }
        match &self.text[start..self.pos] {
            "True" => Ok(Literal::Bool(true)),
            "False" => Ok(Literal::Bool(false)),
            "None" => Ok(Literal::None),
            other => Err(format!("has unknown name {other:?}")),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let found = self.peek() == Some(b);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(format!("expects {:?} at byte {}", char::from(b), self.pos))
        }
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }
}

fn seq_to_tuple((mut items, trailing_comma): (Vec<Literal>, bool)) -> Literal {
    match items.pop() {
        // `(x)` is a parenthesised `x`, not a tuple.
        Some(only) if items.is_empty() && !trailing_comma => only,
        Some(last) => {
            items.push(last);
            Literal::Tuple(items)
        }
        None => Literal::Tuple(items),
    }
}

/// One `.npy` blob: version 1.0, little-endian, C order, as `np.save` writes.
/// (Version 2.0 only when the header outgrows 1.0's 64 KiB, as NumPy does;
/// that takes thousands of axes.)
pub fn write_npy(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::with_capacity(usize::try_from(npy_len(t)).unwrap_or(0));
    // Writing to a Vec cannot fail.
    let _ = write_npy_to(t, &mut out);
    out
}

fn npy_len(t: &Tensor) -> u64 {
    npy_header(t).len() as u64 + (t.len() as u64) * (t.dtype().size_bytes() as u64)
}

fn write_npy_to(t: &Tensor, out: &mut impl Write) -> io::Result<()> {
    out.write_all(&npy_header(t))?;
    crate::with_array!(t, a => write_elements(a.iter().copied(), out))
}

fn write_elements<T: Element>(
    values: impl Iterator<Item = T>,
    out: &mut impl Write,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(ENCODE_CHUNK);
    for v in values {
        v.put_le(&mut buf);
        if buf.len() >= ENCODE_CHUNK - 8 {
            out.write_all(&buf)?;
            buf.clear();
        }
    }
    out.write_all(&buf)
}

/// Magic, version, length and the dict, padded with spaces and a newline so
/// that the data starts on a 64-byte boundary.
fn npy_header(t: &Tensor) -> Vec<u8> {
    let shape = match t.shape() {
        [] => "()".to_owned(),
        [n] => format!("({n},)"),
        dims => {
            let dims: Vec<String> = dims.iter().map(ToString::to_string).collect();
            format!("({})", dims.join(", "))
        }
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        write_descr(t.dtype())
    );
    let padded_len = |preamble: usize| {
        let unpadded = preamble + dict.len() + 1;
        dict.len() + 1 + (HEADER_ALIGN - unpadded % HEADER_ALIGN) % HEADER_ALIGN
    };
    let v1_len = padded_len(10);
    let (version, len_field) = match u16::try_from(v1_len) {
        Ok(len) => (1u8, len.to_le_bytes().to_vec()),
        // A header of 4 GiB would need a billion axes, which no array in
        // memory has; saturating keeps this infallible.
        Err(_) => (
            2u8,
            u32::try_from(padded_len(12))
                .unwrap_or(u32::MAX)
                .to_le_bytes()
                .to_vec(),
        ),
    };
    let header_len = if version == 1 { v1_len } else { padded_len(12) };
    let mut out = Vec::with_capacity(8 + len_field.len() + header_len);
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[version, 0]);
    out.extend_from_slice(&len_field);
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + header_len - dict.len() - 1, b' ');
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn header_of(text: &str) -> Result<Header, NpzError> {
        parse_header("k", text)
    }

    #[test]
    fn the_arrays_together_are_bounded_before_any_is_read() {
        let mut npz = Npz::new();
        let row =
            |n: usize| Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[n]), vec![1.0; n]).unwrap());
        npz.insert("a", row(1000));
        npz.insert("b", row(1000));
        let bytes = npz.to_bytes().unwrap();
        // Each entry is ~4 KB: the whole reads within 16 KB, not within 6.
        assert_eq!(Npz::from_bytes_limited(&bytes, 16 << 10).unwrap(), npz);
        match Npz::from_bytes_limited(&bytes, 6 << 10) {
            Err(NpzError::TooLarge {
                key, so_far, max, ..
            }) => {
                assert_eq!((key.as_str(), max), ("b", 6 << 10));
                assert!(so_far > 4000, "{so_far}");
            }
            other => panic!("{other:?}"),
        }
        let e = Npz::from_bytes_limited(&bytes, 100).unwrap_err();
        assert!(e.to_string().contains("refusing"), "{e}");
    }

    #[test]
    fn descrs() {
        let cases = [
            ("<f4", Some((DType::F32, false))),
            (">f4", Some((DType::F32, true))),
            ("<f2", Some((DType::F16, false))),
            (">f8", Some((DType::F64, true))),
            ("|u1", Some((DType::U8, false))),
            ("<u1", Some((DType::U8, false))),
            ("|i1", Some((DType::I8, false))),
            ("|b1", Some((DType::Bool, false))),
            (">i8", Some((DType::I64, true))),
            ("<i4", Some((DType::I32, false))),
            ("|f4", None),
            ("=f4", None),
            ("<u4", None),
            ("<i2", None),
            ("<c8", None),
            ("<U3", None),
            ("|O", None),
            ("", None),
            ("<", None),
            ("é4", None),
        ];
        for (descr, want) in cases {
            assert_eq!(parse_descr(descr), want, "{descr}");
        }
        for d in DType::ALL {
            assert_eq!(parse_descr(&write_descr(d)), Some((d, false)));
        }
    }

    #[test]
    fn header_literal_forms() {
        let h =
            header_of("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }  \n").unwrap();
        assert_eq!(
            (h.dtype, h.big_endian, h.fortran_order, h.shape),
            (DType::F32, false, false, vec![2, 3])
        );
        let h = header_of("{\"shape\":(3L,),\"descr\":\">i8\",\"fortran_order\":True}").unwrap();
        assert_eq!(
            (h.dtype, h.big_endian, h.fortran_order, h.shape),
            (DType::I64, true, true, vec![3])
        );
        let h = header_of("{'descr': '|b1', 'fortran_order': False, 'shape': ()}").unwrap();
        assert!(h.shape.is_empty());
    }

    #[test]
    fn bad_headers_name_the_problem() {
        let cases = [
            (
                "{'descr': '<f4', 'fortran_order': False}",
                "lacks key \"shape\"",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
                "unexpected key",
            ),
            (
                "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
                "repeats key",
            ),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
                "non-bool",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}",
                "not a tuple",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': [3]}",
                "not a tuple",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
                "integers",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}",
                "integers",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
                "trailing",
            ),
            ("{'descr': '<f4", "unterminated"),
            ("", "expects '{'"),
            ("{1: 2}", "not a string"),
        ];
        for (text, want) in cases {
            let err = header_of(text).err().unwrap().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        let deep = format!(
            "{{'descr': {}1{}, 'fortran_order': False, 'shape': ()}}",
            "(".repeat(10_000),
            ")".repeat(10_000)
        );
        assert!(header_of(&deep)
            .err()
            .unwrap()
            .to_string()
            .contains("nests deeper"));
    }

    #[test]
    fn structured_descr_is_unsupported_and_quoted() {
        let err = header_of(
            "{'descr': [('a', '<f4'), ('b', '<i8')], 'fortran_order': False, 'shape': (1,)}",
        )
        .err()
        .unwrap();
        match err {
            NpzError::UnsupportedDType { key, descr } => {
                assert_eq!(key, "k");
                assert_eq!(descr, "[('a', '<f4'), ('b', '<i8')]");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn written_headers_are_aligned_and_parse() {
        for shape in [vec![], vec![0], vec![7], vec![2, 3, 4], vec![1; 40]] {
            let t = Tensor::I64(ArrayD::zeros(IxDyn(&shape)));
            let h = npy_header(&t);
            assert_eq!(h.len() % HEADER_ALIGN, 0, "{shape:?}");
            assert_eq!(h.last(), Some(&b'\n'));
            assert_eq!(npy_len(&t), write_npy(&t).len() as u64);
        }
    }

    #[test]
    fn many_axes_switch_to_version_2() {
        // Zero-length axes keep the array empty however many there are.
        let t = Tensor::U8(ArrayD::zeros(IxDyn(&vec![0; 40_000])));
        let bytes = write_npy(&t);
        assert_eq!(&bytes[6..8], &[2, 0]);
        assert_eq!(parse_npy("k", &bytes).unwrap(), t);
    }

    #[test]
    fn bools_other_than_0_and_1_are_refused() {
        let bytes = npy(
            "{'descr': '|b1', 'fortran_order': False, 'shape': (3,)}",
            &[1, 0, 2],
        );
        match parse_npy("mask", &bytes).err().unwrap() {
            NpzError::InvalidBool { key, index, byte } => {
                assert_eq!((key.as_str(), index, byte), ("mask", 2, 2))
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn fortran_order_is_read_into_c_order() {
        // Column-major 2x3 [[0,1,2],[3,4,5]] is stored as 0,3,1,4,2,5.
        let data: Vec<u8> = [0u8, 3, 1, 4, 2, 5].to_vec();
        let bytes = npy(
            "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3)}",
            &data,
        );
        let Tensor::U8(a) = parse_npy("k", &bytes).unwrap() else {
            panic!("not u8")
        };
        assert!(a.is_standard_layout());
        assert_eq!(a.as_slice().unwrap(), &[0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn zero_axes_beside_huge_ones_are_refused_not_allocated() {
        let bytes = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775807, 4)}",
            &[],
        );
        assert!(matches!(
            parse_npy("k", &bytes),
            Err(NpzError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn versions_and_lengths() {
        assert!(matches!(
            parse_npy("k", b"\x93NUMPY"),
            Err(NpzError::Truncated { needed: 8, .. })
        ));
        assert!(matches!(
            parse_npy("k", b"\x93NUMPY\x02\x00\x01"),
            Err(NpzError::Truncated { needed: 12, .. })
        ));
        assert!(matches!(
            parse_npy("k", b"\x93NUMPY\x01\x00\xff\xff{}"),
            Err(NpzError::Truncated { needed: 65545, .. })
        ));
        for v in [[4u8, 0], [1, 1], [0, 0]] {
            let mut b = b"\x93NUMPY".to_vec();
            b.extend_from_slice(&v);
            b.extend_from_slice(&[0; 8]);
            let err = parse_npy("k", &b).err().unwrap().to_string();
            assert!(err.contains("unsupported format version"), "{err}");
        }
        assert!(matches!(
            parse_npy("k", b"PK\x03\x04"),
            Err(NpzError::NotNpy { .. })
        ));
    }
}
