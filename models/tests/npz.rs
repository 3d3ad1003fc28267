//! `.npz` reading and writing: round trips, files written by NumPy, and
//! hostile input.

// Test helpers outside `#[test]` functions are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used)]

use std::io::{Cursor, Write};
use std::path::PathBuf;

use edgeloop_models::npz::{parse_npy, write_npy, Npz, NpzError};
use edgeloop_models::{DType, Tensor};
use half::f16;
use ndarray::{arr1, arr2, ArrayD, IxDyn};
use proptest::prelude::*;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/npz")
        .join(name)
}

/// Distinct, exactly representable values, so a swapped or misplaced element
/// shows.
fn sample(dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let shape = IxDyn(shape);
    fn build<T>(shape: IxDyn, n: usize, f: impl Fn(usize) -> T) -> ArrayD<T> {
        ArrayD::from_shape_vec(shape, (0..n).map(f).collect()).unwrap()
    }
    match dtype {
        DType::F32 => Tensor::F32(build(shape, n, |i| i as f32 * 0.5 - 3.0)),
        DType::F64 => Tensor::F64(build(shape, n, |i| i as f64 * -0.25 + 1e10)),
        DType::F16 => Tensor::F16(build(shape, n, |i| {
            f16::from_f32((i % 2048) as f32 - 1024.0)
        })),
        DType::I8 => Tensor::I8(build(shape, n, |i| (i % 256) as u8 as i8)),
        DType::U8 => Tensor::U8(build(shape, n, |i| (i % 256) as u8)),
        DType::I32 => Tensor::I32(build(shape, n, |i| (i as i32).wrapping_mul(-65_537))),
        DType::I64 => Tensor::I64(build(shape, n, |i| (i as i64) * -(1 << 33) + 7)),
        DType::Bool => Tensor::Bool(build(shape, n, |i| i % 3 == 0)),
    }
}

fn zip_of(entries: &[(&str, &[u8])], method: CompressionMethod) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, data) in entries {
        let options = SimpleFileOptions::default().compression_method(method);
        zip.start_file(*name, options).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn npy_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&u16::try_from(header.len()).unwrap().to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn every_dtype_round_trips_in_every_shape() {
    let shapes: [&[usize]; 7] = [
        &[],
        &[0],
        &[0, 3],
        &[5],
        &[2, 3, 4],
        &[3, 0, 2],
        &[1, 1, 1, 7],
    ];
    let mut npz = Npz::new();
    for dtype in DType::ALL {
        for shape in shapes {
            let t = sample(dtype, shape);
            assert_eq!(
                parse_npy("t", &write_npy(&t)).unwrap(),
                t,
                "{dtype} {shape:?}"
            );
            npz.insert(format!("{dtype}{shape:?}"), t);
        }
    }
    let back = Npz::from_bytes(&npz.to_bytes().unwrap()).unwrap();
    assert_eq!(back, npz);
    assert_eq!(back.len(), DType::ALL.len() * shapes.len());
}

#[test]
fn large_and_high_rank_shapes_round_trip() {
    let mut npz = Npz::new();
    npz.insert("wide", sample(DType::F32, &[1000, 1000]));
    npz.insert("bytes", sample(DType::U8, &[3, 1 << 20]));
    npz.insert(
        "rank32",
        sample(DType::I64, &[[1; 30].as_slice(), &[2, 3]].concat()),
    );
    let back = Npz::from_bytes(&npz.to_bytes().unwrap()).unwrap();
    assert_eq!(back, npz);
}

#[test]
fn non_c_order_tensors_are_written_in_logical_order() {
    let c = arr2(&[[1i32, 2, 3], [4, 5, 6]]).into_dyn();
    let transposed = c.t().to_owned(); // Fortran layout in memory
    assert!(!transposed.is_standard_layout());
    let t = Tensor::I32(transposed.clone());
    let Tensor::I32(back) = parse_npy("t", &write_npy(&t)).unwrap() else {
        panic!("dtype changed")
    };
    assert_eq!(back, transposed);
    assert!(back.is_standard_layout());
}

#[test]
fn files_are_written_atomically_and_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calib.npz");
    let mut npz = Npz::new();
    npz.insert("input", sample(DType::F32, &[4, 3]));
    npz.insert("label", sample(DType::I64, &[4]));
    npz.write(&path).unwrap();
    npz.write(&path).unwrap();
    assert_eq!(Npz::read(&path).unwrap(), npz);
    assert_eq!(std::fs::read(&path).unwrap(), npz.to_bytes().unwrap());
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(entries.len(), 1, "temp files left behind");

    let err = Npz::read(&dir.path().join("absent.npz")).unwrap_err();
    assert!(matches!(err, NpzError::Io { .. }));
    assert!(err.to_string().contains("absent.npz"), "{err}");
}

