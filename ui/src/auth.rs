//! Who may look: whoever holds the page's token. `zflow ui` prints its address with the token
//! (`http://127.0.0.1:8265/?token=...`), as Jupyter does; opening that address sets a cookie
//! (for this port only, HttpOnly, SameSite=Strict) so the page's own requests carry it.
//!
//! The token is required on loopback too: on a cluster's login node every user can reach
//! 127.0.0.1, and a page that shows a recipe's logs and configs is not for all of them.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The token and the cookie that carries it.
#[derive(Clone)]
pub struct Access {
    token: String,
    cookie: String,
}

impl Access {
    /// Access by `token`, or by a fresh random one (128 bits, hex) when `None`, for the
    /// server on `port` (each port has its own cookie).
    pub fn new(token: Option<String>, port: u16) -> anyhow::Result<Access> {
        let token = match token {
            Some(t) if !(16..=256).contains(&t.len()) => {
                anyhow::bail!(
                    "the ui token must be 16 to 256 characters (it is {})",
                    t.len()
                )
            }
            Some(t) if !t.bytes().all(url_safe) => {
                anyhow::bail!(
                    "the ui token may hold only letters, digits and `-._~` (characters a URL carries as they are), so that the printed address works as printed"
                )
            }
            Some(t) => t,
            None => {
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes)
                    .map_err(|e| anyhow::anyhow!("no random bytes for the ui token: {e}"))?;
                bytes.iter().map(|b| format!("{b:02x}")).collect()
            }
        };
        Ok(Access {
            token,
            cookie: format!("zflow-ui-{port}"),
        })
    }

    /// The token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `request` carries the token (in its query or its cookie), and in which.
    fn check(&self, query: Option<&str>, headers: &HeaderMap) -> Option<Carried> {
        let from_query = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter_map(|kv| kv.strip_prefix("token="))
            .any(|t| same(t, &self.token));
        if from_query {
            return Some(Carried::Query);
        }
        let from_cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().strip_prefix(&self.cookie)?.strip_prefix('='))
            .any(|t| same(t, &self.token));
        from_cookie.then_some(Carried::Cookie)
    }
}

enum Carried {
    Query,
    Cookie,
}

/// A byte a URL's query carries unencoded (RFC 3986's unreserved characters).
fn url_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Compares in time independent of where the strings differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The middleware: 401 without the token; with it in the query, the cookie is set.
pub async fn require_token(State(access): State<Access>, request: Request, next: Next) -> Response {
    let carried = access.check(request.uri().query(), request.headers());
    match carried {
        None => (
            StatusCode::UNAUTHORIZED,
            "zflow ui: open the address `zflow ui` printed; it carries the page's token (?token=...)\n",
        )
            .into_response(),
        Some(Carried::Cookie) => next.run(request).await,
        Some(Carried::Query) => {
            let mut response = next.run(request).await;
            let cookie = format!(
                "{}={}; Path=/; HttpOnly; SameSite=Strict",
                access.cookie, access.token
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                response.headers_mut().append(header::SET_COOKIE, v);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_in_the_query_or_the_cookie() {
        let a = Access::new(Some("0123456789abcdef".into()), 8265).unwrap();
        let none = HeaderMap::new();
        assert!(matches!(
            a.check(Some("x=1&token=0123456789abcdef"), &none),
            Some(Carried::Query)
        ));
        assert!(a.check(Some("token=0123456789abcdeX"), &none).is_none());
        assert!(a.check(None, &none).is_none());
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "other=1; zflow-ui-8265=0123456789abcdef".parse().unwrap(),
        );
        assert!(matches!(a.check(None, &h), Some(Carried::Cookie)));
        // Another port's cookie is not this server's.
        let b = Access::new(Some("0123456789abcdef".into()), 9000).unwrap();
        assert!(b.check(None, &h).is_none());
    }

    #[test]
    fn fresh_tokens_differ_and_short_ones_are_refused() {
        let a = Access::new(None, 1).unwrap();
        let b = Access::new(None, 1).unwrap();
        assert_eq!(a.token().len(), 32);
        assert_ne!(a.token(), b.token());
        assert!(Access::new(Some("short".into()), 1).is_err());
        for bad in [
            "0123456789 abcdef",
            "0123456789&abcdef",
            "0123456789%20bcdef",
        ] {
            assert!(Access::new(Some(bad.into()), 1).is_err(), "{bad}");
        }
        assert!(Access::new(Some("0123456789-._~abcDEF".into()), 1).is_ok());
    }
}
