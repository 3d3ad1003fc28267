//! The labelling queue (issue #11's hard examples): a page of a model's
//! unlabelled hard examples, each input shown as an image when it is an
//! image tensor and as a row table otherwise, with a label field per
//! sample. Labelling is keyboard-first without any script: type a class,
//! Tab to the next sample, Enter saves the page. "Accept the predictions"
//! labels every sample on the page with its predicted class, except where
//! a class was typed, in one bulk API call (all or nothing).

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use base64::Engine as _;
use edgeloop_api::samples::{LabelEntry, LabelsSet, SampleSummary, SampleTensor, SampleView};
use maud::{html, Markup};
use serde::Deserialize;

use super::{plain_id, with_query};
use crate::html::{csrf_field, failure, may, page, time};
use crate::{redirect, Console};

/// Samples on one page: each is a form row, and a page is one bulk call.
const PAGE: usize = 24;

/// Values of a tabular row shown before "…".
const MAX_ROW_VALUES: usize = 32;

#[derive(Deserialize)]
pub struct QueueQuery {
    #[serde(default)]
    after: String,
    /// How many the last save labelled, to say so.
    #[serde(default)]
    labelled: Option<u64>,
}

pub async fn queue(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<QueueQuery>,
) -> Result<Response, Response> {
    let here = with_query(
        &format!("/ui/models/{name}/labelling"),
        &[("after", &q.after)],
    );
    let s = c.session(&headers, &here).await?;
    if !plain_id(&name) {
        return Err((StatusCode::NOT_FOUND, "no such model").into_response());
    }
    let limit = PAGE.to_string();
    let path = with_query(
        &format!("/api/v1/models/{name}/samples"),
        &[
            ("kind", "hard_example"),
            ("state", "unlabelled"),
            ("limit", &limit),
            ("after", &q.after),
        ],
    );
    let answer = c
        .api
        .get::<Vec<SampleView>>(&s.principal, &path)
        .await
        .map_err(|f| failure(Some(&s), "/ui/models", &f))?;
    let summary = c
        .get::<SampleSummary>(
            &s,
            &format!("/api/v1/models/{name}/samples/summary"),
            "/ui/models",
        )
        .await?;
    let samples = answer.body;
    let can_label = may(&s, Method::POST, "/api/v1/models/{name}/samples/labels");
    let action = format!("/ui/models/{name}/labelling");
    let body = html! {
        p { a href={"/ui/models/" (name)} { "Model " (name) } " · "
            (summary.stored) " samples kept (at most " (summary.max_per_model) ")" }
        @if let Some(n) = q.labelled { p.notice role="status" { "Labelled " (n) " samples." } }
        @if samples.is_empty() {
            p { "No unlabelled hard examples" @if !q.after.is_empty() { " after this point" } "." }
        } @else if can_label {
            p.hint #how { "Type the true class of each sample, Tab to the next, Enter to save the page. "
                "Accept the predictions to label every sample here with its predicted class, except those you typed." }
            form method="post" action=(action) aria-describedby="how" {
                (csrf_field(&s))
                input type="hidden" name="after" value=(q.after);
                (sample_list(&samples, true))
                div.actions {
                    button type="submit" name="action" value="save" { "Save labels" }
                    button type="submit" name="action" value="accept" { "Accept the predictions" }
                }
            }
        } @else {
            (sample_list(&samples, false))
        }
        @if let Some(next) = &answer.next {
            p { a rel="next" href=(with_query(&action, &[("after", next)])) { "Next samples" } }
        }
    };
    Ok(page(
        &format!("Label hard examples of {name}"),
        "/ui/models",
        Some(&s),
        body,
    )
    .into_response())
}

