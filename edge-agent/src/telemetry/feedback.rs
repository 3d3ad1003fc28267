//! Matching labels to earlier predictions: a bounded map from
//! (model, request id) to what was predicted, evicted oldest-first, and a
//! rolling accuracy per model. In memory only: a label for a prediction made
//! before a restart, or evicted since, is reported back as unknown.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use edgeloop_proto::agent::v1 as pb;

use super::samples::inputs_bytes;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PredictionKey {
    pub model: String,
    pub id: String,
}

/// What was predicted for one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Predicted {
    pub version: String,
    pub class: Option<i64>,
    pub confidence: Option<f64>,
    pub observed_at: SystemTime,
    /// The row's inputs, while they fit the map's input budget.
    pub inputs: Option<Vec<pb::SampleTensor>>,
}

struct Entry {
    /// Insertion order, to tell a live entry from a stale queue slot.
    seq: u64,
    value: Predicted,
    labelled: bool,
    input_bytes: usize,
}

/// The outcome of one label.
#[derive(Debug, Clone, PartialEq)]
pub enum Labelled {
    /// No prediction with that id (never made, or evicted).
    Unknown,
    /// Labelled before: counted as matched, but not again in accuracy or uploads.
    Again,
    /// The first label: the prediction, with its inputs handed over.
    First(Predicted),
}

/// The bounded id → prediction map.
///
/// Entries are evicted in insertion order past `capacity`. Inputs are kept
/// for the newest entries only, within `input_budget` bytes: the oldest
/// entries lose theirs first, but keep their prediction for matching.
pub struct PredictionMap {
    capacity: usize,
    input_budget: usize,
    map: HashMap<Arc<PredictionKey>, Entry>,
    order: VecDeque<(u64, Arc<PredictionKey>)>,
    with_inputs: VecDeque<(u64, Arc<PredictionKey>)>,
    input_bytes: usize,
    next: u64,
    evicted: u64,
}

