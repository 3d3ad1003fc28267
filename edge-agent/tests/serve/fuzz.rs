//! Arbitrary bodies to infer never panic the server and get a 4xx with the
//! protocol's error JSON (or, by chance, a valid answer).

use proptest::prelude::*;
use serde_json::{json, Value};

use edgeloop_edge_agent::serving::ModelServing;

use crate::common::*;

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-zA-Z_ ]{0,8}".prop_map(Value::from),
        prop_oneof![
            Just("input"),
            Just("FP32"),
            Just("INT64"),
            Just("BOOL"),
            Just("name"),
            Just("shape"),
            Just("data"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("id".to_string()),
                        Just("inputs".to_string()),
                        Just("outputs".to_string()),
                        Just("name".to_string()),
                        Just("shape".to_string()),
                        Just("datatype".to_string()),
                        Just("data".to_string()),
                        "[a-z]{1,6}",
                    ],
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Near-valid requests: right structure, arbitrary shapes, datatypes and data.
fn near_valid() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("x"), Just("y"), Just("")],
        prop::collection::vec(-2i64..6, 0..4),
        prop_oneof![Just("FP32"), Just("FP64"), Just("INT64"), Just("BOOL"), Just("UINT8"), Just("BYTES"), Just("fp32")],
        prop::collection::vec(any_json(), 0..10),
        prop::option::of(prop::collection::vec(prop_oneof![Just("y"), Just("z")], 0..3)),
    )
        .prop_map(|(name, shape, datatype, data, outputs)| {
            let mut body = json!({ "inputs": [{ "name": name, "shape": shape, "datatype": datatype, "data": data }] });
            if let Some(outputs) = outputs {
                body["outputs"] = outputs.iter().map(|n| json!({ "name": n })).collect();
            }
            body
        })
}

#[test]
fn arbitrary_bodies_never_panic_and_get_4xx() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let models = Models::new();
    let add = models.write("add", &add_model(1.0));
    let server = rt.block_on(async {
        let server = start(config()).await;
        server.host.activate(spec("add", "1", &add)).await.unwrap();
        server
    });
    let check = |body: Vec<u8>| -> Result<(), TestCaseError> {
        let got = rt.block_on(server.post_bytes("/v2/models/add/infer", body));
        if got.status == 200 {
            prop_assert!(got.body["outputs"].is_array(), "{}", got.text);
        } else {
            prop_assert!(
                (400..500).contains(&got.status),
                "{}: {}",
                got.status,
                got.text
            );
            prop_assert!(got.body["error"].is_string(), "{}", got.text);
        }
        Ok(())
    };
    let config = ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(body in any_json())| check(serde_json::to_vec(&body).unwrap())?);
    proptest!(config, |(body in near_valid())| check(serde_json::to_vec(&body).unwrap())?);
    proptest!(config, |(bytes in prop::collection::vec(any::<u8>(), 0..64))| check(bytes)?);
    // The server is still up and serving.
    let got =
        rt.block_on(server.post("/v2/models/add/infer", &infer_body("x", &[1, 4], &[0.0; 4])));
    assert_eq!(got.status, 200, "{}", got.text);
}
