//! What `gpkit doctor` found: one finding per check, each with the fix for
//! a problem, printed as text or as JSON.

use serde::Serialize;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// All is well.
    Ok,
    /// Works, but something should be done (not a failure).
    Warn,
    /// Broken: the service would not work. `doctor` exits 1.
    Fail,
    /// Not checked, because an earlier check failed or does not apply.
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
            Self::Skip => "skip",
        }
    }
}

/// The result of one check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Finding {
    /// What was checked, such as `postgres`.
    pub(crate) check: &'static str,
    pub(crate) status: Status,
    /// What was found, in one line.
    pub(crate) detail: String,
    /// What to do about it; only for `warn` and `fail`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fix: Option<String>,
}

impl Finding {
    pub(crate) fn ok(check: &'static str, detail: impl Into<String>) -> Self {
        Self::new(check, Status::Ok, detail, None)
    }

    pub(crate) fn skip(check: &'static str, detail: impl Into<String>) -> Self {
        Self::new(check, Status::Skip, detail, None)
    }

    pub(crate) fn warn(
        check: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(check, Status::Warn, detail, Some(fix.into()))
    }

    pub(crate) fn fail(
        check: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(check, Status::Fail, detail, Some(fix.into()))
    }

    fn new(
        check: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Self {
            check,
            status,
            detail: detail.into(),
            fix,
        }
    }
}

/// Every finding of one `doctor` run, in the order the checks ran.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) project: String,
    pub(crate) findings: Vec<Finding>,
}

impl Report {
    /// Whether any check failed.
    pub(crate) fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Fail)
    }

    /// The report as aligned lines, each problem followed by its fix.
    pub(crate) fn to_text(&self) -> String {
        let width = self
            .findings
            .iter()
            .map(|f| f.check.len())
            .max()
            .unwrap_or(0);
        let mut out = format!("Checking `{}`:\n", self.project);
        for finding in &self.findings {
            out += &format!(
                "  {:<4}  {:<width$}  {}\n",
                finding.status.label(),
                finding.check,
                finding.detail
            );
            if let Some(fix) = &finding.fix {
                out += &format!("        {:<width$}  fix: {fix}\n", "");
            }
        }
        let count = |status| self.findings.iter().filter(|f| f.status == status).count();
        let plural = |n: usize, word: &str| match n {
            1 => format!("1 {word}"),
            n => format!("{n} {word}s"),
        };
        out += &match (count(Status::Fail), count(Status::Warn)) {
            (0, 0) => "All checks passed.\n".to_string(),
            (0, warnings) => format!("No check failed; {}.\n", plural(warnings, "warning")),
            (failed, warnings) => format!(
                "{} failed; {}.\n",
                plural(failed, "check"),
                plural(warnings, "warning")
            ),
        };
        out
    }

    /// The report as one JSON document:
    /// `{"project": .., "ok": bool, "findings": [{"check", "status", "detail", "fix"?}]}`.
    pub(crate) fn to_json(&self) -> String {
        let value = serde_json::json!({
            "project": self.project,
            "ok": !self.failed(),
            "findings": self.findings,
        });
        format!(
            "{}\n",
            serde_json::to_string_pretty(&value).expect("a report serialises")
        )
    }
}
