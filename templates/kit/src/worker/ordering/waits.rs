//! The entry of an event that waits for the fan-out of an earlier event of
//! its key: written by the fan-out script (`super::scripts::FAN_OUT`) as
//! netstrings (`<length>:<bytes>`), the event's id and then three per run
//! (listener, task id, task message), and read back by the worker, which
//! fans it out with its runs' keys declared.

/// One run of a chain as the scripts take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunArgs {
    /// The chain's listener.
    pub listener: String,
    /// Its task id.
    pub task_id: String,
    /// Its task message, as the queue writes it.
    pub message: Vec<u8>,
}

/// A waiting event: its id and runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub event_id: String,
    pub runs: Vec<RunArgs>,
}

impl Waiting {
    /// Reads an entry; `None` if it is not one.
    pub(crate) fn decode(mut entry: &[u8]) -> Option<Self> {
        let mut next = || -> Option<Vec<u8>> {
            let colon = entry.iter().position(|&b| b == b':')?;
            let length: usize = std::str::from_utf8(&entry[..colon]).ok()?.parse().ok()?;
            let end = colon.checked_add(1)?.checked_add(length)?;
            let value = entry.get(colon + 1..end)?.to_vec();
            entry = &entry[end..];
            Some(value)
        };
        let event_id = String::from_utf8(next()?).ok()?;
        let mut runs = Vec::new();
        while let Some(listener) = next() {
            runs.push(RunArgs {
                listener: String::from_utf8(listener).ok()?,
                task_id: String::from_utf8(next()?).ok()?,
                message: next()?,
            });
        }
        Some(Self { event_id, runs })
    }

    /// The entry as the fan-out script writes it (the kit's tests).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut entry = Vec::new();
        let mut put = |value: &[u8]| {
            entry.extend_from_slice(value.len().to_string().as_bytes());
            entry.push(b':');
            entry.extend_from_slice(value);
        };
        put(self.event_id.as_bytes());
        for run in &self.runs {
            put(run.listener.as_bytes());
            put(run.task_id.as_bytes());
            put(&run.message);
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_as_written_whatever_bytes_its_messages_hold() {
        let waiting = Waiting {
            event_id: "e-1".into(),
            runs: vec![
                RunArgs {
                    listener: "a:b".into(),
                    task_id: "t1".into(),
                    message: vec![0, b':', 255, b'9'],
                },
                RunArgs {
                    listener: String::new(),
                    task_id: "t2".into(),
                    message: Vec::new(),
                },
            ],
        };
        assert_eq!(Waiting::decode(&waiting.encode()), Some(waiting));
        assert_eq!(
            Waiting::decode(b"3:e-1"),
            Some(Waiting {
                event_id: "e-1".into(),
                runs: vec![]
            })
        );
        assert_eq!(Waiting::decode(b"9:short"), None);
        assert_eq!(Waiting::decode(b"x"), None);
    }
}
