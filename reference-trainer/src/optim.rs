//! Adam (Kingma & Ba 2015) with its state in the open.
//!
//! Written here rather than taken from candle-nn: `candle_nn::AdamW` keeps
//! its moments private, so they could not be saved in a checkpoint, and a
//! run resumed with fresh moments would take different steps than one that
//! never stopped. Here `m`, `v` and the step count `t` are fields, saved to
//! `optimizer.safetensors` and loaded back bit for bit.
//!
//! One update of parameter `θ` with gradient `g` at learning rate `lr`:
//!
//! ```text
//! t ← t + 1
//! m ← β1·m + (1 − β1)·g
//! v ← β2·v + (1 − β2)·g²
//! θ ← θ − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + ε)
//! ```
//!
//! as tools/train_mnist.py's numpy Adam (no weight decay). The scalars are
//! computed in f64 and each enters the f32 tensor arithmetic once, through
//! candle's `affine` (which rounds its factors to f32).

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

pub const M_PREFIX: &str = "m.";
pub const V_PREFIX: &str = "v.";
/// The step count `t`, a one-element i64 tensor.
pub const STEP_KEY: &str = "adam.step";

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    #[error("optimizer: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("optimizer: no gradient for parameter {0:?}")]
    NoGradient(String),
    #[error("optimizer state: {0}")]
    State(String),
}

