//! Which queues a consumer serves and how often: `WORKER_QUEUES` such as
//! `default=1,critical=6`, and the weighted order in which each dequeue
//! tries them.
//!
//! Like Go asynq's default (non-strict) priority: before each dequeue the
//! queue names are shuffled with each name repeated `weight` times, then
//! deduplicated. With `default=1,critical=6`, `critical` is tried first
//! about 6 times in 7, yet `default` is never starved.

use std::fmt;
use std::str::FromStr;

/// Queue names with their weights (each at least 1), in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueWeights(Vec<(String, u32)>);

impl QueueWeights {
    /// The queues and weights, as parsed.
    pub fn new(weights: Vec<(String, u32)>) -> Result<Self, String> {
        if weights.is_empty() {
            return Err("no queue given; expected name=weight pairs such as default=1".into());
        }
        for (index, (name, weight)) in weights.iter().enumerate() {
            super::queue_names::check_queue_name(name)?;
            if *weight == 0 {
                return Err(format!("queue `{name}` has weight 0; weights start at 1"));
            }
            if weights[..index].iter().any(|(other, _)| other == name) {
                return Err(format!("queue `{name}` is listed twice"));
            }
        }
        Ok(Self(weights))
    }

    /// The queue names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(name, _)| name.as_str())
    }

    /// Each queue with its weight (Go asynq's "priority"), in the order given.
    pub fn weights(&self) -> impl Iterator<Item = (&str, u32)> {
        self.0.iter().map(|(name, weight)| (name.as_str(), *weight))
    }

    /// Every queue, in a weighted random order for one dequeue.
    pub(crate) fn dequeue_order(&self) -> Vec<String> {
        if let [(only, _)] = self.0.as_slice() {
            return vec![only.clone()];
        }
        let mut tickets: Vec<&str> = self
            .0
            .iter()
            .flat_map(|(name, weight)| std::iter::repeat_n(name.as_str(), *weight as usize))
            .collect();
        fastrand::shuffle(&mut tickets);
        let mut order: Vec<String> = Vec::with_capacity(self.0.len());
        for name in tickets {
            if !order.iter().any(|seen| seen == name) {
                order.push(name.to_string());
            }
        }
        order
    }
}

impl Default for QueueWeights {
    /// `default=1`: Go asynq's default queue alone.
    fn default() -> Self {
        Self(vec![(super::queue_names::DEFAULT_QUEUE.to_string(), 1)])
    }
}

impl FromStr for QueueWeights {
    type Err = String;

    /// `default=1,critical=6`; a name without `=weight` has weight 1.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let weights = spec
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(|part| match part.split_once('=') {
                None => Ok((part.to_string(), 1)),
                Some((name, weight)) => {
                    let weight = weight.trim().parse().map_err(|_| {
                        format!(
                            "`{part}` has no valid weight; expected name=weight such as critical=6"
                        )
                    })?;
                    Ok((name.trim().to_string(), weight))
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        Self::new(weights)
    }
}

impl fmt::Display for QueueWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(n, w)| format!("{n}={w}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_weight_pairs() {
        let weights: QueueWeights = " default=1, critical = 6 ,low".parse().unwrap();
        assert_eq!(weights.to_string(), "default=1,critical=6,low=1");
    }

    #[test]
    fn refuses_what_it_cannot_serve() {
        for bad in ["", "default=0", "default=x", "a=1,a=2", "{a}=1"] {
            assert!(bad.parse::<QueueWeights>().is_err(), "{bad}");
        }
    }

    #[test]
    fn heavier_queues_come_first_more_often() {
        let weights: QueueWeights = "default=1,critical=6".parse().unwrap();
        let firsts = (0..7_000)
            .filter(|_| weights.dequeue_order()[0] == "critical")
            .count();
        // Expected 6,000 of 7,000; the bounds leave room for randomness.
        assert!((5_700..6_300).contains(&firsts), "{firsts}");
        assert_eq!(weights.dequeue_order().len(), 2);
    }
}
