//! `.npz` data sets: one array per model input, keyed by the input name.
