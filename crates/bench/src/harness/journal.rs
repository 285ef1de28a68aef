//! A run's notes and errors: printed as they happen, kept for the
//! report's Notes; any error makes the run exit 1.

/// The notes of a run so far and how many of them are errors.
#[derive(Debug, Default)]
pub struct Journal {
    pub notes: Vec<String>,
    pub errors: usize,
}

impl Journal {
    /// A journal that starts with `notes` (said before the run began).
    pub fn with_notes(notes: Vec<String>) -> Journal {
        Journal { notes, errors: 0 }
    }

    /// Prints `msg` and keeps it for the report.
    pub fn note(&mut self, msg: String) {
        eprintln!("pvsched-bench: {msg}");
        self.notes.push(msg);
    }

    /// A note that makes the run fail.
    pub fn error(&mut self, msg: String) {
        self.errors += 1;
        self.note(format!("ERROR: {msg}"));
    }

    /// A guest died during session `tag`: the notes from index `from` on,
    /// which say how, are folded into one note (first lines), saying that
    /// the session's measurements were dropped and taken again on `again`.
    pub fn guest_lost(&mut self, from: usize, tag: &str, again: &str) {
        let what: Vec<String> = self
            .notes
            .drain(from.min(self.notes.len())..)
            .map(|n| first_line(&n).to_string())
            .collect();
        self.note(format!(
            "guest lost during {tag} (its measurements dropped; measured again on {again}): {}",
            what.join(" / ")
        ));
    }

    /// Whether no error was noted.
    pub fn ok(&self) -> bool {
        self.errors == 0
    }
}

/// The first line of a message (a tool's error can run to pages).
pub(crate) fn first_line(e: &str) -> &str {
    e.lines().next().unwrap_or(e)
}

/// A run that keeps a [`Journal`]: notes and errors said on the run itself.
pub trait Journaled {
    fn journal(&mut self) -> &mut Journal;

    /// Prints `msg` and keeps it for the report.
    fn note(&mut self, msg: String) {
        self.journal().note(msg);
    }

    /// A note that makes the run fail.
    fn error(&mut self, msg: String) {
        self.journal().error(msg);
    }
}
