//! Where each value of a YAML document is: a map from a value's path
//! (`agents[0].model_id`) to its line and column, for errors found after
//! deserialization (an unknown id) to point at the value.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Line and column (1-based) of every value, by path.
#[derive(Debug, Default)]
pub(crate) struct Positions {
    at: HashMap<String, (usize, usize)>,
}

impl Positions {
    /// Indexes `text`; a document that does not parse has no positions
    /// (its parse error is reported by serde_yaml, with its own position).
    pub(crate) fn of(text: &str) -> Self {
        let mut index = Indexer::default();
        if Parser::new_from_str(text).load(&mut index, false).is_err() {
            return Self::default();
        }
        Self { at: index.at }
    }

    /// The position of the value at `path`, e.g. `models.small.provider`
    /// or `agents[1].tools[0]`.
    pub(crate) fn get(&self, path: &str) -> Option<(usize, usize)> {
        self.at.get(path).copied()
    }
}

enum Frame {
    /// A mapping: its path, and the key whose value comes next (`None`
    /// while a key is expected).
    Mapping { path: String, key: Option<String> },
    /// A sequence: its path and the next item's index.
    Sequence { path: String, next: usize },
}

#[derive(Default)]
struct Indexer {
    stack: Vec<Frame>,
    at: HashMap<String, (usize, usize)>,
}

impl Indexer {
    /// The path of the value that starts now, or `None` if a mapping key
    /// comes now (and is taken as the key).
    fn value_path(&mut self, key_scalar: Option<&str>) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Mapping { path, key }) => match key.take() {
                Some(k) => Some(join(path, &k)),
                None => {
                    *key = Some(key_scalar.unwrap_or_default().to_owned());
                    None
                }
            },
            Some(Frame::Sequence { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                Some(p)
            }
        }
    }

    fn record(&mut self, path: &str, mark: Marker) {
        self.at
            .entry(path.to_owned())
            .or_insert((mark.line(), mark.col() + 1));
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

impl MarkedEventReceiver for Indexer {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(value, ..) => {
                if let Some(path) = self.value_path(Some(&value)) {
                    self.record(&path, mark);
                }
            }
            Event::Alias(_) => {
                if let Some(path) = self.value_path(None) {
                    self.record(&path, mark);
                }
            }
            Event::MappingStart(..) => {
                let path = self.value_path(None).unwrap_or_default();
                self.record(&path, mark);
                self.stack.push(Frame::Mapping { path, key: None });
            }
            Event::SequenceStart(..) => {
                let path = self.value_path(None).unwrap_or_default();
                self.record(&path, mark);
                self.stack.push(Frame::Sequence { path, next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_and_flow_values_are_found_by_path() {
        let text = "models:\n  small: { provider: local, model: m }\nagents:\n  - id: a\n    tools: [x, y]\n";
        let p = Positions::of(text);
        assert_eq!(p.get("models.small.provider"), Some((2, 22)));
        assert_eq!(p.get("agents[0].id"), Some((4, 9)));
        assert_eq!(p.get("agents[0].tools[1]"), Some((5, 16)));
        // A block mapping starts at its first key.
        assert_eq!(p.get("agents[0]"), Some((4, 5 + 2)));
        assert_eq!(p.get("nothing"), None);
    }
}