#[test]
fn insert_replaces_in_place_and_names_keep_order() {
    let mut npz = Npz::new();
    assert!(npz.is_empty());
    npz.insert("b", sample(DType::U8, &[1]));
    npz.insert("a", sample(DType::U8, &[2]));
    npz.insert("b", sample(DType::I8, &[3]));
    assert_eq!(npz.names().collect::<Vec<_>>(), ["b", "a"]);
    assert_eq!(npz.get("b"), Some(&sample(DType::I8, &[3])));
    assert_eq!(
        npz.iter().map(|(n, t)| (n, t.len())).collect::<Vec<_>>(),
        [("b", 3), ("a", 2)]
    );
    let back = Npz::from_bytes(&npz.to_bytes().unwrap()).unwrap();
    assert_eq!(back.names().collect::<Vec<_>>(), ["b", "a"]);
}

#[test]
fn missing_key_names_it_and_lists_what_is_there() {
    let mut npz = Npz::new();
    npz.insert("input_ids", sample(DType::I64, &[2]));
    npz.insert("label", sample(DType::I64, &[2]));
    assert!(npz.require("label").is_ok());
    let err = npz.require("attention_mask").unwrap_err();
    match &err {
        NpzError::MissingKey { key, available } => {
            assert_eq!(key, "attention_mask");
            assert_eq!(available, &["input_ids", "label"]);
        }
        other => panic!("{other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("attention_mask") && msg.contains("input_ids, label"),
        "{msg}"
    );
    let msg = Npz::new().require("x").unwrap_err().to_string();
    assert!(msg.contains("no arrays"), "{msg}");
}

#[test]
fn numpy_savez_eval_set() {
    let npz = Npz::read(&fixture("eval_set.npz")).unwrap();
    assert_eq!(
        npz.names().collect::<Vec<_>>(),
        ["input", "label", "big_endian", "mask", "scalar", "fortran"]
    );
    assert_eq!(
        npz.require("input").unwrap(),
        &Tensor::F32(arr2(&[[0.0f32, 0.25, 0.5], [0.75, 1.0, 1.25]]).into_dyn())
    );
    assert_eq!(
        npz.require("label").unwrap(),
        &Tensor::I64(arr1(&[0i64, 2, 1, 7]).into_dyn())
    );
    assert_eq!(
        npz.require("big_endian").unwrap(),
        &Tensor::F32(arr1(&[1.5f32, -2.0, 3.25]).into_dyn())
    );
    assert_eq!(
        npz.require("mask").unwrap(),
        &Tensor::Bool(arr1(&[true, false, true, true]).into_dyn())
    );
    let scalar = npz.require("scalar").unwrap();
    assert_eq!(scalar.shape(), &[] as &[usize]);
    assert_eq!(scalar, &Tensor::F64(ArrayD::from_elem(IxDyn(&[]), 2.5)));
    // Saved from a transposed array, so NumPy wrote it in Fortran order.
    let Tensor::I32(fortran) = npz.require("fortran").unwrap() else {
        panic!("dtype")
    };
    assert_eq!(fortran, &arr2(&[[0i32, 3], [1, 4], [2, 5]]).into_dyn());
    assert!(fortran.is_standard_layout());
}

#[test]
fn numpy_savez_compressed_dtypes() {
    let bytes = std::fs::read(fixture("dtypes_compressed.npz")).unwrap();
    let mut archive = ZipArchive::new(Cursor::new(&bytes)).unwrap();
    for i in 0..archive.len() {
        let entry = archive.by_index(i).unwrap();
        assert_eq!(
            entry.compression(),
            CompressionMethod::Deflated,
            "{}",
            entry.name()
        );
    }
    let npz = Npz::from_bytes(&bytes).unwrap();
    let f16s = [0.5f32, -1.0, 65504.0].map(f16::from_f32);
    assert_eq!(
        npz.require("half").unwrap(),
        &Tensor::F16(arr1(&f16s).into_dyn())
    );
    assert_eq!(
        npz.require("u8").unwrap(),
        &Tensor::U8(arr1(&[250u8, 251, 252, 253, 254, 255]).into_dyn())
    );
    assert_eq!(
        npz.require("i8").unwrap(),
        &Tensor::I8(arr1(&[-128i8, -1, 0, 127]).into_dyn())
    );
    assert_eq!(
        npz.require("i32").unwrap(),
        &Tensor::I32(arr2(&[[i32::MIN, 0], [1, i32::MAX]]).into_dyn())
    );
    let Tensor::F64(f64s) = npz.require("f64").unwrap() else {
        panic!("dtype")
    };
    let bits: Vec<u64> = f64s.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, [0.1f64, -0.0, 1e300].map(f64::to_bits));
    assert_eq!(
        npz.require("big_i8").unwrap(),
        &Tensor::I64(arr1(&[-2i64, 1 << 40]).into_dyn())
    );
    assert_eq!(
        npz.require("empty").unwrap(),
        &Tensor::F32(ArrayD::zeros(IxDyn(&[0, 3])))
    );
    let labels: Vec<i64> = [3, 1, 4, 1, 5, 9, 2, 6].repeat(8);
    assert_eq!(
        npz.require("label").unwrap(),
        &Tensor::I64(arr1(&labels).into_dyn())
    );
}

