//! The drift tests' toy weather model: one `temp` feature in three bins
//! and two classes, its manifest with reference statistics, and the
//! sketches an agent would send for it.

use edgeloop_models::manifest::{ClassShare, InputHistogram, Manifest, ReferenceStats};
use edgeloop_proto::agent::v1 as pb;

/// `temp`'s reference bins.
pub const EDGES: [f64; 4] = [0.0, 10.0, 20.0, 30.0];

pub fn at(s: i64) -> Option<edgeloop_proto::Timestamp> {
    Some(edgeloop_proto::Timestamp {
        seconds: s,
        nanos: 0,
    })
}

/// Version 1.0.0 of `rain`: reference temp counts 300/400/300, classes
/// 70 % / 30 %.
pub fn manifest(model: &[u8]) -> Manifest {
    Manifest {
        reference_stats: Some(ReferenceStats {
            inputs: vec![InputHistogram {
                name: "temp".into(),
                bin_edges: EDGES.to_vec(),
                counts: vec![300, 400, 300],
                input: None,
                column: None,
            }],
            prediction_distribution: vec![
                ClassShare {
                    class: 0,
                    share: 0.7,
                },
                ClassShare {
                    class: 1,
                    share: 0.3,
                },
            ],
            sample_count: 1000,
        }),
        ..crate::manifests::manifest("rain", "1.0.0", model, ("temp", 1), ("logits", 2))
    }
}

/// One hour's sketch of `rain` 1.0.0 from `window` (unix seconds).
pub fn sketch(window: i64, temp: [u64; 3], classes: [u64; 2]) -> pb::ModelSketch {
    pb::ModelSketch {
        model_name: "rain".into(),
        model_version: "1.0.0".into(),
        window_start: at(window),
        window_end: at(window + 3599),
        requests: temp.iter().sum(),
        features: vec![pb::FeatureHistogram {
            name: "temp".into(),
            bin_edges: EDGES.to_vec(),
            counts: temp.to_vec(),
            ..Default::default()
        }],
        classes: vec![
            pb::ClassCount {
                class: 0,
                count: classes[0],
            },
            pb::ClassCount {
                class: 1,
                count: classes[1],
            },
        ],
        ..Default::default()
    }
}