fn sample_list(samples: &[SampleView], inputs: bool) -> Markup {
    html! {
        ol.samples {
            @for (i, x) in samples.iter().enumerate() {
                li.sample {
                    div.inputs { @for t in &x.inputs { (tensor(t)) } }
                    div.meta {
                        p {
                            "Predicted " strong { (x.predicted_class.map_or("—".to_string(), |c| c.to_string())) }
                            @if let Some(p) = x.confidence { " at " (format!("{:.0} %", p * 100.0)) }
                        }
                        p.hint { "device " (x.device) " · v" (x.model_version) " · "
                            @if let Some(t) = x.observed_at { (time(t)) } @else { "time unknown" } }
                        @if inputs {
                            @let field = format!("label.{}", x.id);
                            @let input_id = format!("label-{i}");
                            label for=(input_id) { "True class" }
                            input id=(input_id) type="number" name=(field) min="0" max="1000000"
                                inputmode="numeric" autocomplete="off" autofocus[i == 0]
                                placeholder=(x.predicted_class.map_or(String::new(), |c| c.to_string()));
                            @if let Some(p) = x.predicted_class {
                                input type="hidden" name={"predicted." (x.id)} value=(p);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One input tensor: an image when its shape is one, else its values.
fn tensor(t: &SampleTensor) -> Markup {
    let values = decode(t);
    match (image_shape(&t.shape), &values) {
        (Some(shape), Some(v)) if v.len() == shape.len() => match png_data_uri(shape, v) {
            Some(uri) => html! {
                img.sample-image src=(uri) width=(shape.width * 4) height=(shape.height * 4)
                    alt={(t.name) ", a " (shape.width) "×" (shape.height) " image"};
            },
            None => row_table(t, v),
        },
        (_, Some(v)) => row_table(t, v),
        (_, None) => {
            html! { p.hint { (t.name) ": " (t.dtype) " " (format!("{:?}", t.shape)) " (not shown)" } }
        }
    }
}

fn row_table(t: &SampleTensor, v: &[f64]) -> Markup {
    html! {
        table.data.row {
            caption { (t.name) " " (format!("{:?}", t.shape)) }
            thead { tr { th scope="col" { "#" } th scope="col" { "value" } } }
            tbody {
                @for (i, x) in v.iter().take(MAX_ROW_VALUES).enumerate() {
                    tr { th scope="row" { (i) } td { (format!("{x:.4}")) } }
                }
                @if v.len() > MAX_ROW_VALUES {
                    tr { td colspan="2" { "… " (v.len() - MAX_ROW_VALUES) " more" } }
                }
            }
        }
    }
}

/// An image's size and layout, as read from a tensor's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageShape {
    pub width: u32,
    pub height: u32,
    /// 1 (grey) or 3 (RGB).
    pub channels: u32,
    /// Channels first (`[C, H, W]`), as vision models take them.
    pub planar: bool,
}

impl ImageShape {
    fn len(&self) -> usize {
        self.width as usize * self.height as usize * self.channels as usize
    }
}

/// The smallest side taken for an image: a tabular row is narrower.
const MIN_SIDE: u64 = 8;
/// Largest side shown: a guard on what the page encodes.
const MAX_SIDE: u64 = 1024;

/// Whether a tensor of `shape` is an image, and how it is laid out: after
/// leading 1s (a batch of one), `[H, W]`, `[C, H, W]` or `[H, W, C]` with C
/// 1 or 3, or a flat vector of a square count of at least 256 values (a
/// flattened grey image, as MNIST's 784). Pure.
pub fn image_shape(shape: &[u64]) -> Option<ImageShape> {
    let dims: Vec<u64> = shape.iter().copied().skip_while(|d| *d == 1).collect();
    let side = |d: u64| (MIN_SIDE..=MAX_SIDE).contains(&d);
    let img = |h: u64, w: u64, c: u64, planar| ImageShape {
        width: w as u32,
        height: h as u32,
        channels: c as u32,
        planar,
    };
    match dims[..] {
        [n] => {
            let k = (n as f64).sqrt().round() as u64;
            (n >= 256 && k * k == n && side(k)).then(|| img(k, k, 1, true))
        }
        [h, w] if side(h) && side(w) => Some(img(h, w, 1, true)),
        [c @ (1 | 3), h, w] if side(h) && side(w) => Some(img(h, w, c, true)),
        [h, w, c @ (1 | 3)] if side(h) && side(w) => Some(img(h, w, c, false)),
        _ => None,
    }
}

/// The tensor's values as numbers, when its dtype is one the page reads
/// and its bytes are whole values.
fn decode(t: &SampleTensor) -> Option<Vec<f64>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&t.data_base64)
        .ok()?;
    let each = |n: usize, f: &dyn Fn(&[u8]) -> f64| -> Option<Vec<f64>> {
        (bytes.len() % n == 0).then(|| bytes.chunks_exact(n).map(f).collect())
    };
    let arr = |c: &[u8]| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..c.len()].copy_from_slice(c);
        a
    };
    match t.dtype.as_str() {
        "float32" => each(4, &|c| {
            f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        }),
        "float64" => each(8, &|c| f64::from_le_bytes(arr(c))),
        "uint8" => each(1, &|c| f64::from(c[0])),
        "int8" => each(1, &|c| f64::from(c[0] as i8)),
        "int32" => each(4, &|c| {
            f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        }),
        "int64" => each(8, &|c| i64::from_le_bytes(arr(c)) as f64),
        _ => None,
    }
}

/// The values as 8-bit pixels, stretched from their own least to greatest
/// (a model's inputs are rarely 0..255), in the PNG's row order. Pure.
pub fn pixels(shape: ImageShape, values: &[f64]) -> Vec<u8> {
    let (lo, hi) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        });
    let span = hi - lo;
    // A flat (or empty) image has no span: black.
    let flat = !span.is_finite() || span <= 0.0;
    let px = |v: f64| -> u8 {
        if flat || !v.is_finite() {
            0
        } else {
            (((v - lo) / span) * 255.0).round() as u8
        }
    };
    let (w, h, c) = (
        shape.width as usize,
        shape.height as usize,
        shape.channels as usize,
    );
    let mut out = Vec::with_capacity(w * h * c);
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let i = if shape.planar {
                    ch * w * h + y * w + x
                } else {
                    (y * w + x) * c + ch
                };
                out.push(px(values[i]));
            }
        }
    }
    out
}