#[test]
fn numpy_format_versions() {
    let npz = Npz::read(&fixture("versions.npz")).unwrap();
    assert_eq!(npz.names().collect::<Vec<_>>(), ["v1", "v2", "v3"]);
    for (major, name) in [(1i64, "v1"), (2, "v2"), (3, "v3")] {
        let want = arr2(&[[0i64, 1], [2, 3]]).mapv(|v| v * major).into_dyn();
        assert_eq!(npz.require(name).unwrap(), &Tensor::I64(want), "{name}");
    }
    let bytes = std::fs::read(fixture("v2_big_endian.npy")).unwrap();
    assert_eq!(&bytes[6..8], &[2, 0]);
    assert_eq!(
        parse_npy("v2", &bytes).unwrap(),
        Tensor::I32(arr2(&[[1i32, -1], [256, i32::MAX]]).into_dyn())
    );
}

#[test]
fn deflated_entries_from_other_writers_are_read() {
    let t = sample(DType::F32, &[64, 64]);
    let bytes = zip_of(&[("x.npy", &write_npy(&t))], CompressionMethod::Deflated);
    assert_eq!(Npz::from_bytes(&bytes).unwrap().get("x"), Some(&t));
}

#[test]
fn duplicate_entries_are_refused() {
    let npy = write_npy(&sample(DType::U8, &[2]));
    // `x` and `x.npy` both become the array `x`.
    let bytes = zip_of(&[("x.npy", &npy), ("x", &npy)], CompressionMethod::Stored);
    match Npz::from_bytes(&bytes) {
        Err(NpzError::DuplicateKey { key }) => assert_eq!(key, "x"),
        other => panic!("{other:?}"),
    }
    // Two entries with one name: the zip writer will not make that, so
    // rename the second in place (names are outside the CRC).
    let mut bytes = zip_of(
        &[("a.npy", &npy), ("b.npy", &npy)],
        CompressionMethod::Stored,
    );
    let mut renamed = 0;
    for i in 0..bytes.len() - 5 {
        if &bytes[i..i + 5] == b"b.npy" {
            bytes[i] = b'a';
            renamed += 1;
        }
    }
    assert_eq!(renamed, 2, "local and central headers");
    match Npz::from_bytes(&bytes) {
        Err(NpzError::DuplicateKey { key }) => assert_eq!(key, "a"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_names_are_refused_both_ways() {
    let npy = write_npy(&sample(DType::U8, &[2]));
    let bytes = zip_of(&[(".npy", &npy)], CompressionMethod::Stored);
    assert!(matches!(
        Npz::from_bytes(&bytes),
        Err(NpzError::InvalidKey { .. })
    ));
    let mut npz = Npz::new();
    npz.insert("", sample(DType::U8, &[1]));
    assert!(matches!(npz.to_bytes(), Err(NpzError::InvalidKey { .. })));
}

#[test]
fn names_are_kept_as_written() {
    let npy = write_npy(&sample(DType::U8, &[2]));
    let bytes = zip_of(
        &[("dir/../x.npy", &npy), ("x.npy.npy", &npy)],
        CompressionMethod::Stored,
    );
    let npz = Npz::from_bytes(&bytes).unwrap();
    assert_eq!(npz.names().collect::<Vec<_>>(), ["dir/../x", "x.npy"]);
    // And written back with one `.npy` added, so they read back the same.
    assert_eq!(Npz::from_bytes(&npz.to_bytes().unwrap()).unwrap(), npz);
}

#[test]
fn errors_name_the_array_at_fault() {
    let good = write_npy(&sample(DType::U8, &[2]));
    let mut short = write_npy(&sample(DType::F32, &[4]));
    short.truncate(short.len() - 3);
    type IsExpected = fn(&NpzError) -> bool;
    let cases: [(&str, Vec<u8>, IsExpected); 4] = [
        ("notes.txt", b"hello".to_vec(), |e| {
            matches!(e, NpzError::NotNpy { .. })
        }),
        ("short", short, |e| matches!(e, NpzError::Truncated { .. })),
        (
            "complex",
            npy_with_header(
                "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}",
                &[0; 8],
            ),
            |e| matches!(e, NpzError::UnsupportedDType { descr, .. } if descr == "'<c8'"),
        ),
        (
            "long",
            npy_with_header(
                "{'descr': '|u1', 'fortran_order': False, 'shape': (2,)}",
                &[1, 2, 3],
            ),
            |e| matches!(e, NpzError::ShapeMismatch { .. }),
        ),
    ];
    for (name, data, is_expected) in cases {
        let bytes = zip_of(
            &[("good.npy", &good), (name, &data)],
            CompressionMethod::Deflated,
        );
        let err = Npz::from_bytes(&bytes).unwrap_err();
        assert!(is_expected(&err), "{name}: {err:?}");
        let key = name.trim_end_matches(".npy");
        assert!(err.to_string().contains(&format!("`{key}`")), "{err}");
    }
}

/// Sets the uncompressed size that the central directory declares for the
/// only entry.
fn declare_size(bytes: &mut [u8], size: u32) {
    let central = bytes.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    bytes[central + 24..central + 28].copy_from_slice(&size.to_le_bytes());
}

#[test]
fn entries_that_misstate_their_size_are_refused() {
    let npy = write_npy(&sample(DType::I64, &[64]));
    let deflated = zip_of(&[("x.npy", &npy)], CompressionMethod::Deflated);
    let real = npy.len() as u32;
    let cases: [(u32, &str); 3] = [
        (u32::MAX, "more than deflate can expand to"),
        (real - 1, "holds more than"),
        (real + 1, "truncated"),
    ];
    for (size, want) in cases {
        let mut bytes = deflated.clone();
        declare_size(&mut bytes, size);
        let err = Npz::from_bytes(&bytes).unwrap_err().to_string();
        assert!(err.contains(want) && err.contains("`x`"), "{size}: {err}");
    }
    let mut stored = zip_of(&[("x.npy", &npy)], CompressionMethod::Stored);
    declare_size(&mut stored, real + 1);
    let err = Npz::from_bytes(&stored).unwrap_err().to_string();
    assert!(err.contains("stored entry declares"), "{err}");
}

#[test]
fn huge_declared_shapes_are_refused_without_allocating() {
    // 2^80 elements: the count itself overflows.
    let overflow = npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776)}",
        &[0; 16],
    );
    match parse_npy("huge", &overflow) {
        Err(NpzError::ShapeMismatch { key, shape, .. }) => {
            assert_eq!(key, "huge");
            assert_eq!(shape, [1 << 40, 1 << 40]);
        }
        other => panic!("{other:?}"),
    }
    // 2^60 bytes: representable, so only the byte count can refuse it.
    let big = npy_with_header(
        "{'descr': '|u1', 'fortran_order': False, 'shape': (1073741824, 1073741824)}",
        &[0; 16],
    );
    match parse_npy("big", &big) {
        Err(NpzError::Truncated {
            key,
            needed,
            available,
        }) => {
            assert_eq!(key, "big");
            assert!(needed > 1 << 60);
            assert_eq!(available, big.len() as u64);
        }
        other => panic!("{other:?}"),
    }
    for (data, key) in [(&overflow, "huge"), (&big, "big")] {
        let bytes = zip_of(
            &[(&format!("{key}.npy"), data)],
            CompressionMethod::Deflated,
        );
        let err = Npz::from_bytes(&bytes).unwrap_err();
        assert!(
            matches!(
                err,
                NpzError::ShapeMismatch { .. } | NpzError::Truncated { .. }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains(key), "{err}");
    }
}

#[test]
fn not_a_zip_is_a_zip_error() {
    assert!(matches!(
        Npz::from_bytes(b"not a zip"),
        Err(NpzError::Zip(_))
    ));
    assert!(matches!(Npz::from_bytes(&[]), Err(NpzError::Zip(_))));
    // An empty archive is an empty data set.
    let empty = zip_of(&[], CompressionMethod::Stored);
    assert!(Npz::from_bytes(&empty).unwrap().is_empty());
}

fn valid_npz() -> Vec<u8> {
    let mut npz = Npz::new();
    npz.insert("input", sample(DType::F32, &[2, 3]));
    npz.insert("label", sample(DType::I64, &[2]));
    npz.insert("mask", sample(DType::Bool, &[2]));
    npz.to_bytes().unwrap()
}

fn any_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Npz::from_bytes(&bytes);
        let _ = parse_npy("k", &bytes);
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        npy.extend_from_slice(&bytes);
        let _ = parse_npy("k", &npy);
    }

    #[test]
    fn corrupted_archives_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        compressed in any::<bool>(),
    ) {
        let mut bytes = if compressed {
            zip_of(&[("x.npy", &write_npy(&sample(DType::I32, &[3, 5])))], CompressionMethod::Deflated)
        } else {
            valid_npz()
        };
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let _ = Npz::from_bytes(&bytes);
        bytes.truncate(cut.index(bytes.len()));
        let _ = Npz::from_bytes(&bytes);
    }

    #[test]
    fn arbitrary_headers_never_panic(header in "[ -~\\n]{0,200}", data in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = parse_npy("k", &npy_with_header(&header, &data));
    }

    #[test]
    fn header_like_text_never_panics(
        descr in "[<>|=]?[fiubcU]?[0-9]{0,2}",
        fortran in "True|False|0|None",
        dims in prop::collection::vec("-?[0-9]{1,22}L?", 0..5),
        trailing_comma in any::<bool>(),
    ) {
        let comma = if trailing_comma || dims.len() == 1 { "," } else { "" };
        let header = format!(
            "{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': ({}{comma}), }}",
            dims.join(", ")
        );
        let _ = parse_npy("k", &npy_with_header(&header, &[0; 48]));
    }

    /// A blob parses exactly when its data matches its declared shape;
    /// otherwise the error says which way it is off.
    #[test]
    fn declared_shape_is_checked_against_data(
        dtype in any_dtype(),
        dims in prop::collection::vec(prop_oneof![0u64..4, 0u64..(1 << 62)], 0..4),
        data_len in 0usize..64,
    ) {
        let shape: Vec<String> = dims.iter().map(u64::to_string).collect();
        let header = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': ({},)}}",
            match dtype {
                DType::F32 => "<f4", DType::F64 => ">f8", DType::F16 => "<f2", DType::I8 => "|i1",
                DType::U8 => "|u1", DType::I32 => ">i4", DType::I64 => "<i8", DType::Bool => "|b1",
            },
            shape.join(", "),
        );
        let header = header.replace("(,)", "()");
        let result = parse_npy("k", &npy_with_header(&header, &vec![0; data_len]));
        let want = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_bytes() as u64));
        match result {
            Ok(t) => {
                prop_assert_eq!(want, Some(data_len as u64));
                prop_assert_eq!(t.dtype(), dtype);
                let got: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
                prop_assert_eq!(got, dims);
            }
            Err(NpzError::Truncated { .. }) => prop_assert!(want.is_some_and(|w| w > data_len as u64)),
            Err(NpzError::ShapeMismatch { .. }) => {
                // ndarray also refuses empty shapes whose other axes overflow isize.
                let unaddressable = dims
                    .iter()
                    .filter(|&&d| d != 0)
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .is_none_or(|n| n > isize::MAX as u64);
                prop_assert!(want != Some(data_len as u64) || unaddressable);
            }
            Err(other) => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn round_trip_any_shape(dtype in any_dtype(), dims in prop::collection::vec(0usize..5, 0..5)) {
        let t = sample(dtype, &dims);
        prop_assert_eq!(parse_npy("t", &write_npy(&t)).unwrap(), t.clone());
        let mut npz = Npz::new();
        npz.insert("t", t);
        prop_assert_eq!(Npz::from_bytes(&npz.to_bytes().unwrap()).unwrap(), npz);
    }
}
