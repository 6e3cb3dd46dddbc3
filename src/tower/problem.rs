//! Refusals as RFC 9457 problem details: [`ProblemJson`], with its `type` URI and extension
//! members set by the gateway.

use http::header::{HeaderValue, CONTENT_TYPE};
use http::Response;

use super::fields::whole_seconds;
use super::refusal::{Refusal, Refuse};
use super::LayerError;

/// The members every problem object carries (or may), which an extension cannot redefine.
const STANDARD: [&str; 6] = ["type", "title", "status", "detail", "instance", "retry_after"];

/// Refusals with an `application/problem+json` body (RFC 9457) beside the default status
/// and headers: `type` (`about:blank` unless [`type_uri`](Self::type_uri) says otherwise),
/// `title` (the status's reason), `status`, `detail` (what happened), `retry_after` (whole
/// seconds, when waiting helps), then the extension members given with
/// [`member`](Self::member). Used through
/// [`RateLimitLayer::problem_json_with`](super::RateLimitLayer::problem_json_with).
///
/// ```
/// use slidegate::tower::ProblemJson;
/// let problem = ProblemJson::new()
///     .type_uri("https://api.example.com/problems/rate-limited")
///     .member("support", "https://api.example.com/limits")?;
/// # let _ = problem;
/// # Ok::<(), slidegate::tower::LayerError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ProblemJson {
    type_uri: Option<String>,
    members: Vec<(String, String)>,
}

impl ProblemJson {
    /// `type: about:blank`, no extension members: what [`Refusal::problem_details`] writes.
    ///
    /// ```
    /// let problem = slidegate::tower::ProblemJson::new();
    /// # let _ = problem;
    /// ```
    pub fn new() -> ProblemJson {
        ProblemJson::default()
    }

    /// The problem type's URI (RFC 9457 §3.1.1: a URI reference that documents the
    /// problem, such as a page of your API's documentation about its limits).
    ///
    /// ```
    /// let problem = slidegate::tower::ProblemJson::new().type_uri("https://api.example.com/problems/rate-limited");
    /// # let _ = problem;
    /// ```
    pub fn type_uri(mut self, uri: impl Into<String>) -> ProblemJson {
        self.type_uri = Some(uri.into());
        self
    }

    /// An extension member with a string value (RFC 9457 §3.2), added to every problem
    /// object in the order given. [`LayerError::ReservedProblemMember`] for a name the
    /// problem object defines itself (`type`, `title`, `status`, `detail`, `instance`,
    /// `retry_after`) or a name given twice.
    ///
    /// ```
    /// use slidegate::tower::{LayerError, ProblemJson};
    /// let problem = ProblemJson::new().member("support", "https://api.example.com/limits")?;
    /// assert!(matches!(ProblemJson::new().member("status", "ok"), Err(LayerError::ReservedProblemMember { .. })));
    /// # let _ = problem;
    /// # Ok::<(), LayerError>(())
    /// ```
    pub fn member(mut self, name: &str, value: &str) -> Result<ProblemJson, LayerError> {
        if STANDARD.contains(&name) || self.members.iter().any(|(taken, _)| taken == name) {
            return Err(LayerError::ReservedProblemMember { name: name.to_owned() });
        }
        self.members.push((name.to_owned(), value.to_owned()));
        Ok(self)
    }

    /// The problem object for `refusal`, as JSON text.
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// let problem = slidegate::tower::ProblemJson::new().type_uri("https://example.com/p");
    /// assert!(problem.details(refusal).starts_with("{\"type\":\"https://example.com/p\""));
    /// # }
    /// ```
    pub fn details(&self, refusal: &Refusal) -> String {
        let status = refusal.status();
        let mut json = String::with_capacity(160);
        json.push_str("{\"type\":");
        push_string(&mut json, self.type_uri.as_deref().unwrap_or("about:blank"));
        json.push_str(",\"title\":");
        push_string(&mut json, status.canonical_reason().unwrap_or_default());
        json.push_str(&format!(",\"status\":{},\"detail\":", status.as_u16()));
        push_string(&mut json, refusal.detail());
        if let Some(wait) = refusal.decision().and_then(|d| d.retry_after()) {
            json.push_str(&format!(",\"retry_after\":{}", whole_seconds(wait)));
        }
        for (name, value) in &self.members {
            json.push(',');
            push_string(&mut json, name);
            json.push(':');
            push_string(&mut json, value);
        }
        json.push('}');
        json
    }
}

impl<B: From<String>> Refuse<B> for ProblemJson {
    fn respond(&self, refusal: &Refusal) -> Response<B> {
        let mut response = refusal.response(B::from(self.details(refusal)));
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        response
    }
}

/// `text` as a JSON string (RFC 8259 §7): quotes, backslashes and control characters
/// escaped.
fn push_string(json: &mut String, text: &str) {
    json.push('"');
    for c in text.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            c if u32::from(c) < 0x20 => json.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => json.push(c),
        }
    }
    json.push('"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::push_string;

    #[test]
    fn strings_are_escaped_as_json_requires() {
        let mut json = String::new();
        push_string(&mut json, "a\"b\\c\nd\u{1}é");
        assert_eq!(json, "\"a\\\"b\\\\c\\u000ad\\u0001é\"");
    }
}
