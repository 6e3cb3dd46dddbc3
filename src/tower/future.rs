//! The future a [`RateLimit`](super::RateLimit) service returns: the inner service's
//! response with the rate-limit fields appended, or the layer's own answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Response, StatusCode};

use super::route::Fields;

fn status<ResBody: Default>(code: StatusCode) -> Response<ResBody> {
    let mut response = Response::new(ResBody::default());
    *response.status_mut() = code;
    response
}

pin_project_lite::pin_project! {
    /// The future of [`RateLimit`](super::RateLimit): the inner service's response with the
    /// `RateLimit` headers added, or the refusal.
    pub struct ResponseFuture<F, ResBody> {
        #[pin]
        inner: Option<F>,
        headers: Option<Fields>,
        answer: Option<Response<ResBody>>,
    }
}

impl<F, ResBody> ResponseFuture<F, ResBody> {
    pub(super) fn forward(inner: F, headers: Option<Fields>) -> Self {
        ResponseFuture { inner: Some(inner), headers, answer: None }
    }

    pub(super) fn answer(response: Response<ResBody>) -> Self {
        ResponseFuture { inner: None, headers: None, answer: Some(response) }
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F, ResBody>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(inner) => {
                let mut response = match inner.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    other => return other,
                };
                if let Some(fields) = this.headers.take() {
                    // Appended: an inner layer's (or the service's own) policies stay, and the
                    // field lines together form one list, as the draft allows.
                    fields.append_to(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            // Polled again after completion: an empty 500 rather than a panic.
            None => Poll::Ready(Ok(this
                .answer
                .take()
                .unwrap_or_else(|| status(StatusCode::INTERNAL_SERVER_ERROR)))),
        }
    }
}
