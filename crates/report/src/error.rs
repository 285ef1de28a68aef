//! The errors of drawing a report: each says which file or font it was
//! about, so that one line is enough to act on.

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A font file was found but plotters cannot use it.
    #[error("{path}: not a usable font for the plots")]
    FontUnusable { path: String },

    /// None of the font files the plots try is there.
    #[error("a font for the plots ({path}) not found: install fonts-dejavu-core")]
    NoFont { path: String },

    /// A plot could not be drawn or written.
    #[error("{what}: {msg}")]
    Plot { what: String, msg: String },
}

pub type Result<T> = std::result::Result<T, ReportError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_can_travel_between_threads() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<ReportError>();

        let e = ReportError::Plot {
            what: "/out/idle-1000us.png (guest cyclictest)".into(),
            msg: "disk full".into(),
        };
        assert_eq!(
            e.to_string(),
            "/out/idle-1000us.png (guest cyclictest): disk full"
        );
        let e = ReportError::NoFont {
            path: "/usr/share/fonts/x.ttf".into(),
        };
        assert!(e.to_string().contains("fonts-dejavu-core"), "{e}");
    }
}