impl PredictionMap {
    pub fn new(capacity: usize, input_budget: usize) -> PredictionMap {
        PredictionMap {
            capacity,
            input_budget,
            map: HashMap::new(),
            order: VecDeque::new(),
            with_inputs: VecDeque::new(),
            input_bytes: 0,
            next: 0,
            evicted: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries evicted so far (capacity reached).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Bytes of inputs held.
    pub fn input_bytes(&self) -> usize {
        self.input_bytes
    }

    /// Whether inputs of `bytes` would be kept at all (so the caller can
    /// skip copying them).
    pub fn keeps_inputs(&self, bytes: usize) -> bool {
        self.capacity > 0 && bytes <= self.input_budget
    }

    pub fn insert(&mut self, key: PredictionKey, mut value: Predicted) {
        if self.capacity == 0 {
            return;
        }
        let key = Arc::new(key);
        let input_bytes = match &value.inputs {
            Some(inputs) if self.keeps_inputs(inputs_bytes(inputs)) => inputs_bytes(inputs),
            _ => {
                value.inputs = None;
                0
            }
        };
        let seq = self.next;
        self.next += 1;
        if let Some(old) = self.map.insert(
            key.clone(),
            Entry {
                seq,
                value,
                labelled: false,
                input_bytes,
            },
        ) {
            self.input_bytes -= old.input_bytes;
        }
        self.order.push_back((seq, key.clone()));
        if input_bytes > 0 {
            self.input_bytes += input_bytes;
            self.with_inputs.push_back((seq, key));
        }
        while self.map.len() > self.capacity {
            let Some((seq, key)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&key).is_some_and(|e| e.seq == seq) {
                if let Some(e) = self.map.remove(&key) {
                    self.input_bytes -= e.input_bytes;
                }
                self.evicted += 1;
            }
        }
        while self.input_bytes > self.input_budget {
            let Some((seq, key)) = self.with_inputs.pop_front() else {
                break;
            };
            if let Some(e) = self.map.get_mut(&key).filter(|e| e.seq == seq) {
                self.input_bytes -= e.input_bytes;
                e.input_bytes = 0;
                e.value.inputs = None;
            }
        }
        // Re-inserted ids leave stale slots behind; sweep them now and then
        // so the queues stay within a constant factor of the map.
        let bound = 2 * self.capacity + 16;
        if self.order.len() > bound {
            let map = &self.map;
            self.order
                .retain(|(seq, key)| map.get(key).is_some_and(|e| e.seq == *seq));
        }
        if self.with_inputs.len() > bound {
            let map = &self.map;
            self.with_inputs.retain(|(seq, key)| {
                map.get(key)
                    .is_some_and(|e| e.seq == *seq && e.input_bytes > 0)
            });
        }
    }

    /// Records a label for `model`'s prediction `id`.
    pub fn label(&mut self, model: &str, id: &str) -> Labelled {
        let key = PredictionKey {
            model: model.to_string(),
            id: id.to_string(),
        };
        let Some(entry) = self.map.get_mut(&key) else {
            return Labelled::Unknown;
        };
        if entry.labelled {
            return Labelled::Again;
        }
        entry.labelled = true;
        self.input_bytes -= entry.input_bytes;
        entry.input_bytes = 0;
        let inputs = entry.value.inputs.take();
        let mut value = entry.value.clone();
        value.inputs = inputs;
        Labelled::First(value)
    }
}

/// The share of correct predictions among the last `capacity` labelled ones.
#[derive(Debug, Clone)]
pub struct Accuracy {
    capacity: usize,
    recent: VecDeque<bool>,
    correct: usize,
}

impl Accuracy {
    pub fn new(capacity: usize) -> Accuracy {
        Accuracy {
            capacity: capacity.max(1),
            recent: VecDeque::new(),
            correct: 0,
        }
    }

    pub fn record(&mut self, correct: bool) {
        self.recent.push_back(correct);
        self.correct += usize::from(correct);
        if self.recent.len() > self.capacity {
            if let Some(old) = self.recent.pop_front() {
                self.correct -= usize::from(old);
            }
        }
    }

    /// How many labelled predictions the accuracy covers (at most the capacity).
    pub fn window(&self) -> usize {
        self.recent.len()
    }

    /// `None` before the first label.
    pub fn value(&self) -> Option<f64> {
        (!self.recent.is_empty()).then(|| self.correct as f64 / self.recent.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn predicted(class: i64, input_bytes: usize) -> Predicted {
        Predicted {
            version: "1".into(),
            class: Some(class),
            confidence: Some(0.9),
            observed_at: SystemTime::UNIX_EPOCH,
            inputs: (input_bytes > 0).then(|| {
                vec![pb::SampleTensor {
                    name: String::new(),
                    dtype: "uint8".into(),
                    shape: vec![1, input_bytes as u64],
                    data: vec![0; input_bytes.saturating_sub(16)],
                }]
            }),
        }
    }

    fn key(model: &str, id: &str) -> PredictionKey {
        PredictionKey {
            model: model.into(),
            id: id.into(),
        }
    }

    #[test]
    fn labels_match_by_model_and_id_once() {
        let mut m = PredictionMap::new(10, 1 << 20);
        m.insert(key("a", "r1"), predicted(3, 0));
        assert_eq!(m.label("b", "r1"), Labelled::Unknown, "other model");
        assert_eq!(m.label("a", "nope"), Labelled::Unknown);
        assert!(matches!(m.label("a", "r1"), Labelled::First(p) if p.class == Some(3)));
        assert_eq!(m.label("a", "r1"), Labelled::Again);
    }

    #[test]
    fn the_oldest_entries_are_evicted_past_capacity() {
        let mut m = PredictionMap::new(3, 1 << 20);
        for i in 0..5 {
            m.insert(key("a", &format!("r{i}")), predicted(i, 0));
        }
        assert_eq!((m.len(), m.evicted()), (3, 2));
        assert_eq!(m.label("a", "r1"), Labelled::Unknown);
        assert!(matches!(m.label("a", "r2"), Labelled::First(_)));
        // Re-inserting an id refreshes it instead of growing the map.
        for _ in 0..100 {
            m.insert(key("a", "r4"), predicted(0, 0));
        }
        assert_eq!(m.len(), 3);
        assert!(m.order.len() <= 2 * 3 + 16);
        assert!(matches!(m.label("a", "r3"), Labelled::First(_)));
        let mut off = PredictionMap::new(0, 1 << 20);
        off.insert(key("a", "r"), predicted(0, 0));
        assert!(off.is_empty());
    }

    #[test]
    fn inputs_are_kept_for_the_newest_within_the_budget() {
        let mut m = PredictionMap::new(100, 250);
        for i in 0..4 {
            m.insert(key("a", &format!("r{i}")), predicted(0, 100));
        }
        assert_eq!(m.input_bytes(), 200);
        let inputs = |l: Labelled| match l {
            Labelled::First(p) => p.inputs.is_some(),
            other => panic!("{other:?}"),
        };
        assert!(!inputs(m.label("a", "r1")), "oldest lost their inputs");
        assert!(inputs(m.label("a", "r3")));
        assert_eq!(
            m.input_bytes(),
            100,
            "a labelled entry hands its inputs over"
        );
        assert!(!m.keeps_inputs(251));
    }

    #[test]
    fn rolling_accuracy_covers_the_last_k() {
        let mut a = Accuracy::new(4);
        assert_eq!((a.value(), a.window()), (None, 0));
        for correct in [false, false, true, true, true, true] {
            a.record(correct);
        }
        assert_eq!((a.value(), a.window()), (Some(1.0), 4));
        a.record(false);
        assert_eq!(a.value(), Some(0.75));
    }
}