fn png_data_uri(shape: ImageShape, values: &[f64]) -> Option<String> {
    let mut png = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png, shape.width, shape.height);
        enc.set_color(if shape.channels == 3 {
            png::ColorType::Rgb
        } else {
            png::ColorType::Grayscale
        });
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().ok()?;
        w.write_image_data(&pixels(shape, values)).ok()?;
    }
    Some(format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    ))
}

/// The labelling form: `label.<id>` as typed, `predicted.<id>` per sample
/// with a prediction, and which button.
pub async fn save(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Result<Response, Response> {
    let field = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
    let here = format!("/ui/models/{name}/labelling");
    let s = c
        .acting_session(&headers, &here, field("csrf").unwrap_or(""))
        .await?;
    if !plain_id(&name) {
        return Err((StatusCode::NOT_FOUND, "no such model").into_response());
    }
    let accept = field("action") == Some("accept");
    let entries = match labels_of(&fields, accept) {
        Ok(e) => e,
        Err(message) => {
            let body = html! { p.error role="alert" { (message) } p { a href=(here) { "Back to the queue" } } };
            return Err((
                StatusCode::BAD_REQUEST,
                page("Refused", "/ui/models", Some(&s), body),
            )
                .into_response());
        }
    };
    let after = field("after").unwrap_or("");
    if entries.is_empty() {
        return Ok(redirect(&with_query(&here, &[("after", after)])));
    }
    let body = serde_json::json!({ "labels": entries });
    match c
        .api
        .post::<LabelsSet>(
            &s.principal,
            &format!("/api/v1/models/{name}/samples/labels"),
            Some(body),
        )
        .await
    {
        Ok(a) => Ok(redirect(&with_query(
            &here,
            &[("after", after), ("labelled", &a.body.labelled.to_string())],
        ))),
        Err(f) => Err(failure(Some(&s), "/ui/models", &f)),
    }
}

/// The labels a form sets: each typed class, and with `accept` each
/// prediction where nothing was typed. A typed value that is not a class
/// index is refused, naming the sample. Pure.
pub fn labels_of(fields: &[(String, String)], accept: bool) -> Result<Vec<LabelEntry>, String> {
    let mut typed: Vec<LabelEntry> = Vec::new();
    for (k, v) in fields {
        let Some(id) = k.strip_prefix("label.") else {
            continue;
        };
        let v = v.trim();
        if v.is_empty() {
            continue;
        }
        let label = v
            .parse::<i64>()
            .ok()
            .filter(|l| (0..=edgeloop_api::samples::MAX_LABEL).contains(l))
            .ok_or_else(|| {
                format!("The class typed for sample {id} is not a class index: {v:?}")
            })?;
        typed.push(LabelEntry {
            id: id.to_string(),
            label,
        });
    }
    if accept {
        for (k, v) in fields {
            let Some(id) = k.strip_prefix("predicted.") else {
                continue;
            };
            if typed.iter().any(|e| e.id == id) {
                continue;
            }
            let label = v
                .parse::<i64>()
                .map_err(|_| format!("The prediction sent for sample {id} is not a class index"))?;
            typed.push(LabelEntry {
                id: id.to_string(),
                label,
            });
        }
    }
    Ok(typed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_shapes_from_tensor_shapes() {
        let img = |w, h, channels, planar| {
            Some(ImageShape {
                width: w,
                height: h,
                channels,
                planar,
            })
        };
        let cases: &[(&[u64], Option<ImageShape>)] = &[
            (&[1, 784], img(28, 28, 1, true)),
            (&[784], img(28, 28, 1, true)),
            (&[1, 1, 28, 28], img(28, 28, 1, true)),
            (&[1, 3, 224, 224], img(224, 224, 3, true)),
            (&[32, 48], img(48, 32, 1, true)),
            (&[1, 32, 48, 3], img(48, 32, 3, false)),
            // Tabular rows: few values, or not a square.
            (&[1, 8], None),
            (&[1, 100], None),
            (&[1, 300], None),
            (&[4, 28, 28], None),
            (&[2, 2], None),
            (&[], None),
            (&[1, 1, 1], None),
            (&[1, 3, 4096, 4096], None),
        ];
        for (shape, want) in cases {
            assert_eq!(image_shape(shape), *want, "{shape:?}");
        }
    }

    #[test]
    fn pixels_stretch_to_the_values_range_in_row_order() {
        let grey = ImageShape {
            width: 2,
            height: 2,
            channels: 1,
            planar: true,
        };
        assert_eq!(pixels(grey, &[0.0, 0.5, 1.0, 0.25]), [0, 128, 255, 64]);
        assert_eq!(pixels(grey, &[3.0; 4]), [0; 4], "a flat image is black");
        assert_eq!(pixels(grey, &[f64::NAN, 0.0, 1.0, 1.0]), [0, 0, 255, 255]);
        // Planar RGB: all of R, then G, then B; the PNG wants RGB per pixel.
        let planar = ImageShape {
            width: 2,
            height: 1,
            channels: 3,
            planar: true,
        };
        assert_eq!(
            pixels(planar, &[0.0, 10.0, 0.0, 0.0, 0.0, 10.0]),
            [0, 0, 0, 255, 0, 255]
        );
        let interleaved = ImageShape {
            planar: false,
            ..planar
        };
        assert_eq!(
            pixels(interleaved, &[0.0, 10.0, 0.0, 0.0, 0.0, 10.0]),
            [0, 255, 0, 0, 0, 255]
        );
    }

    #[test]
    fn a_png_round_trips_through_a_decoder() {
        let shape = ImageShape {
            width: 28,
            height: 28,
            channels: 1,
            planar: true,
        };
        let values: Vec<f64> = (0..784).map(f64::from).collect();
        let uri = png_data_uri(shape, &values).unwrap();
        let b64 = uri.strip_prefix("data:image/png;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (28, 28));
        assert_eq!(&buf[..info.buffer_size()], &pixels(shape, &values)[..]);
    }

    #[test]
    fn a_form_gives_typed_labels_and_accepted_predictions() {
        let f = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let form = f(&[
            ("csrf", "x"),
            ("label.1.0.0:d:1:0", "7"),
            ("predicted.1.0.0:d:1:0", "3"),
            ("label.1.0.0:d:1:1", " "),
            ("predicted.1.0.0:d:1:1", "4"),
            ("label.1.0.0:d:2:0", ""),
        ]);
        let save = labels_of(&form, false).unwrap();
        assert_eq!(
            save,
            [LabelEntry {
                id: "1.0.0:d:1:0".into(),
                label: 7
            }]
        );
        let accept = labels_of(&form, true).unwrap();
        assert_eq!(
            accept,
            [
                LabelEntry {
                    id: "1.0.0:d:1:0".into(),
                    label: 7
                },
                LabelEntry {
                    id: "1.0.0:d:1:1".into(),
                    label: 4
                },
            ],
            "a typed class wins over the prediction; none without either"
        );
        for bad in ["-1", "x", "1.5", "1000001"] {
            let err = labels_of(&f(&[("label.v:d:1:0", bad)]), false).unwrap_err();
            assert!(err.contains("v:d:1:0"), "{err}");
        }
    }
}
