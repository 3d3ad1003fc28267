//! Quantization parameters: pure arithmetic, tested with tables.

/// uint8 asymmetric parameters for an activation range, as ONNX's
/// QuantizeLinear uses them: `q = clamp(round(x / scale) + zp, 0, 255)`.
/// The range is widened to include 0 so that zero is exact (padding, Relu).
pub fn activation_params(min: f32, max: f32) -> (f32, u8) {
    let lo = min.min(0.0);
    let hi = max.max(0.0);
    let span = hi - lo;
    if !span.is_finite() || span <= f32::EPSILON {
        return (1.0, 0);
    }
    let scale = span / 255.0;
    let zp = (-lo / scale).round().clamp(0.0, 255.0) as u8;
    (scale, zp)
}

/// Symmetric int8 scale for values with largest magnitude `amax`: the
/// zero point is 0 and the range is [-127, 127] (not -128, so that
/// negation is exact and the int8 x int8 products cannot overflow in pairs).
pub fn symmetric_scale(amax: f32) -> f32 {
    if !amax.is_finite() || amax <= f32::EPSILON {
        1.0
    } else {
        amax / 127.0
    }
}

pub fn quantize_i8(x: f32, scale: f32) -> i8 {
    (x / scale).round().clamp(-127.0, 127.0) as i8
}

/// Per-channel symmetric int8 weights along `axis`. Returns the quantized
/// values (same layout) and one scale per channel.
pub fn quantize_per_channel(
    values: &ndarray::ArrayD<f32>,
    axis: usize,
) -> (ndarray::ArrayD<i8>, Vec<f32>) {
    let channels = values.shape()[axis];
    let scales: Vec<f32> = (0..channels)
        .map(|c| {
            let lane = values.index_axis(ndarray::Axis(axis), c);
            symmetric_scale(lane.iter().fold(0.0f32, |m, v| m.max(v.abs())))
        })
        .collect();
    let mut q = ndarray::ArrayD::<i8>::zeros(values.raw_dim());
    for (c, &scale) in scales.iter().enumerate() {
        let src = values.index_axis(ndarray::Axis(axis), c);
        let mut dst = q.index_axis_mut(ndarray::Axis(axis), c);
        ndarray::Zip::from(&mut dst)
            .and(&src)
            .for_each(|d, &s| *d = quantize_i8(s, scale));
    }
    (q, scales)
}

/// Per-tensor symmetric int8.
pub fn quantize_per_tensor(values: &ndarray::ArrayD<f32>) -> (ndarray::ArrayD<i8>, f32) {
    let scale = symmetric_scale(values.iter().fold(0.0f32, |m, v| m.max(v.abs())));
    (values.mapv(|v| quantize_i8(v, scale)), scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_table() {
        let cases = [
            // (min, max) -> (scale, zp)
            ((0.0, 2.55), (0.01, 0)),
            ((-1.0, 1.0), (2.0 / 255.0, 127)), // 127.5 in f32 rounds down
            ((-2.55, 0.0), (0.01, 255)),
            ((1.0, 2.0), (2.0 / 255.0, 0)), // widened to include 0
            ((0.0, 0.0), (1.0, 0)),         // degenerate
            ((f32::NAN, 1.0), (1.0 / 255.0, 0)),
        ];
        for ((lo, hi), (scale, zp)) in cases {
            let (s, z) = activation_params(lo, hi);
            assert!((s - scale).abs() < 1e-6, "({lo},{hi}) scale {s} != {scale}");
            assert_eq!(z, zp, "({lo},{hi})");
        }
        // Zero is exactly representable.
        let (s, z) = activation_params(-0.3, 5.7);
        assert_eq!(((0.0f32 / s).round() + z as f32) as u8, z);
    }

    #[test]
    fn per_channel_scales_follow_each_channel() {
        let w =
            ndarray::ArrayD::from_shape_vec(vec![2, 3], vec![1.0, -2.0, 0.5, 0.01, 0.02, -0.04])
                .unwrap();
        let (q, scales) = quantize_per_channel(&w, 0);
        assert!((scales[0] - 2.0 / 127.0).abs() < 1e-7);
        assert!((scales[1] - 0.04 / 127.0).abs() < 1e-9);
        assert_eq!(
            q.iter().copied().collect::<Vec<i8>>(),
            vec![64, -127, 32, 32, 63, -127]
        ); // 63.5 in f32 rounds down
        let (q, scales) = quantize_per_channel(&w, 1);
        assert_eq!(scales.len(), 3);
        assert_eq!(q[[0, 1]], -127);
    }
}