#[derive(Debug)]
pub struct Adam {
    pub config: AdamConfig,
    /// Updates taken so far.
    pub t: u64,
    /// First and second moments, one per parameter, in parameter order.
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl Adam {
    /// Zero moments shaped like `params`.
    pub fn new(config: AdamConfig, params: &[(&str, Var)]) -> Result<Adam, OptimError> {
        let zeros = |v: &Var| Tensor::zeros(v.shape(), DType::F32, &Device::Cpu);
        Ok(Adam {
            config,
            t: 0,
            m: params
                .iter()
                .map(|(_, v)| zeros(v))
                .collect::<Result<_, _>>()?,
            v: params
                .iter()
                .map(|(_, v)| zeros(v))
                .collect::<Result<_, _>>()?,
        })
    }

    /// One update of every parameter from `grads`.
    pub fn step(
        &mut self,
        params: &[(&str, Var)],
        grads: &GradStore,
        lr: f64,
    ) -> Result<(), OptimError> {
        self.t += 1;
        let AdamConfig { beta1, beta2, eps } = self.config;
        // f64 throughout: `t` may be large, and powf is exact enough that
        // the bias corrections are the same every time for the same t.
        let c1 = 1.0 - beta1.powf(self.t as f64);
        let c2 = 1.0 - beta2.powf(self.t as f64);
        for (i, (name, var)) in params.iter().enumerate() {
            let g = grads
                .get(var.as_tensor())
                .ok_or_else(|| OptimError::NoGradient(name.to_string()))?;
            let m = (self.m[i].affine(beta1, 0.0)? + g.affine(1.0 - beta1, 0.0)?)?;
            let v = (self.v[i].affine(beta2, 0.0)? + g.sqr()?.affine(1.0 - beta2, 0.0)?)?;
            let m_hat = m.affine(1.0 / c1, 0.0)?;
            let denom = v.affine(1.0 / c2, 0.0)?.sqrt()?.affine(1.0, eps)?;
            let update = (m_hat / denom)?.affine(lr, 0.0)?;
            var.set(&(var.as_tensor() - update)?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }

    /// `optimizer.safetensors`: `m.<param>`, `v.<param>` and `adam.step`.
    pub fn to_safetensors(
        &self,
        names: &[&str],
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
        let step = Tensor::from_vec(vec![i64::try_from(self.t)?], 1, &Device::Cpu)?;
        let mut named: Vec<(String, &Tensor)> = vec![(STEP_KEY.to_string(), &step)];
        for (i, name) in names.iter().enumerate() {
            named.push((format!("{M_PREFIX}{name}"), &self.m[i]));
            named.push((format!("{V_PREFIX}{name}"), &self.v[i]));
        }
        Ok(safetensors::serialize(named, None)?)
    }

    /// Loads what [`Adam::to_safetensors`] wrote for `params`; every moment
    /// must be there with its parameter's shape.
    pub fn from_safetensors(
        config: AdamConfig,
        params: &[(&str, Var)],
        bytes: &[u8],
    ) -> Result<Adam, OptimError> {
        let mut tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?;
        let step = tensors
            .remove(STEP_KEY)
            .ok_or_else(|| OptimError::State(format!("no {STEP_KEY}")))?;
        let t = match step.to_dtype(DType::I64)?.to_vec1::<i64>()?.as_slice() {
            [t] if *t >= 0 => *t as u64,
            other => return Err(OptimError::State(format!("{STEP_KEY} is {other:?}"))),
        };
        let mut take = |key: String, var: &Var| -> Result<Tensor, OptimError> {
            let t = tensors
                .remove(&key)
                .ok_or_else(|| OptimError::State(format!("no {key}")))?;
            if t.dims() != var.dims() || t.dtype() != DType::F32 {
                return Err(OptimError::State(format!(
                    "{key} is {:?} {:?}, expected {:?} f32",
                    t.dims(),
                    t.dtype(),
                    var.dims()
                )));
            }
            Ok(t)
        };
        let mut m = Vec::new();
        let mut v = Vec::new();
        for (name, var) in params {
            m.push(take(format!("{M_PREFIX}{name}"), var)?);
            v.push(take(format!("{V_PREFIX}{name}"), var)?);
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(OptimError::State(format!("unexpected tensor {extra:?}")));
        }
        Ok(Adam { config, t, m, v })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_vec1::<f32>().unwrap()
    }

    /// Two updates of θ = [1, −2] against the formulas worked by hand.
    #[test]
    fn matches_a_hand_computed_adam_update() {
        let dev = Device::Cpu;
        let theta = Var::from_tensor(&Tensor::new(&[1.0f32, -2.0], &dev).unwrap()).unwrap();
        let params = [("theta", theta.clone())];
        let mut adam = Adam::new(AdamConfig::default(), &params).unwrap();
        let lr = 0.1;
        // The gradient of Σ k·θ is k, so each step's gradient is chosen
        // through the loss.
        let step = |adam: &mut Adam, k: [f32; 2]| {
            let k = Tensor::new(&k, &dev).unwrap();
            let loss = (theta.as_tensor() * &k).unwrap().sum_all().unwrap();
            adam.step(&params, &loss.backward().unwrap(), lr).unwrap();
        };

        // Step 1, g = [0.5, −0.1]: m = 0.1·g, v = 0.001·g², and the bias
        // corrections (0.1, 0.001) give m̂ = g, v̂ = g², so each weight moves
        // by lr·g/(|g| + ε) = ±lr·|g|/(|g| + 1e-8).
        step(&mut adam, [0.5, -0.1]);
        assert_eq!(adam.t, 1);
        let want1 = [
            1.0 - 0.1 * 0.5 / (0.5 + 1e-8),
            -2.0 + 0.1 * 0.1 / (0.1 + 1e-8),
        ];
        let got = values(theta.as_tensor());
        for (g, w) in got.iter().zip(want1) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want1:?}");
        }
        let m = values(&adam.m[0]);
        let v = values(&adam.v[0]);
        assert!(
            (m[0] - 0.05).abs() < 1e-8 && (m[1] + 0.01).abs() < 1e-8,
            "{m:?}"
        );
        assert!(
            (v[0] - 0.00025).abs() < 1e-10 && (v[1] - 0.00001).abs() < 1e-11,
            "{v:?}"
        );

        // Step 2, g = [0.5, 0.3]:
        //   m = 0.9·[0.05, −0.01] + 0.1·[0.5, 0.3]        = [0.095, 0.021]
        //   v = 0.999·[0.00025, 0.00001] + 0.001·[0.25, 0.09]
        //                                                  = [0.00049975, 0.00009999]
        //   c1 = 1 − 0.9² = 0.19, c2 = 1 − 0.999² = 0.001999
        //   θ0: m̂ = 0.5,  v̂ = 0.25,           step = 0.1·0.5/0.5          = 0.1
        //   θ1: m̂ = 0.110526…, v̂ = 0.050020…, step = 0.1·0.110526/0.223652 = 0.0494189…
        step(&mut adam, [0.5, 0.3]);
        assert_eq!(adam.t, 2);
        let (m0, m1) = (0.095f64, 0.021f64);
        let (v0, v1) = (0.000_499_75f64, 0.000_099_99f64);
        let (c1, c2) = (0.19f64, 0.001_999f64);
        let want2 = [
            want1[0] - 0.1 * (m0 / c1) / ((v0 / c2).sqrt() + 1e-8),
            want1[1] - 0.1 * (m1 / c1) / ((v1 / c2).sqrt() + 1e-8),
        ];
        assert!((want2[0] - 0.8).abs() < 1e-6 && (want2[1] + 1.949_418_9).abs() < 1e-6);
        let got = values(theta.as_tensor());
        for (g, w) in got.iter().zip(want2) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want2:?}");
        }
    }

    #[test]
    fn state_round_trips_bit_for_bit_and_is_checked() {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[[0.25f32, -1.5], [3.0, 0.125]], &dev).unwrap())
            .unwrap();
        let params = [("w", w.clone())];
        let mut adam = Adam::new(AdamConfig::default(), &params).unwrap();
        for _ in 0..3 {
            let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
            adam.step(&params, &loss.backward().unwrap(), 0.01).unwrap();
        }
        let bytes = adam.to_safetensors(&["w"]).unwrap();
        let back = Adam::from_safetensors(AdamConfig::default(), &params, &bytes).unwrap();
        assert_eq!(back.t, 3);
        assert_eq!(back.to_safetensors(&["w"]).unwrap(), bytes);

        let other = [(
            "w",
            Var::from_tensor(&Tensor::zeros(3, DType::F32, &dev).unwrap()).unwrap(),
        )];
        let e = Adam::from_safetensors(AdamConfig::default(), &other, &bytes).unwrap_err();
        assert!(e.to_string().contains("m.w"), "{e}");
        let renamed = [("u", w)];
        let e = Adam::from_safetensors(AdamConfig::default(), &renamed, &bytes).unwrap_err();
        assert!(e.to_string().contains("no m.u"), "{e}");
    }
}
