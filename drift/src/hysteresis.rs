//! Drift state with hysteresis: a model is declared drifting only after
//! `set_after` consecutive windows over the threshold, and cleared only
//! after `clear_after` consecutive windows under it, so one noisy window
//! never flips it. A pure function of `(state, window verdict)`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hysteresis {
    /// Consecutive drifting windows needed to set the state.
    pub set_after: u32,
    /// Consecutive clean windows needed to clear it.
    pub clear_after: u32,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Hysteresis {
            set_after: 3,
            clear_after: 3,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriftState {
    pub drifting: bool,
    /// Consecutive windows that disagree with `drifting` so far.
    pub streak: u32,
}

/// The state after one more window; `over` says whether the window's
/// statistic was over the threshold. A window with no data (`None`)
/// changes nothing: silence is not evidence either way.
pub fn next(h: Hysteresis, state: DriftState, over: Option<bool>) -> DriftState {
    let Some(over) = over else { return state };
    if over == state.drifting {
        return DriftState {
            drifting: state.drifting,
            streak: 0,
        };
    }
    let streak = state.streak + 1;
    let needed = if state.drifting {
        h.clear_after
    } else {
        h.set_after
    };
    if streak >= needed.max(1) {
        DriftState {
            drifting: over,
            streak: 0,
        }
    } else {
        DriftState {
            drifting: state.drifting,
            streak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a sequence of windows ('D' over, '.' under, '_' no data) and
    /// returns the drifting flag after each.
    fn run(h: Hysteresis, windows: &str) -> String {
        let mut s = DriftState::default();
        windows
            .chars()
            .map(|c| {
                let over = match c {
                    'D' => Some(true),
                    '.' => Some(false),
                    _ => None,
                };
                s = next(h, s, over);
                if s.drifting {
                    'D'
                } else {
                    '.'
                }
            })
            .collect()
    }

    #[test]
    fn table() {
        let h = Hysteresis {
            set_after: 3,
            clear_after: 2,
        };
        let cases = [
            ("...", "..."),
            // Three in a row set it.
            ("DDD", "..D"),
            // A clean window in between restarts the count: no flapping.
            ("DD.DD.DD", "........"),
            // Silence neither sets nor clears.
            ("DD_D", "...D"),
            // Two clean windows clear it; one does not.
            ("DDD.D..", "..DDDD."),
            ("DDD._.", "..DDD."),
        ];
        for (windows, want) in cases {
            assert_eq!(run(h, windows), want, "{windows}");
        }
    }

    #[test]
    fn one_window_settings_follow_the_data() {
        let h = Hysteresis {
            set_after: 1,
            clear_after: 1,
        };
        assert_eq!(run(h, "D.D"), "D.D");
        // Zero is treated as one: a state needs at least one window.
        let h = Hysteresis {
            set_after: 0,
            clear_after: 0,
        };
        assert_eq!(run(h, "D."), "D.");
    }
}
