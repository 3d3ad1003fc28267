//! Arbitrary bodies to infer never panic the server and get a 4xx with the
//! protocol's error JSON (or, by chance, a valid answer); arbitrary gRPC
//! messages get a client-error code.

use edgeloop_proto::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use edgeloop_proto::inference::{InferTensorContents, ModelInferRequest, ModelInferResponse};
use proptest::prelude::*;
use prost::Message as _;
use serde_json::{json, Value};
use tonic::Code;

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

/// A codec that sends and receives the message bytes as they are, so a test
/// can put anything on the wire where a `ModelInferRequest` belongs.
#[derive(Debug, Default, Clone, Copy)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf as _;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Near-valid infer messages: the right structure with arbitrary names,
/// datatypes, shapes, raw bytes and typed contents.
fn near_valid_grpc() -> impl Strategy<Value = ModelInferRequest> {
    let tensor = (
        prop_oneof![Just("x"), Just("y"), Just("")],
        prop_oneof![
            Just("FP32"),
            Just("FP64"),
            Just("FP16"),
            Just("INT8"),
            Just("UINT8"),
            Just("INT64"),
            Just("BOOL"),
            Just("BYTES"),
            Just("")
        ],
        prop::collection::vec(prop_oneof![8 => -2i64..6, 1 => any::<i64>()], 0..4),
        prop::option::of((
            prop::collection::vec(any::<f32>(), 0..9),
            prop::collection::vec(any::<i32>(), 0..3),
            prop::collection::vec(any::<u32>(), 0..3),
        )),
    )
        .prop_map(|(name, datatype, shape, contents)| InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape,
            parameters: Default::default(),
            contents: contents.map(|(f, i, u)| InferTensorContents {
                fp32_contents: f,
                int_contents: i,
                uint_contents: u,
                ..Default::default()
            }),
        });
    (
        prop_oneof![4 => Just("add"), 1 => Just("nope")],
        prop_oneof![Just(""), Just("1"), Just("2")],
        prop::collection::vec(tensor, 0..3),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..3),
        prop::collection::vec(prop_oneof![Just("y"), Just("z")], 0..3),
    )
        .prop_map(|(model, version, inputs, raw, outputs)| ModelInferRequest {
            model_name: model.into(),
            model_version: version.into(),
            inputs,
            raw_input_contents: raw.into_iter().map(Into::into).collect(),
            outputs: outputs
                .into_iter()
                .map(|name| InferRequestedOutputTensor {
                    name: name.into(),
                    parameters: Default::default(),
                })
                .collect(),
            ..Default::default()
        })
}

/// Arbitrary messages to ModelInfer never panic the server: each gets an
/// answer or a refusal with a code that names the client's fault (an
/// undecodable message is tonic's INTERNAL "failed to decode"), and the
/// service keeps serving.
#[test]
fn arbitrary_grpc_messages_never_panic_and_are_refused() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let models = Models::new();
    let add = models.write("add", &add_model(1.0));
    let (server, channel) = rt.block_on(async {
        let server = start(config()).await;
        server.host.activate(spec("add", "1", &add)).await.unwrap();
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
                .unwrap()
                .connect()
                .await
                .unwrap();
        (server, channel)
    });
    let send = |bytes: Vec<u8>| -> Result<(), TestCaseError> {
        let result = rt.block_on(async {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.unwrap();
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/inference.GRPCInferenceService/ModelInfer",
            );
            grpc.unary(tonic::Request::new(bytes), path, RawCodec).await
        });
        match result {
            Ok(answer) => {
                let answer = ModelInferResponse::decode(answer.into_inner().as_slice());
                prop_assert!(answer.is_ok(), "{answer:?}");
            }
            Err(e) => {
                let refused = matches!(e.code(), Code::InvalidArgument | Code::NotFound)
                    || (e.code() == Code::Internal && e.message().contains("failed to decode"));
                prop_assert!(refused, "{e:?}");
            }
        }
        Ok(())
    };
    let config = ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(request in near_valid_grpc())| send(request.encode_to_vec())?);
    proptest!(config, |(bytes in prop::collection::vec(any::<u8>(), 0..64))| send(bytes)?);
    // A valid message with bytes overwritten: truncated fields, wrong wire types.
    let valid = ModelInferRequest {
        model_name: "add".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![1, 4],
            parameters: Default::default(),
            contents: None,
        }],
        raw_input_contents: vec![vec![0u8; 16].into()],
        ..Default::default()
    }
    .encode_to_vec();
    proptest!(config, |(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4))| {
        let mut bytes = valid.clone();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        send(bytes)?
    });
    // Still up and serving.
    send(valid).unwrap();
    drop(server);
}
