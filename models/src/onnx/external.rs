//! Writing a model whose initializers go to an external-data file beside
//! it: the only way ONNX Runtime loads a model over protobuf's 2 GiB. The
//! layout is ONNX's own (`location`/`offset`/`length`, relative to the
//! model's directory), so any ONNX tool reads it back.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::tensor::external_ref;
use super::{encode, ir, EncodeError, TensorError};

/// Initializers with at least this many raw bytes go to the data file; the
/// rest stay inline, as `onnx.save_model(save_as_external_data=True)` does.
pub const EXTERNAL_THRESHOLD: usize = 1024;

/// Offsets in the data file are page-aligned so ONNX Runtime can map the
/// weights instead of copying them.
const ALIGN: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("writing {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("file name {0:?} must be a plain file name")]
    BadName(String),
    /// Its bytes live in another model's directory, which this copy would
    /// not reach: internalize first.
    #[error("initializer {0:?} is already external data")]
    AlreadyExternal(String),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// What stays inline (nodes, typed-field tensors, Constant attributes)
    /// is itself over 2 GiB.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// Writes `model` to `dir/file_name` with every initializer of
/// [`EXTERNAL_THRESHOLD`] raw bytes or more in `dir/file_name.data`, and
/// returns the model file's path. Only `raw_data` moves (what
/// `from_tensor` and the quantizers write); tensors held in typed fields
/// stay inline.
///
/// Holds a copy of the model's graph while it writes (the caller's model
/// is borrowed), so peak memory is about twice the weights.
pub fn save_with_external_data(
    model: &ir::ModelProto,
    dir: &Path,
    file_name: &str,
) -> Result<PathBuf, SaveError> {
    let plain = Path::new(file_name)
        .file_name()
        .is_some_and(|n| n == std::ffi::OsStr::new(file_name));
    if !plain {
        return Err(SaveError::BadName(file_name.to_string()));
    }
    let data_name = format!("{file_name}.data");
    let data_path = dir.join(&data_name);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SaveError::Io { path, source }
    };
    let mut copy = model.clone();
    let file = std::fs::File::create(&data_path).map_err(io(&data_path))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut offset = 0u64;
    if let Some(graph) = copy.graph.as_mut() {
        for t in graph.initializer.iter_mut() {
            if external_ref(t)?.is_some() {
                return Err(SaveError::AlreadyExternal(t.name().to_string()));
            }
            if t.raw_data
                .as_ref()
                .is_none_or(|r| r.len() < EXTERNAL_THRESHOLD)
            {
                continue;
            }
            let raw = t.raw_data.take().unwrap_or_default();
            let pad = offset.next_multiple_of(ALIGN) - offset;
            out.write_all(&vec![0u8; pad as usize])
                .map_err(io(&data_path))?;
            offset += pad;
            out.write_all(&raw).map_err(io(&data_path))?;
            let entry = |k: &str, v: String| {
                let mut kv = ir::StringStringEntryProto::new();
                kv.set_key(k.into());
                kv.set_value(v);
                kv
            };
            t.external_data = vec![
                entry("location", data_name.clone()),
                entry("offset", offset.to_string()),
                entry("length", raw.len().to_string()),
            ];
            t.set_data_location(ir::tensor_proto::DataLocation::EXTERNAL);
            offset += raw.len() as u64;
        }
    }
    out.flush().map_err(io(&data_path))?;
    let bytes = encode(&copy)?;
    let model_path = dir.join(file_name);
    std::fs::write(&model_path, bytes).map_err(io(&model_path))?;
    Ok(model_path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::{from_tensor, internalize_external_data, serialized_size, to_tensor};
    use crate::tensor::Tensor;
    use ndarray::{ArrayD, IxDyn};

    #[test]
    fn big_initializers_move_out_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ir::ModelProto::new();
        let g = m.graph.mut_or_insert_default();
        let big = Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[40, 30]), |i| {
            i[0] as f32 - i[1] as f32
        }));
        let small = Tensor::F32(ArrayD::from_elem(IxDyn(&[3]), 1.5));
        g.initializer.push(from_tensor("w", &big));
        g.initializer.push(from_tensor("b", &small));
        let inline_size = encode(&m).unwrap().len() as u64;

        let path = save_with_external_data(&m, dir.path(), "model.onnx").unwrap();
        let mut back = crate::onnx::read(&path).unwrap();
        let g = back.graph.as_ref().unwrap();
        assert!(external_ref(&g.initializer[0]).unwrap().is_some());
        assert!(
            external_ref(&g.initializer[1]).unwrap().is_none(),
            "small stays inline"
        );
        assert_eq!(to_tensor(&g.initializer[0], Some(dir.path())).unwrap(), big);
        // On-disk size: the graph file plus the declared external bytes.
        let on_disk = std::fs::metadata(&path).unwrap().len() + 40 * 30 * 4;
        assert_eq!(serialized_size(&back), on_disk);
        assert!(serialized_size(&back) < inline_size + 64);
        assert_eq!(internalize_external_data(&mut back, dir.path()).unwrap(), 1);
        assert_eq!(back, m);
        // Saving again refuses a model whose data lives elsewhere.
        let path2 = save_with_external_data(&m, dir.path(), "again.onnx").unwrap();
        let external = crate::onnx::read(&path2).unwrap();
        assert!(matches!(
            save_with_external_data(&external, dir.path(), "third.onnx"),
            Err(SaveError::AlreadyExternal(_))
        ));
        assert!(matches!(
            save_with_external_data(&m, dir.path(), "../x.onnx"),
            Err(SaveError::BadName(_))
        ));
    }
}
