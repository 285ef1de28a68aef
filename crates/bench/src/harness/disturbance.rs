//! Measurements others disturbed: a run measures again while processes
//! outside the bench take more than this share of the machine.

/// Share of the machine taken by others above which a repeat is flagged.
pub const DISTURBED: f64 = 0.10;

/// The note for a measurement `what` that is taken again (try `tries` of
/// `max`) because others took `share` of the machine meanwhile.
pub fn retry_note(what: &str, share: f64, tries: usize, max: usize) -> String {
    format!(
        "{what}: {:.0} % of the CPUs went to processes outside the bench: \
         measured again ({tries} of {max})",
        share * 100.0
    )
}

/// The note for a measurement `what` kept although others took `share` of
/// the machine meanwhile.
pub fn disturbed_note(what: &str, share: f64) -> String {
    format!(
        "{what}: {:.0} % of the CPUs went to processes outside the bench \
         (other jobs on this machine, or steal): this repeat is disturbed",
        share * 100.0
    )
}

/// What to do with a try that others took a share of the machine during.
#[derive(Debug, PartialEq)]
pub enum Judgement {
    /// Keep it: undisturbed.
    Keep,
    /// Measure again; the note says so.
    Again(String),
    /// Keep it although disturbed (no tries left); the note says so.
    Disturbed(String),
}

/// The rule every scenario measures by: a try during which others took
/// more than [`DISTURBED`] of the machine is taken again, up to `retries`
/// times (`--retry-disturbed`), and the last one kept is named.
pub struct Retries {
    tag: String,
    tries: usize,
    retries: usize,
}

impl Retries {
    /// The tries of measurement `tag`, with `retries` retries at most.
    pub fn new(tag: &str, retries: usize) -> Retries {
        Retries {
            tag: tag.to_string(),
            tries: 0,
            retries,
        }
    }

    /// Judges the try just made, during which others took `foreign` of the
    /// machine.
    pub fn judge(&mut self, foreign: f64) -> Judgement {
        if foreign <= DISTURBED {
            Judgement::Keep
        } else if self.tries < self.retries {
            self.tries += 1;
            Judgement::Again(retry_note(&self.tag, foreign, self.tries, self.retries))
        } else {
            Judgement::Disturbed(disturbed_note(&self.tag, foreign))
        }
    }

    /// How many tries were taken again so far.
    pub fn retried(&self) -> usize {
        self.tries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disturbed_try_is_taken_again_until_the_retries_run_out() {
        let mut r = Retries::new("rep1-idle", 2);
        assert_eq!(r.judge(0.05), Judgement::Keep);
        assert!(matches!(r.judge(0.3), Judgement::Again(n) if n.contains("(1 of 2)")));
        assert!(matches!(r.judge(0.3), Judgement::Again(n) if n.contains("(2 of 2)")));
        assert!(
            matches!(r.judge(0.3), Judgement::Disturbed(n) if n.starts_with("rep1-idle: 30 %"))
        );
        assert_eq!(r.retried(), 2);
    }
}
